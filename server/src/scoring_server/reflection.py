"""Server reflection under both names clients ask for: `grpc.reflection.v1` and `v1alpha`.

grpcio-reflection ships only `grpc.reflection.v1alpha` for Python, while newer grpcurl and
Postman ask for `grpc.reflection.v1.ServerReflection` first. The two protocols are
wire-identical: the same messages with the same fields and field numbers, only the proto package
differs. So v1 is the library's v1alpha servicer behind a second method path, using v1alpha's
message classes on the wire, and v1's file descriptor is the library's v1alpha descriptor
renamed, added to the default pool so that reflection can describe v1 itself. Nothing generated
is copied here.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FileDescriptor
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha._async import ReflectionServicer

V1ALPHA_PACKAGE = reflection_pb2.DESCRIPTOR.package
V1_PACKAGE = "grpc.reflection.v1"
# Where upstream grpc keeps v1's proto, so tools that resolve imports by name find the usual path.
V1_FILE = "grpc/reflection/v1/reflection.proto"
V1ALPHA_SERVICE = reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"].full_name
V1_SERVICE = f"{V1_PACKAGE}.ServerReflection"
METHOD = "ServerReflectionInfo"


def v1_file_proto() -> descriptor_pb2.FileDescriptorProto:
    """The library's v1alpha file as v1: package, file name, type references and the options that
    name the package renamed; v1alpha's `deprecated` option dropped (v1 is its successor)."""
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name = V1_FILE
    proto.package = V1_PACKAGE
    for message in proto.message_type:
        _rename_fields(message)
    for service in proto.service:
        for method in service.method:
            method.input_type = _renamed(method.input_type)
            method.output_type = _renamed(method.output_type)
    options = proto.options
    options.ClearField("deprecated")
    options.java_package = options.java_package.replace("v1alpha", "v1")
    options.go_package = options.go_package.replace("v1alpha", "v1")
    return proto


def _rename_fields(message: descriptor_pb2.DescriptorProto) -> None:
    for field in message.field:
        if field.type_name:
            field.type_name = _renamed(field.type_name)
    for nested in message.nested_type:
        _rename_fields(nested)


def _renamed(type_name: str) -> str:
    prefix = f".{V1ALPHA_PACKAGE}."
    return f".{V1_PACKAGE}.{type_name[len(prefix):]}" if type_name.startswith(prefix) else type_name


def v1_file_descriptor(pool: descriptor_pool.DescriptorPool | None = None) -> FileDescriptor:
    """v1's file in `pool` (the default pool, which reflection serves from), added once."""
    if pool is None:
        pool = descriptor_pool.Default()
    try:
        return pool.FindFileByName(V1_FILE)
    except KeyError:
        return pool.AddSerializedFile(v1_file_proto().SerializeToString())


def enable_server_reflection(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Serves reflection for `service_names` and for both reflection services, under v1 and
    v1alpha, from one servicer."""
    v1_file_descriptor()
    servicer = ReflectionServicer((*service_names, V1_SERVICE, V1ALPHA_SERVICE))
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    handlers = {
        METHOD: grpc.stream_stream_rpc_method_handler(
            servicer.ServerReflectionInfo,
            request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
            response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
        )
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(V1_SERVICE, handlers),))
    server.add_registered_method_handlers(V1_SERVICE, handlers)
