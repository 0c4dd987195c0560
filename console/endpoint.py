"""Where a live console connects: the target, the credentials, one shared grpc.aio channel.

The channel is made lazily inside the app's event loop (grpc.aio binds a channel to the loop that
creates it), and the stream, the snapshot poll and the admin calls all share it.
"""

from __future__ import annotations

import re
from pathlib import Path

import grpc

from prefill_gate.v1 import admin_pb2_grpc, telemetry_pb2_grpc

_TARGET = re.compile(r"^(?P<host>\[[0-9a-fA-F:.]+\]|[^\s:\[\]]+):(?P<port>\d{1,5})$")
# A record of 64 ranks is a few KiB; history pages (GetRounds) can be far larger.
_MAX_MESSAGE = 64 * 1024 * 1024
# A dashboard wants fresh records: with gRPC's default flow control (BDP probing) megabytes of old
# records can sit in HTTP/2 buffers, hiding a slow console from the server's bounded queue, which is
# what counts and reports drops (PRACTICE.md). A small window makes falling behind visible.
_FRESH_STREAM = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 65536)]


class TargetError(ValueError):
    """A target or credential the console cannot use; the message says which and why."""


def check_target(target: str) -> str:
    """`HOST:PORT` (IPv6 hosts in brackets); raises TargetError otherwise."""
    match = _TARGET.match(target.strip())
    if match is None or not 0 < int(match.group("port")) < 65536:
        raise TargetError(f"--target must be HOST:PORT (e.g. 127.0.0.1:50151), got {target!r}")
    return target.strip()


class Endpoint:
    """A server address with its token and optional TLS root certificates."""

    def __init__(self, target: str, token: str | None = None, tls_ca: str | None = None) -> None:
        self.target = check_target(target)
        self.token = token or None
        self.root_certificates: bytes | None = None
        if tls_ca is not None:
            try:
                self.root_certificates = Path(tls_ca).read_bytes()
            except OSError as exc:
                raise TargetError(f"--tls-ca {tls_ca}: cannot read it ({exc.strerror or exc})") from exc
            if b"-----BEGIN CERTIFICATE-----" not in self.root_certificates:
                raise TargetError(f"--tls-ca {tls_ca}: not a PEM certificate file")
        self._channel: grpc.aio.Channel | None = None

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata: the bearer token, sent explicitly so it also works on a plain loopback channel."""
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def channel(self) -> grpc.aio.Channel:
        """The shared channel, made on first use (call from inside the running loop)."""
        if self._channel is None:
            options = [("grpc.max_receive_message_length", _MAX_MESSAGE), *_FRESH_STREAM]
            if self.root_certificates is not None:
                credentials = grpc.ssl_channel_credentials(root_certificates=self.root_certificates)
                self._channel = grpc.aio.secure_channel(self.target, credentials, options=options)
            else:
                self._channel = grpc.aio.insecure_channel(self.target, options=options)
        return self._channel

    def telemetry(self) -> telemetry_pb2_grpc.GateTelemetryStub:
        """A telemetry stub on the shared channel."""
        return telemetry_pb2_grpc.GateTelemetryStub(self.channel())

    def admin(self) -> admin_pb2_grpc.GateAdminStub:
        """An admin stub on the shared channel."""
        return admin_pb2_grpc.GateAdminStub(self.channel())

    async def close(self) -> None:
        """Close the channel (ends any call still open on it)."""
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close()


def describe_rpc_error(error: grpc.aio.AioRpcError, target: str) -> str:
    """One line a user can act on, from a failed call."""
    code = error.code()
    details = (error.details() or "").strip()
    if code is grpc.StatusCode.UNAVAILABLE:
        lowered = details.lower()
        if "connection refused" in lowered:
            return f"cannot reach {target}: connection refused (is the server running on that port?)"
        if "dns" in lowered or "name resolution" in lowered or "not known" in lowered:
            return f"cannot resolve the host of {target}"
        if "ssl" in lowered or "handshake" in lowered or "certificate" in lowered:
            return f"TLS handshake with {target} failed (check --tls-ca and that the server speaks TLS)"
        if "socket closed" in lowered:
            return f"{target} closed the connection at once (a TLS server? then pass --tls-ca)"
        return f"{target} is unavailable: {_short(details) or 'the server went away'}"
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"{target} did not answer in time"
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return f"{target} refused the credentials: {_short(details) or 'a token is required'} (check --token)"
    if code is grpc.StatusCode.PERMISSION_DENIED:
        return f"{target} refused the token: {_short(details) or 'permission denied'} (check --token)"
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return f"{target} does not serve the prefill-gate API (wrong port?)"
    return f"{code.name}: {_short(details)}"


def _short(text: str, limit: int = 100) -> str:
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"
