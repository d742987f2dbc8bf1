"""The PyTorch backend in-process: Triton's naming conventions, its parameters, loading real
TorchScript / exported models on CPU, and execution (zero-copy in and out)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nursery.backends import pytorch
from nursery.backends.base import get_factory
from nursery.config.model import read_model_config
from nursery.errors import ConfigError, InvalidArgument
from nursery.runtime.devices import InstancePlacement
from tests.conftest import make_models

CPU = InstancePlacement("g", 0, "cpu", 0)


def _load(repo: Path, name: str, placement: InstancePlacement = CPU) -> pytorch.PyTorchInstance:
    config, versions = read_model_config(repo / name, name, backends=get_factory)
    return pytorch.FACTORY.load(config, repo / name / str(versions[-1]), placement)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("torch_repo")
    make_models.write_torch_models(root)
    make_models.write_torch_model(
        root, "shout", make_models.build_torch_strings(),
        make_models.torch_config("shout", [("INPUT__0", "BYTES", [-1])],
                                 [("OUTPUT__0", "BYTES", [-1])], 0))
    return root


# -- naming conventions (pure) ------------------------------------------------------------


def test_forward_argument_names_win() -> None:
    assert pytorch.input_positions(["y", "x"], ["x", "y"], "m") == [1, 0]


def test_index_names() -> None:
    assert pytorch.input_positions(["IN__1", "IN__0"], ["a", "b"], "m") == [1, 0]
    assert pytorch.output_positions(["OUT__2", "OUT__0", "OUT__1"], "m") == [2, 0, 1]


def test_strict_order_with_triton_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "nursery.backends.pytorch"):
        assert pytorch.input_positions(["A__x", "B"], ["a", "b"], "m") == [0, 1]
        assert pytorch.output_positions(["OUT__y"], "m") == [0]
    assert "do not follow the <name>__<index> naming convention" in caplog.text
    assert "nor do they follow the <name>__<index> naming convention" in caplog.text


@settings(max_examples=40, deadline=None)
@given(st.permutations(list(range(5))))
def test_index_convention_is_a_permutation(order: list[int]) -> None:
    names = [f"T__{i}" for i in order]
    assert pytorch.input_positions(names, [], "m") == order
    assert pytorch.output_positions(names, "m") == order


# -- parameters ---------------------------------------------------------------------------


def test_parameter_defaults_and_values() -> None:
    assert pytorch.parse_options({}, "m") == pytorch.TorchOptions()
    opts = pytorch.parse_options({"DISABLE_OPTIMIZED_EXECUTION": "true", "INFERENCE_MODE": "false",
                                  "ENABLE_JIT_PROFILING": "False", "ENABLE_NVFUSER": "true",
                                  "ENABLE_WEIGHT_SHARING": "1"}, "m")
    assert not opts.optimized_execution and not opts.inference_mode
    assert opts.jit_profiling is False and opts.jit_executor is None and opts.weight_sharing
    with pytest.raises(ConfigError, match="failed to convert INFERENCE_MODE 'maybe' to boolean"):
        pytorch.parse_options({"INFERENCE_MODE": "maybe"}, "m")


# -- loading and executing real models ------------------------------------------------------


def test_index_convention_model_runs_on_read_only_inputs(repo: Path) -> None:
    instance = _load(repo, "add_sub_torch")
    a = np.frombuffer(np.arange(32, dtype=np.float32).tobytes(), np.float32).reshape(2, 16)
    b = np.ones((2, 16), np.float32)
    assert not a.flags.writeable  # what HTTP request bodies give the backend
    out = instance.execute({"INPUT__1": b, "INPUT__0": a}, ["OUTPUT__1", "OUTPUT__0"])
    np.testing.assert_array_equal(out["OUTPUT__0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT__1"], a - b)
    assert not out["OUTPUT__0"].flags.owndata  # a view of the torch tensor, not a copy
    instance.close()


def test_forward_argument_model_matches_onnx_weights(repo: Path) -> None:
    instance = _load(repo, "mlp_torch")
    x = np.random.default_rng(3).standard_normal((4, 784)).astype(np.float32)
    out = instance.execute({"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
    torch_module = make_models.build_torch_mlp(script=False)
    with torch.no_grad():
        expected = torch_module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    exported = _load(repo, "mlp_torch_pt2")
    np.testing.assert_allclose(exported.execute({"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"], expected,
                               rtol=1e-5, atol=1e-6)


def test_strings_as_list_of_str(repo: Path) -> None:
    instance = _load(repo, "shout")
    arr = np.array([b"hi", "h\u00e9".encode()], dtype=object)
    out = instance.execute({"INPUT__0": arr}, ["OUTPUT__0"])["OUTPUT__0"]
    assert list(out) == [b"hi!", "h\u00e9!".encode()]


def _copy_model(repo: Path, src: str, dst: Path, config: str) -> Path:
    (dst / "1").mkdir(parents=True)
    (dst / "1" / "model.pt").write_bytes((repo / src / "1" / "model.pt").read_bytes())
    (dst / "config.pbtxt").write_text(config)
    return dst


def test_input_count_mismatch_fails_to_load(repo: Path, tmp_path: Path) -> None:
    config = make_models.torch_config("bad", [("INPUT__0", "FP32", [16])],
                                      [("OUTPUT__0", "FP32", [16])], 8)
    _copy_model(repo, "add_sub_torch", tmp_path / "bad", config)
    with pytest.raises(ConfigError, match="configuration expects 1 inputs, model provides 2"):
        _load(tmp_path, "bad")


def test_output_datatype_mismatch_is_reported(repo: Path, tmp_path: Path) -> None:
    io = [("INPUT__0", "FP32", [16]), ("INPUT__1", "FP32", [16])]
    config = make_models.torch_config("wrongtype", io, [("OUTPUT__0", "FP64", [16])], 8)
    _copy_model(repo, "add_sub_torch", tmp_path / "wrongtype", config)
    instance = _load(tmp_path, "wrongtype")
    x = np.ones((1, 16), np.float32)
    with pytest.raises(InvalidArgument, match="configuration expects datatype TYPE_FP64 for "
                                              "output 'OUTPUT__0', model provides TYPE_FP32"):
        instance.execute({"INPUT__0": x, "INPUT__1": x}, ["OUTPUT__0"])


def test_output_index_past_the_model_outputs(repo: Path, tmp_path: Path) -> None:
    io = [("INPUT__0", "FP32", [16]), ("INPUT__1", "FP32", [16])]
    config = make_models.torch_config("toomany", io, [("OUTPUT__5", "FP32", [16])], 8)
    _copy_model(repo, "add_sub_torch", tmp_path / "toomany", config)
    instance = _load(tmp_path, "toomany")
    x = np.ones((1, 16), np.float32)
    with pytest.raises(InvalidArgument, match="refers to an output index which doesn't exist. "
                                              "This model has 2 outputs"):
        instance.execute({"INPUT__0": x, "INPUT__1": x}, ["OUTPUT__5"])


def test_missing_model_file(tmp_path: Path) -> None:
    (tmp_path / "nofile" / "1").mkdir(parents=True)
    (tmp_path / "nofile" / "config.pbtxt").write_text(make_models.torch_config(
        "nofile", [("INPUT__0", "FP32", [1])], [("OUTPUT__0", "FP32", [1])], 0))
    config, _ = read_model_config(tmp_path / "nofile", "nofile", backends=get_factory)
    with pytest.raises(ConfigError, match="unable to find .*model.pt"):
        pytorch.FACTORY.load(config, tmp_path / "nofile" / "1", CPU)


def test_gpu_instance_without_cuda_runs_on_cpu(repo: Path, caplog: pytest.LogCaptureFixture) -> None:
    if torch.cuda.is_available():  # pragma: no cover - the GPU tests cover this machine
        return
    with caplog.at_level(logging.WARNING, "nursery.backends.pytorch"):
        instance = _load(repo, "add_sub_torch", InstancePlacement("g", 0, "gpu", 0))
    assert "no usable CUDA device 0; running on the CPU" in caplog.text
    x = np.ones((1, 16), np.float32)
    assert instance.execute({"INPUT__0": x, "INPUT__1": x}, ["OUTPUT__0"])["OUTPUT__0"][0, 0] == 2


def test_weight_sharing_reuses_the_module(repo: Path, tmp_path: Path) -> None:
    io = [("INPUT__0", "FP32", [16]), ("INPUT__1", "FP32", [16])]
    out = [("OUTPUT__0", "FP32", [16]), ("OUTPUT__1", "FP32", [16])]
    config = make_models.torch_config(
        "shared", io, out, 8,
        'parameters { key: "ENABLE_WEIGHT_SHARING" value: { string_value: "true" } }\n')
    _copy_model(repo, "add_sub_torch", tmp_path / "shared", config)
    first = _load(tmp_path, "shared")
    second = _load(tmp_path, "shared", InstancePlacement("g", 1, "cpu", 0))
    assert first._module is second._module


@pytest.mark.parametrize(("datatype", "what"), [
    ("UINT16", "input 'INPUT__0'"), ("UINT32", "input 'INPUT__0'"),
    ("UINT64", "input 'INPUT__0'")])
def test_unsigned_types_past_uint8_are_refused_as_triton_does(
        tmp_path: Path, datatype: str, what: str) -> None:
    # Triton's L0_libtorch_io_types: its PyTorch backend has no mapping for them
    make_models.write_torch_model(
        tmp_path, "ident", make_models._torch_quietly().jit.script(_Identity()),
        make_models.torch_config("ident", [("INPUT__0", datatype, [-1])],
                                 [("OUTPUT__0", "INT32", [-1])], 4))
    with pytest.raises(ConfigError, match=f"unsupported datatype TYPE_{datatype} for {what} "
                                          "for model 'ident'"):
        _load(tmp_path, "ident")


class _Identity(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()


@pytest.mark.parametrize("datatype", ["BOOL", "UINT8", "INT8", "INT16", "INT32", "INT64",
                                      "FP16", "FP32", "FP64", "BF16"])
def test_every_numeric_datatype_round_trips(tmp_path: Path, datatype: str) -> None:
    class Identity(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.clone()

    make_models.write_torch_model(
        tmp_path, "ident", make_models._torch_quietly().jit.script(Identity()),
        make_models.torch_config("ident", [("INPUT__0", datatype, [-1])],
                                 [("OUTPUT__0", datatype, [-1])], 4))
    instance = _load(tmp_path, "ident")
    from nursery.types import DataType

    dt = DataType.from_protocol(datatype)
    raw = np.arange(6).astype(dt.numpy_dtype).reshape(2, 3)
    readonly = np.frombuffer(raw.tobytes(), dt.numpy_dtype).reshape(2, 3)
    out = instance.execute({"INPUT__0": readonly}, ["OUTPUT__0"])["OUTPUT__0"]
    assert out.dtype == dt.numpy_dtype
    np.testing.assert_array_equal(out, raw)


def test_torch_imports_after_a_protobuf_serialization(tmp_path: Path) -> None:
    """L0_decoupled: serializing a message with betterproto's Rust codec leaves a module named
    '' in sys.modules, on which torch's import fails ("<module ''> is a built-in module");
    the backend makes it harmless before importing torch (a fresh process: torch not imported
    yet), and the codec goes on working."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    script = (
        "import sys\n"
        "from nursery.schema import inference as pb\n"
        "bytes(pb.ModelInstanceGroup(name='g', count=2))\n"
        "from nursery.backends import pytorch\n"
        "torch = pytorch._torch()\n"
        "assert torch.library is not None\n"
        "bytes(pb.ModelInstanceGroup(name='h', count=3))  # the codec still serializes\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(root)},
                          timeout=300)
    assert done.returncode == 0, done.stderr


def test_a_config_without_outputs_is_refused_in_tritons_words(repo: Path, tmp_path: Path) -> None:
    # the PyTorch backend's own rule (Triton's core and its Python backend have none)
    config = make_models.torch_config("no_outputs", [("INPUT__0", "FP32", [16]),
                                                     ("INPUT__1", "FP32", [16])], [], 8)
    _copy_model(repo, "add_sub_torch", tmp_path / "no_outputs", config)
    with pytest.raises(ConfigError, match="model configuration must contain at least one output, "
                                          "none were specified"):
        _load(tmp_path, "no_outputs")


def test_parameters_are_logged_once_per_version_load_in_tritons_words(
        repo: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # L0_libtorch_inference_mode counts these lines: one per model version Triton loads
    io = [("INPUT__0", "FP32", [16]), ("INPUT__1", "FP32", [16])]
    config_text = make_models.torch_config(
        "modes", io, [("OUTPUT__0", "FP32", [16])], 8,
        'parameters { key: "INFERENCE_MODE" value: { string_value: "false" } }\n'
        'parameters { key: "ENABLE_WEIGHT_SHARING" value: { string_value: "true" } }\n')
    _copy_model(repo, "add_sub_torch", tmp_path / "modes", config_text)
    config, versions = read_model_config(tmp_path / "modes", "modes", backends=get_factory)
    with caplog.at_level(logging.INFO, logger="nursery.backends"):
        for index in (0, 1):  # two instances of one version load: one set of lines
            pytorch.FACTORY.load(config, tmp_path / "modes" / str(versions[-1]),
                                 InstancePlacement("modes", index, "cpu", 0)).close()
    lines = [r.getMessage() for r in caplog.records if "for model instance 'modes'" in r.getMessage()]
    assert lines == ["Optimized execution is enabled for model instance 'modes'",
                     "Cache Cleaning is disabled for model instance 'modes'",
                     "Inference Mode is disabled for model instance 'modes'",
                     "cuDNN is enabled for model instance 'modes'",
                     "Weight sharing is enabled for model instance 'modes'"]
