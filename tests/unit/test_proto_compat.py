"""Our protos/ against the ones NVIDIA ships in tritonclient: every message, field name, number,
type and label tritonclient knows must be the same in ours (ours may have newer fields)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool
from tritonclient.grpc import model_config_pb2, service_pb2

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> descriptor_pool.DescriptorPool:
    out = tmp_path_factory.mktemp("desc") / "all.desc"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'protos'}",
                    f"--descriptor_set_out={out}", "--include_imports",
                    str(ROOT / "protos" / "grpc_service.proto")], check=True)
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file:
        pool.Add(file)
    return pool


def _messages(descriptor):  # type: ignore[no-untyped-def]
    for message in descriptor.message_types_by_name.values():
        yield from _nested(message)


def _nested(message):  # type: ignore[no-untyped-def]
    yield message
    for sub in message.nested_types:
        yield from _nested(sub)


@pytest.mark.parametrize("module", [model_config_pb2, service_pb2], ids=["model_config", "grpc_service"])
def test_every_triton_field_matches(ours: descriptor_pool.DescriptorPool, module) -> None:  # type: ignore[no-untyped-def]
    checked = 0
    for theirs in _messages(module.DESCRIPTOR):
        mine = ours.FindMessageTypeByName(theirs.full_name)
        for field in theirs.fields:
            other = mine.fields_by_name.get(field.name)
            assert other is not None, f"{theirs.full_name}.{field.name} missing"
            assert (other.number, other.type) == (field.number, field.type), (
                f"{theirs.full_name}.{field.name}")
            assert other.is_repeated == field.is_repeated, f"{theirs.full_name}.{field.name} repeated"
            assert (other.containing_oneof.name if other.containing_oneof else None) == (
                field.containing_oneof.name if field.containing_oneof else None)
            checked += 1
    assert checked > 50


def test_service_methods_match(ours: descriptor_pool.DescriptorPool) -> None:
    theirs = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    mine = ours.FindServiceByName("inference.GRPCInferenceService")
    for method in theirs.methods:
        other = mine.methods_by_name[method.name]
        assert other.input_type.full_name == method.input_type.full_name
        assert other.output_type.full_name == method.output_type.full_name
        assert (other.client_streaming, other.server_streaming) == (
            method.client_streaming, method.server_streaming)
