"""Request decoding that answers a malformed message instead of failing inside gRPC.

gRPC decodes a request before any interceptor sees the call, so a generated deserializer that
raises (a proto3 string that is not UTF-8, a corrupt wire format) ends the call UNKNOWN with the
exception's class in its details, logged as a servicer crash, uncounted and unauthenticated; in a
bulk stream it ends the whole stream. The scoring services are registered here instead, with
deserializers that never raise: a bad message becomes an `Undecodable` marker. A unary call
raises the marker's error inside the interceptor chain (authentication, telemetry and error
mapping then treat it as any other bad request); a bulk stream answers it with an error reply of
its own and goes on (`scoring_server.services.streaming`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import empty_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass
from google.protobuf.unknown_fields import UnknownFieldSet

from scoring_server.errors import ServiceError
from scoring_server.interception import Unary

_LENGTH_DELIMITED = 2  # the wire type of strings, bytes and messages
_VARINT = 0


@dataclass(frozen=True)
class Undecodable:
    """What can still be told of a request message that did not parse."""

    message_type: str
    # The first string field whose bytes are not UTF-8 (a path such as `documents[1].text`),
    # where the wire format around it reads.
    field: str | None = None
    # A bulk message's `sequence` and its request's `request_id`, where they read, so that the
    # caller can match the error reply to what it sent (replies come in completion order).
    sequence: int = 0
    request_id: str = ""

    def error(self) -> ServiceError:
        if self.field is not None:
            return ServiceError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{self.field}: not valid UTF-8 (protobuf string fields must be)",
                field=self.field,
            )
        return ServiceError(
            grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid {self.message_type} message"
        )


def add_servicer(service: ServiceDescriptor, servicer: object, server: grpc.aio.Server) -> None:
    """What the generated `add_*Servicer_to_server` does, with tolerant deserializers."""
    handlers = {method.name: _handler(method, getattr(servicer, method.name)) for method in service.methods}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)


def _handler(method: MethodDescriptor, behavior: Callable[..., Any]) -> grpc.RpcMethodHandler:
    decode = tolerant_deserializer(GetMessageClass(method.input_type))
    encode = GetMessageClass(method.output_type).SerializeToString
    if not method.client_streaming and not method.server_streaming:
        return grpc.unary_unary_rpc_method_handler(
            _refusing_undecodable(behavior), request_deserializer=decode, response_serializer=encode
        )
    if method.client_streaming and method.server_streaming:
        # Markers reach the bulk loop as messages: one bad message must not end the stream.
        return grpc.stream_stream_rpc_method_handler(
            behavior, request_deserializer=decode, response_serializer=encode
        )
    raise TypeError(f"{method.full_name}: only unary and bidirectional methods are served")


def _refusing_undecodable(behavior: Unary) -> Unary:
    async def checked(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            raise request.error()
        return await behavior(request, context)

    return checked


def tolerant_deserializer(message_class: type[Message]) -> Callable[[bytes], Message | Undecodable]:
    descriptor = message_class.DESCRIPTOR

    def decode(raw: bytes) -> Message | Undecodable:
        try:
            return message_class.FromString(raw)
        except DecodeError:
            return _undecodable(descriptor, raw)

    return decode


def _undecodable(descriptor: Descriptor, raw: bytes) -> Undecodable:
    """`sequence` and `request.request_id` are the bulk message shape (see
    `scoring_server.services.streaming`); a unary request has neither, and gets the defaults."""
    sequence = _last(descriptor, raw, ("sequence",))
    request_id = _last(descriptor, raw, ("request", "request_id"))
    return Undecodable(
        descriptor.full_name,
        _first_bad_string(descriptor, raw),
        sequence if isinstance(sequence, int) else 0,
        (_utf8(request_id) or "") if isinstance(request_id, bytes) else "",
    )


def _wire_fields(descriptor: Descriptor, raw: bytes) -> Iterator[tuple[FieldDescriptor, Any]]:
    """The fields of `descriptor` as they are on the wire, their contents left undecoded (every
    field is unknown to Empty); none where the wire format itself is broken."""
    try:
        fields = UnknownFieldSet(empty_pb2.Empty.FromString(raw))
    except DecodeError:
        return
    for value in fields:
        field = descriptor.fields_by_number.get(value.field_number)
        if field is not None:
            yield field, value


def _first_bad_string(descriptor: Descriptor, raw: bytes, prefix: str = "") -> str | None:
    seen: dict[int, int] = {}
    for field, value in _wire_fields(descriptor, raw):
        if value.wire_type != _LENGTH_DELIMITED:
            continue
        path = prefix + field.name
        if field.is_repeated:
            path += f"[{seen.get(field.number, 0)}]"
            seen[field.number] = seen.get(field.number, 0) + 1
        if field.type == FieldDescriptor.TYPE_STRING and _utf8(value.data) is None:
            return path
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            inner = _first_bad_string(field.message_type, value.data, path + ".")
            if inner is not None:
                return inner
    return None


def _last(descriptor: Descriptor, raw: bytes, path: tuple[str, ...]) -> int | bytes | None:
    """The raw value at `path` (field names from `descriptor` down); the last one on the wire,
    as the parser keeps it."""
    found = None
    for field, value in _wire_fields(descriptor, raw):
        if field.name != path[0]:
            continue
        if len(path) == 1 and value.wire_type in (_VARINT, _LENGTH_DELIMITED):
            found = value.data
        elif len(path) > 1 and field.type == FieldDescriptor.TYPE_MESSAGE and value.wire_type == _LENGTH_DELIMITED:
            inner = _last(field.message_type, value.data, path[1:])
            found = inner if inner is not None else found
    return found


def _utf8(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None
