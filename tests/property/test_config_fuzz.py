"""A configuration, however wrong, costs only its own model (issue 22).

``read_model_config`` (and the warmup samples built from what it returns) must answer any
``config.pbtxt`` with a configuration or a :class:`~nursery.errors.NurseryError`: never an
``AttributeError`` from betterproto, a ``ValueError`` from numpy, or anything else that would
stop the start-up. Hypothesis writes configurations from the schema itself (every field of
``ModelConfig``, nested messages, maps, enums by name or number, values of the right type or
of a wrong one) and mutates the valid seeds of ``test_fuzz_tensors`` byte by byte; each text
goes through the file path the server takes: ``config.pbtxt`` in a model folder, read with
auto-complete on or off.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nursery.backends.base import get_factory
from nursery.config import model as model_config
from nursery.config.pbtext import FieldInfo, fields_of
from nursery.config.warmup import warmup_samples
from nursery.errors import ConfigError, NurseryError
from nursery.schema import inference as pb
from tests.property.test_fuzz_tensors import SEEDS, _apply

_INTS = [0, 1, 2, 4, 16, -1, -2, 2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1, 2**64 - 1]
_NAMES = ["INPUT0", "OUTPUT0", "S", "START", "m", "", "x" * 300, "é"]
_MAX_DEPTH = 4


def _scalar(info: FieldInfo, proto_type: str, cls: Any) -> st.SearchStrategy[str]:
    quoted = st.sampled_from(_NAMES).map(lambda s: '"' + s + '"')
    if proto_type == "string":
        right = quoted
    elif proto_type == "bool":
        right = st.sampled_from(["true", "false", "1", "0"])
    elif proto_type in ("float", "double"):
        right = st.sampled_from(["0", "1.5", "-3", "1e40", "nan", "inf", "-inf"])
    elif proto_type == "enum":
        right = st.one_of(st.sampled_from([m.name for m in cls]),
                          st.sampled_from(_INTS).map(str))
    elif proto_type == "bytes":
        right = st.just('"\\x00\\x01"')
    else:  # the integer types
        right = st.sampled_from(_INTS).map(str)
    wrong = st.sampled_from(['"text"', "true", "1.5", "-1", "TYPE_FP32"])
    return st.one_of(right, right, right, wrong)


@st.composite
def message_text(draw: st.DrawFn, cls: type, depth: int = 0) -> str:
    """A text-format body for ``cls``: a few of its fields, each given 0-3 times."""
    fields = list(fields_of(cls).values())
    if not fields:
        return ""
    chosen = draw(st.lists(st.sampled_from(fields), max_size=6 if depth < 2 else 3, unique=True))
    parts = []
    for info in chosen:
        times = draw(st.integers(1, 3)) if info.repeated or info.proto_type == "map" else 1
        for _ in range(times):
            parts.append(draw(_field_text(info, depth)))
    return " ".join(parts)


def _field_text(info: FieldInfo, depth: int) -> st.SearchStrategy[str]:
    name = info.proto_name
    if info.proto_type == "message":
        if depth >= _MAX_DEPTH:
            return st.just(f"{name} {{ }}")
        return message_text(info.cls, depth + 1).map(lambda body: f"{name} {{ {body} }}")
    if info.proto_type == "map":
        assert info.map_types is not None
        key_type, value_type = info.map_types
        key = _scalar(info, key_type, None)
        if value_type == "message":
            value = (message_text(info.cls, depth + 1).map(lambda body: f"value {{ {body} }}")
                     if depth < _MAX_DEPTH else st.just("value { }"))
        else:
            value = _scalar(info, value_type, info.cls).map(lambda v: f"value: {v}")
        return st.tuples(key, value).map(lambda kv: f"{name} {{ key: {kv[0]} {kv[1]} }}")
    return _scalar(info, info.proto_type, info.cls).map(lambda v: f"{name}: {v}")


_HEADERS = [
    "",
    'backend: "python"\n',
    'backend: "python"\nmax_batch_size: 8\n'
    'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }]\n'
    'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }]\n',
    'platform: "ensemble"\n',
]


@st.composite
def config_texts(draw: st.DrawFn) -> str:
    """Schema-made configurations (after one of a few headers) or mutated seeds."""
    if draw(st.booleans()):
        return draw(st.sampled_from(_HEADERS)) + draw(message_text(pb.ModelConfig))
    seed = draw(st.sampled_from(SEEDS["config_pbtxt"]))
    edits = draw(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1 << 16),
                                    st.integers(0, 1 << 16)), max_size=6))
    return _apply(seed, edits).decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def model_dir() -> Iterator[Path]:
    """A python model folder (so auto-complete runs), with the side folders a configuration
    may point into (initial states, warmup data)."""
    root = Path(tempfile.mkdtemp(prefix=f"nursery_cfgfuzz_{os.getpid()}_"))
    folder = root / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    (folder / "initial_state").mkdir()
    (folder / "initial_state" / "empty").write_bytes(b"")
    (folder / "warmup").mkdir()
    (folder / "warmup" / "x").write_bytes(b"\0" * 16)
    yield folder
    shutil.rmtree(root, ignore_errors=True)


def _read(folder: Path, text: str, auto_complete: bool) -> None:
    (folder / "config.pbtxt").write_text(text, encoding="utf-8")
    try:
        config, _ = model_config.read_model_config(folder, "m", backends=get_factory,
                                                   auto_complete=auto_complete)
        if _warmup_is_small(config.proto):
            warmup_samples(config)
    except NurseryError:
        pass  # the model fails to load, with a reason; nothing else may come out


def _warmup_is_small(proto: pb.ModelConfig) -> bool:
    """Warmup samples hold what they declare (as in Triton): gigabytes are a valid, slow
    configuration, not a finding, so only samples of at most a million elements are built."""
    for sample in proto.model_warmup:
        for spec in sample.inputs.values():
            count = max(sample.batch_size, 1)
            for d in spec.dims:
                count *= max(int(d), 1)
            if count > 1_000_000:
                return False
    return True


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=config_texts(), auto_complete=st.booleans())
def test_any_config_text_fails_only_with_a_config_error(model_dir: Path, text: str,
                                                        auto_complete: bool) -> None:
    _read(model_dir, text, auto_complete)


_SIMPLE_SEQUENCE = """
name: "m"
backend: "python"
max_batch_size: 8
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


@pytest.mark.parametrize("block", ["sequence_batching { }", _SIMPLE_SEQUENCE])
def test_sequence_batching_without_a_strategy_is_direct(model_dir: Path, block: str) -> None:
    """Triton's simple_sequence example names neither ``direct`` nor ``oldest``: the direct
    strategy, with its defaults."""
    text = block if "backend" in block else (
        'backend: "python"\ninput [{ name: "I" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
        'output [{ name: "O" data_type: TYPE_FP32 dims: [ 1 ] }]\n' + block)
    (model_dir / "config.pbtxt").write_text(text)
    config, _ = model_config.read_model_config(model_dir, "m", backends=get_factory)
    assert config.sequence is not None
    assert config.sequence.schedule.strategy == "direct"
    assert config.json["sequence_batching"]["max_sequence_idle_microseconds"] == 1_000_000


def test_an_unexpected_error_names_the_model_the_file_and_the_field(
        model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The boundary itself: a bug while reading one field fails that model with a
    ConfigError (INVALID_ARG, as every configuration error), never anything else."""
    def broken(*args: Any) -> None:
        raise AttributeError("'ModelSequenceBatching' object has no attribute 'direct'")

    monkeypatch.setattr(model_config, "sequence_config", broken)
    (model_dir / "config.pbtxt").write_text(
        'backend: "python"\ninput [{ name: "I" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
        'output [{ name: "O" data_type: TYPE_FP32 dims: [ 1 ] }]\nsequence_batching { }\n')
    with pytest.raises(ConfigError) as raised:
        model_config.read_model_config(model_dir, "m", backends=get_factory)
    assert raised.value.message == (
        "model 'm': config.pbtxt: 'sequence_batching' could not be read: AttributeError: "
        "'ModelSequenceBatching' object has no attribute 'direct'")
    assert isinstance(raised.value.__cause__, AttributeError)

    def broken_freeze(*args: Any) -> None:
        raise ValueError("anywhere else")

    monkeypatch.setattr(model_config, "_freeze", broken_freeze)
    with pytest.raises(ConfigError, match=r"^model 'm': config.pbtxt could not be read: "
                                          r"ValueError: anywhere else$"):
        model_config.read_model_config(model_dir, "m", backends=get_factory)
