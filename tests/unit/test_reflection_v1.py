"""v1 reflection's descriptor is the library's v1alpha one renamed: same messages and numbers."""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection_pb2

from scoring_server import reflection


def _fields(proto: descriptor_pb2.FileDescriptorProto) -> dict[str, list[tuple[str, int, int, str]]]:
    return {
        m.name: [(f.name, f.number, f.type, f.type_name.rsplit(".", 1)[-1]) for f in m.field]
        for m in proto.message_type
    }


def test_v1_is_v1alpha_renamed() -> None:
    v1alpha = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(v1alpha)
    v1 = reflection.v1_file_proto()
    assert (v1.name, v1.package) == ("grpc/reflection/v1/reflection.proto", "grpc.reflection.v1")
    assert _fields(v1) == _fields(v1alpha)  # wire-identical
    assert "v1alpha" not in str(v1)
    assert not v1.options.deprecated
    (method,) = v1.service[0].method
    assert (method.input_type, method.output_type) == (
        ".grpc.reflection.v1.ServerReflectionRequest",
        ".grpc.reflection.v1.ServerReflectionResponse",
    )


def test_v1_is_added_to_a_pool_once() -> None:
    pool = descriptor_pool.DescriptorPool()
    added = reflection.v1_file_descriptor(pool)
    assert reflection.v1_file_descriptor(pool) is added
    service = pool.FindServiceByName("grpc.reflection.v1.ServerReflection")
    assert service.methods_by_name["ServerReflectionInfo"].input_type.full_name == (
        "grpc.reflection.v1.ServerReflectionRequest"
    )
