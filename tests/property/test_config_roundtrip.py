"""Any valid model configuration survives text format, and our parser agrees with Google's.

The oracle is the reference protobuf implementation: ``model_config.proto`` compiled with
``grpc_tools.protoc`` into a temporary module, parsed with ``google.protobuf.text_format``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
from hypothesis import HealthCheck, given, settings

from nursery.config import pbtext
from nursery.schema import inference as pb
from tests.property.strategies import message_bytes

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """Google's protobuf classes for our model_config.proto, in a private descriptor pool (the
    default pool may already hold tritonclient's copy of the same file)."""
    out = tmp_path_factory.mktemp("pb2") / "model_config.desc"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'protos'}",
         f"--descriptor_set_out={out}", "--include_imports", str(ROOT / "protos" / "model_config.proto")],
        check=True,
    )
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    module = ModuleType("reference_model_config")
    module.ModelConfig = message_factory.GetMessageClass(  # type: ignore[attr-defined]
        pool.FindMessageTypeByName("inference.ModelConfig"))
    return module


def _sort_maps(message: Any) -> Any:
    for info in pbtext.fields_of(type(message)).values():
        if info.group is not None and not pbtext.is_present(message, info):
            continue
        value = getattr(message, info.name)
        if info.proto_type == "map":
            if info.map_types and info.map_types[1] == "message":
                for v in value.values():
                    _sort_maps(v)
            setattr(message, info.name, dict(sorted(value.items())))
        elif info.proto_type == "message":
            for sub in value if info.repeated else [value]:
                _sort_maps(sub)
    return message


def _canonical(message: pb.ModelConfig) -> bytes:
    """Wire bytes after a betterproto round trip, map entries sorted by key (protobuf's
    printer sorts them; map order carries no meaning)."""
    return bytes(_sort_maps(pb.ModelConfig().parse(bytes(message))))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message_bytes(pb.ModelConfig))
def test_text_round_trip(raw: bytes) -> None:
    config = pb.ModelConfig().parse(raw)
    text = pbtext.dumps(config)
    parsed = pbtext.parse(text, pb.ModelConfig())
    assert _canonical(parsed) == _canonical(config)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message_bytes(pb.ModelConfig))
def test_agrees_with_reference_parser(reference: ModuleType, raw: bytes) -> None:
    config = pb.ModelConfig().parse(raw)
    text = pbtext.dumps(config)
    ref = text_format.Parse(text, reference.ModelConfig())
    assert _canonical(pb.ModelConfig().parse(ref.SerializeToString())) == _canonical(config)
    # and the other way: Google's printer's output parses to the same message
    ours = pbtext.parse(text_format.MessageToString(ref), pb.ModelConfig())
    assert _canonical(ours) == _canonical(config)


def test_triton_style_config(reference: ModuleType) -> None:
    text = """
    name: "m"  # a comment
    platform: "onnxruntime_onnx"
    max_batch_size: 8
    input [ { name: "A", data_type: TYPE_FP32, dims: [ 3, -1 ], reshape: { shape: [ ] } } ]
    input { name: 'B' data_type: TYPE_STRING dims: 1 }
    output [{ name: "C" data_type: 11 dims: [1] label_filename: "l.txt" }];
    instance_group < count: 2 kind: KIND_CPU >
    dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 100
      priority_queue_policy { key: 1 value: { timeout_action: DELAY max_queue_size: 3 } } }
    parameters: { key: "k" value: { string_value: "v\\"q\\x41" } }
    parameters [ { key: "k2", value { string_value: "a" "b" } } ]
    optimization { graph { level: -1 } cuda { graphs: true } }
    model_warmup [ { name: "w" batch_size: 2 inputs { key: "A" value: { data_type: TYPE_FP32
      dims: [3] random_data: true } } } ]
    """
    ours = pbtext.parse(text, pb.ModelConfig())
    ref = text_format.Parse(text, reference.ModelConfig())
    assert _canonical(ours) == _canonical(pb.ModelConfig().parse(ref.SerializeToString()))
    assert ours.parameters["k"].string_value == 'v"qA'
    assert ours.parameters["k2"].string_value == "ab"
    assert ours.output[0].data_type == pb.DataType.TYPE_FP32


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        ("max_batch_size: 1.5", "1:17",
         "Expected integer, got: 1.5 (an integer for field 'max_batch_size')"),
        ("\n  bogus: 1", "2:3", "unknown field 'bogus' in ModelConfig"),
        ('name: "a"\nname: "b"', "2:1", "field 'name' is specified more than once"),
        ('input { name: "x"', "1:18", "expected '}' to close ModelInput"),
        ("dynamic_batching {} sequence_batching {}", "1:21", "another member of oneof"),
        ("max_batch_size: 99999999999", "1:17",
         "Integer out of range (99999999999) for int32"),
        ("input { data_type: TYPE_FOO }", "1:20", "unknown value 'TYPE_FOO'"),
        ('name "x"', "1:6", "expected ':' after field 'name'"),
        ("max_batch_size: [1, 2]", "1:17", "is not repeated"),
        ('name: "unterminated', "1:7", "unexpected character"),
        ("input { dims: [1, 2 }", "1:21", "expected ','"),
        ("max_batch_size: -1\nversion_policy { latest { num_versions: -2 } }", "2:41",
         "Expected integer, got: -"),
        ('ensemble_scheduling { max_inflight_requests: "x" }', "1:46", 'Expected integer, got: "x"'),
    ],
)
def test_errors_name_line_column_and_field(text: str, where: str, message: str) -> None:
    with pytest.raises(pbtext.TextFormatError) as err:
        pbtext.parse(text, pb.ModelConfig())
    assert str(err.value).startswith(where + ":"), str(err.value)
    assert message in str(err.value)
