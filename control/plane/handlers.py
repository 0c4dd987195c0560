"""How the servicers are attached to the server: one generic handler per service, built from its descriptor.

Two things the generated `add_*Servicer_to_server` cannot do:

- A request that does not parse as its message ends with INVALID_ARGUMENT naming the message, not with
  UNKNOWN and the Python exception's text (grpc's answer when a deserializer raises).
- A server stream may write bytes that are already a serialized message (the round hub's shared frames),
  so a record read by many subscribers is serialized once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message


class Undecodable:
    """A request whose bytes are not a valid message of the method's input type."""

    def __init__(self, type_name: str, error: str) -> None:
        self.type_name = type_name
        self.error = error

    @property
    def text(self) -> str:
        return f"the request is not a valid {self.type_name}: {self.error or 'malformed protobuf'}"


def _deserializer(method: MethodDescriptor) -> Callable[[bytes], Message | Undecodable]:
    request_class = message_factory.GetMessageClass(method.input_type)
    type_name = method.input_type.full_name

    def parse(data: bytes) -> Message | Undecodable:
        try:
            return request_class.FromString(data)
        except (DecodeError, RuntimeError, ValueError) as exc:  # the upb parser raises DecodeError
            return Undecodable(type_name, str(exc))

    return parse


def _serialize(message: Message | bytes) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


def _guarded(behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def call(request: Message | Undecodable, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.text)
        return await behavior(request, context)

    return call


def add_service(server: grpc.aio.Server, servicer: object, service: ServiceDescriptor) -> None:
    """Serve every method of `service` with the same-named coroutine of `servicer`."""
    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    handlers = {}
    for method in service.methods:
        if method.client_streaming:
            raise ValueError(f"{method.full_name}: client streams are not served here")
        make = kinds[(method.client_streaming, method.server_streaming)]
        handlers[method.name] = make(
            _guarded(getattr(servicer, method.name)),
            request_deserializer=_deserializer(method),
            response_serializer=_serialize,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
