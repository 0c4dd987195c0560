"""Bearer-token authentication of the control plane's mutating calls, as a `grpc.aio` server interceptor.

Read-only calls (telemetry, GetConfig, health, reflection) stay open. A mutating call needs
`authorization: Bearer <token>` metadata: none (or a malformed value) is UNAUTHENTICATED, a wrong token
PERMISSION_DENIED. Tokens are compared in constant time so that a client cannot learn a prefix of the
token from response times.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import grpc

MUTATING_METHODS = frozenset(
    {
        "/prefill_gate.v1.GateAdmin/UpdateIntervals",
        "/prefill_gate.v1.GateRequests/Submit",
        "/prefill_gate.v1.GateRequests/Abort",
    }
)
AUTH_HEADER = "authorization"
# Shared by the server and its clients (ctl, console), so neither has to import the other.
TOKEN_ENV = "PREFILL_GATE_ADMIN_TOKEN"
DEFAULT_PORT = 50151


def read_token_file(path: str | None, flag: str) -> str | None:
    """The token in the first line of `path` (None without a path); raises ValueError naming `flag`."""
    if path is None:
        return None
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{flag} {path}: cannot read it: {exc}") from exc
    token = lines[0].strip() if lines else ""
    if not token:
        raise ValueError(f"{flag} {path}: the file holds no token")
    return token


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying `token` (empty without one), for clients."""
    return ((AUTH_HEADER, f"Bearer {token}"),) if token else ()


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses the calls in `methods` unless they carry the admin token."""

    def __init__(self, token: str, methods: Iterable[str] = MUTATING_METHODS) -> None:
        if not token:
            raise ValueError("the admin token must not be empty")
        self._token = token.encode()
        self.methods = frozenset(methods)

    def check(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> tuple[grpc.StatusCode, str] | None:
        """None when the metadata carries the token, else the status code and message to answer with."""
        values = [value for key, value in metadata or () if key == AUTH_HEADER]
        if not values:
            return grpc.StatusCode.UNAUTHENTICATED, "this call needs 'authorization: Bearer <admin token>' metadata"
        value = values[0] if isinstance(values[0], str) else values[0].decode(errors="replace")
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return grpc.StatusCode.UNAUTHENTICATED, "the authorization metadata must read 'Bearer <admin token>'"
        if not hmac.compare_digest(token.strip().encode(), self._token):
            return grpc.StatusCode.PERMISSION_DENIED, "wrong admin token"
        return None

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method not in self.methods:
            return handler
        failure = self.check(handler_call_details.invocation_metadata)
        return handler if failure is None else _denying(handler, *failure)


def _denying(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that ends the call with `code` before any work."""

    async def deny(request: object, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    serializers = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(deny, **serializers)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(deny, **serializers)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(deny, **serializers)
    return grpc.stream_stream_rpc_method_handler(deny, **serializers)
