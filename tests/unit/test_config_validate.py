"""Triton's model-configuration rules and words (nursery/config/validate.py), and their place
in reading a model folder: a configuration error is reported before a missing version, as
Triton's repository manager validates before the model is created (L0_model_config)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from nursery.backends.base import get_factory
from nursery.config import pbtext
from nursery.config.model import read_model_config
from nursery.config.validate import validate_model_config, validate_model_io
from nursery.errors import ConfigError
from nursery.schema import inference as pb

IO = ("input [{name: 'input' data_type: TYPE_FP32 dims: [%s] %s}]\n"
      "output [{name: 'output' data_type: TYPE_FP32 dims: [%s] %s}]\n")


def _config(text: str, name: str = "m") -> pb.ModelConfig:
    proto = pbtext.parse(text, pb.ModelConfig())
    proto.name = name
    return proto


def _io(in_dims: str = "4", in_reshape: str = "", out_dims: str = "4", out_reshape: str = "",
        mbs: int = 8) -> str:
    return f"max_batch_size: {mbs}\n" + IO % (in_dims, in_reshape, out_dims, out_reshape)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (_io("0"), "model input 'input' dimension must be integer >= 1, or -1 to indicate a "
         "variable-size dimension for m"),
        (_io(out_dims="-2"), "model output 'output' dimension must be integer >= 1, or -1 to "
         "indicate a variable-size dimension for m"),
        (_io("2, 2", "reshape: {shape: [5]}"),
         "model input 'input' has different size for dims and reshape for m"),
        (_io(out_dims="4", out_reshape="reshape: {shape: [0]}"),
         "model output 'output' reshape dimensions must be integer >= 1, or -1 to indicate a "
         "variable-size dimension for m"),
        (_io("1", "reshape: {shape: []}", mbs=0),
         "model input 'input' cannot have empty reshape for non-batching model as scalar "
         "tensors are not supported for m"),
        (_io("2, -1, 3", "reshape: {shape: [2, -1, -1, 3]}"),
         "model input 'input' has different number of variable-size dimensions for dims and "
         "reshape for m"),
        (_io("2, -1, 3", "reshape: {shape: [3, -1, 2]}"),
         "model input 'input' has different size for dims and reshape for m"),
        ("max_batch_size: 8\ninput [{name: 'input' dims: [1]}]",
         "model input 'input' must specify 'data_type' for m"),
        ("input [{name: 'input' data_type: TYPE_FP32 format: FORMAT_NCHW dims: [1, 2]}]",
         "model input NHWC/NCHW require 3 dims for m"),
        (_io() + "batch_input [{kind: BATCH_ELEMENT_COUNT target_name: 'B' "
         "data_type: TYPE_FP32}]",
         "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 0 for m"),
        (_io() + "batch_input [{kind: BATCH_ITEM_SHAPE target_name: 'B' data_type: TYPE_FP32 "
         "source_input: ['nope']}]", "unknown source input name 'nope' for m"),
        (_io() + "batch_output [{kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: ['output', "
         "'output'] source_input: ['input']}]",
         "target output name 'output' can only be specified once for m"),
        (_io() + "batch_output [{kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: ['x'] "
         "source_input: ['input']}]", "unknown target output name 'x' for m"),
    ],
)
def test_io_rules_use_tritons_words(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate_model_io(_config(text), "model 'm': config.pbtxt")
    assert str(err.value) == f"model 'm': config.pbtxt: {message}"


@pytest.mark.parametrize(
    "text",
    [_io("2, 2", "reshape: {shape: [4]}"), _io("2, -1, 3", "reshape: {shape: [1, 2, -1, 3]}"),
     _io("1", "reshape: {shape: []}"), _io("-1")],
)
def test_io_rules_accept_what_triton_accepts(text: str) -> None:
    validate_model_io(_config(text))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("max_batch_size: -1", "'max_batch_size' must be non-negative value for m"),
        ("platform: 'onnxruntime_onnx' ensemble_scheduling {step [{model_name: 'a'}]}",
         "ensemble scheduling cannot be set for model 'm' whose platform is not ensemble"),
        ("platform: 'ensemble'",
         "ensemble scheduling must be set for ensemble m whose platform is ensemble"),
    ],
)
def test_model_rules_use_tritons_words(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match="^" + message.replace("'", ".") + "$"):
        validate_model_config(_config(text))


def test_a_config_error_comes_before_a_missing_version_without_auto_complete(
        tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.pbtxt").write_text(
        "platform: 'onnxruntime_onnx'\nmax_batch_size: 8\n"
        "dynamic_batching { priority_levels: 3 default_priority_level: 4 }\n"
        + IO % ("4", "", "4", ""))
    with pytest.raises(ConfigError, match=r"default priority level must be in range \[1, 3\]"):
        read_model_config(folder, "m", backends=get_factory, auto_complete=False)
    (folder / "config.pbtxt").write_text(
        "platform: 'onnxruntime_onnx'\nmax_batch_size: 8\n" + IO % ("2, 2", "reshape: "
                                                                    "{shape: [3]}", "4", ""))
    with pytest.raises(ConfigError, match="has different size for dims and reshape for m"):
        read_model_config(folder, "m", backends=get_factory, auto_complete=False)
    (folder / "config.pbtxt").write_text(
        "platform: 'onnxruntime_onnx'\nmax_batch_size: 8\n" + IO % ("4", "", "4", ""))
    with pytest.raises(ConfigError, match="no version to serve"):
        read_model_config(folder, "m", backends=get_factory, auto_complete=False)


def test_an_unknown_platform_beside_a_known_model_file_is_an_unexpected_pair(
        tmp_path: Path) -> None:
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes(b"")
    (folder / "config.pbtxt").write_text(
        "platform: 'onnxruntim'\ndefault_model_filename: 'model.onnx'\nmax_batch_size: 8\n"
        + IO % ("4", "", "4", ""))
    with pytest.raises(ConfigError, match="unexpected 'platform' and 'backend' pair, "
                       "got:onnxruntim, onnxruntime"):
        read_model_config(folder, "m", backends=get_factory, auto_complete=False)


@pytest.mark.parametrize(
    ("runtime", "message"),
    [("__invalid_runtime__", "unable to find backend library '__invalid_runtime__' for model 'm'"),
     ("../dummy_runtime/libtriton_identity.so",
      "backend library name '../dummy_runtime/libtriton_identity.so' escapes backend directory")],
)
def test_a_runtime_nursery_cannot_load_is_refused_in_tritons_words(
        tmp_path: Path, runtime: str, message: str) -> None:
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        f"backend: 'onnxruntime'\nruntime: '{runtime}'\nmax_batch_size: 8\n"
        + IO % ("4", "", "4", ""))
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        read_model_config(folder, "m", backends=get_factory, auto_complete=False)


def test_a_model_named_after_its_backend_gets_that_backend(tmp_path: Path) -> None:
    """Triton's custom-backend autofill: 'name.backend' with nothing else to go by."""
    for name, message in (("plain", "Invalid model name: Could not determine backend for model "
                                    "'plain' with no backend in model configuration. Expected "
                                    "model name of the form 'model.<backend_name>'."),
                          ("m.unknown", "unable to find backend library for backend 'unknown', "
                                        "try specifying runtime on the model configuration.")):
        folder = tmp_path / name
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text("max_batch_size: 8\n" + IO % ("4", "", "4", ""))
        with pytest.raises(ConfigError) as err:
            read_model_config(folder, name, backends=get_factory)
        assert message in str(err.value)


def test_ensemble_rules_come_before_versions_in_tritons_words(tmp_path: Path) -> None:
    cases = {
        "steps [": "must specify 'step' for ensemble 'e'",
        "step [{model_name: 'a' input_map {key: 'x' value: 'in'}}]":
            "must specify 'output_map' in step 0 of ensemble 'e'",
        "step [{model_name: 'a' input_map {key: 'x' value: 'in'} output_map {key: 'y' value: "
        "'t'}}, {model_name: 'b' input_map {key: 'x' value: 'in'} output_map {key: 'y' value: "
        "'t'}}]": "ensemble tensor 't' can appear in an output map only once for ensemble 'e' "
                  "step 1",
        "step [{model_name: 'a' input_map {key: 'x' value: 'in'} output_map {key: 'y' value: "
        "'other'}}]": "ensemble output 'out' for ensemble e' is not used",
        "step [{model_name: 'a' input_map {key: 'x' value: 'nowhere'} output_map {key: 'y' "
        "value: 'out'}}, {model_name: 'b' input_map {key: 'x' value: 'in'} output_map {key: 'y'"
        " value: 'spare'}}]": "output 'out' for ensemble 'e' is not written: at least one of "
                              "its depending tensors, 'nowhere', is not connected",
        "step [{model_name: 'a' input_map {key: 'x' value: 'in'} output_map [{key: 'y' value: "
        "'out'}, {key: 'z' value: 'spare'}]}]": "ensemble tensor 'spare' is unused in ensemble 'e'",
    }
    folder = tmp_path / "e"
    folder.mkdir()
    for steps, message in cases.items():
        body = "" if steps == "steps [" else steps
        (folder / "config.pbtxt").write_text(
            "platform: 'ensemble'\nmax_batch_size: 8\n"
            f"ensemble_scheduling {{ {body} }}\n" + IO.replace("'input'", "'in'").replace(
                "'output'", "'out'") % ("4", "", "4", ""))
        with pytest.raises(ConfigError) as err:
            read_model_config(folder, "e", backends=get_factory)
        assert message in str(err.value), steps


@pytest.mark.parametrize(
    ("control", "message"),
    [("{}", "metric control must specify 'metric_identifier'"),
     ("{metric_identifier {family: ''} histogram_options {buckets: [1]}}",
      "metric identifier must specify non-empty 'family'"),
     ("{metric_identifier {family: 'f'}}", "metric control must specify 'histogram_options'"),
     ("{metric_identifier {family: 'f'} histogram_options {}}",
      "histogram options must specify non-empty 'buckets'")],
)
def test_model_metrics_rules_use_tritons_words(control: str, message: str) -> None:
    text = f"model_metrics {{ metric_control [{control}] }}"
    with pytest.raises(ConfigError, match="^" + message + "$"):
        validate_model_config(_config(text))


def test_an_unknown_metric_family_is_a_warning_in_tritons_words(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        "platform: 'onnxruntime_onnx'\nmax_batch_size: 8\n" + IO % ("4", "", "4", "")
        + "model_metrics { metric_control [{metric_identifier {family: "
          "'nv_inference_request_success'} histogram_options {buckets: [1, 2]}}] }")
    read_model_config(folder, "m", backends=get_factory, auto_complete=False)
    assert ("Metric family 'nv_inference_request_success' in 'metric_identifier' is not a "
            "customizable metric in Triton core.") in caplog.text


def test_libtorch_found_by_its_file_keeps_no_default_model_filename(tmp_path: Path) -> None:
    """As Triton's autofill: a backend found from model.pt gets its platform and no
    default_model_filename; a config naming backend 'pytorch' gets both."""
    for name, first_line, filename in (("found", "", ""),
                                       ("named", "backend: 'pytorch'\n", "model.pt")):
        folder = tmp_path / name
        (folder / "1").mkdir(parents=True)
        (folder / "1" / "model.pt").write_bytes(b"")
        (folder / "config.pbtxt").write_text(first_line + "max_batch_size: 8\n"
                                             + IO % ("4", "", "4", ""))
        config, _ = read_model_config(folder, name, backends=get_factory, auto_complete=False)
        assert (config.platform, config.default_model_filename) == ("pytorch_libtorch", filename)
        assert config.model_filename() == "model.pt"


def _model(tmp_path: Path, name: str, text: str):
    folder = tmp_path / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(text)
    config, _ = read_model_config(folder, name, backends=get_factory, auto_complete=False)
    return config


def test_ensemble_wiring_uses_tritons_words(tmp_path: Path) -> None:
    """ValidateEnsembleConfig / ValidateTensorMapping, checked against the steps' configs."""
    from nursery.config.ensemble_check import check_wiring

    step = _model(tmp_path, "m", "platform: 'onnxruntime_onnx'\nmax_batch_size: 2\n"
                  "input [{name: 'IN' data_type: TYPE_INT32 dims: [1]}]\n"
                  "output [{name: 'OUT' data_type: TYPE_INT32 dims: [1]}]\n")
    cases = {
        (4, "IN", "OUT", "TYPE_INT32"): "ensemble e allows maximum batch size 4, but it contains "
                                        "model m which only allows maximum batch size to be 2",
        (2, "NOPE", "OUT", "TYPE_INT32"): "in ensemble e, ensemble tensor x is mapping to "
                                          "non-existing input NOPE in model m",
        (2, "IN", "NOPE", "TYPE_INT32"): "in ensemble e, ensemble tensor y is mapped from "
                                         "non-existing output NOPE in model m",
        (2, "IN", "OUT", "TYPE_FP32"): "in ensemble e, ensemble tensor x: inconsistent data "
                                       "type: TYPE_FP32 is inferred from model e while "
                                       "TYPE_INT32 is inferred from model m",
    }
    for i, ((batch, model_in, model_out, dtype), message) in enumerate(cases.items()):
        ensemble = _model(tmp_path / str(i), "e", (
            f"platform: 'ensemble'\nmax_batch_size: {batch}\n"
            f"input [{{name: 'x' data_type: {dtype} dims: [1]}}]\n"
            "output [{name: 'y' data_type: TYPE_INT32 dims: [1]}]\n"
            f"ensemble_scheduling {{ step [{{model_name: 'm' input_map {{key: '{model_in}' "
            f"value: 'x'}} output_map {{key: '{model_out}' value: 'y'}}}}] }}\n"))
        with pytest.raises(ConfigError) as err:
            check_wiring(ensemble, [step])
        assert str(err.value).startswith(message), err.value


def test_ensemble_tensor_shapes_must_agree_in_tritons_words(tmp_path: Path) -> None:
    """ValidateTensorConsistency: an ensemble tensor's shape, as each model sees it, must match
    up to -1 dims, as configured or with the batch dim prepended (L0_model_config's
    inconsistent_shape); a batching model's [16] meets a non-batching one's [-1, 16]."""
    from nursery.config.ensemble_check import check_wiring

    def step(name: str, batch: int, in_dims: str, out_dims: str):
        return _model(tmp_path, name, f"platform: 'onnxruntime_onnx'\nmax_batch_size: {batch}\n"
                      f"input [{{name: 'IN' data_type: TYPE_FP32 dims: [{in_dims}]}}]\n"
                      f"output [{{name: 'OUT' data_type: TYPE_FP32 dims: [{out_dims}]}}]\n")

    def ensemble(folder: str, batch: int, dims: str, out_dims: str, models: list[str]):
        tensors = ["data", *(f"t{i}" for i in range(len(models) - 1)), "prob"]
        steps = ", ".join(f"{{model_name: '{m}' input_map {{key: 'IN' value: '{tensors[i]}'}} "
                          f"output_map {{key: 'OUT' value: '{tensors[i + 1]}'}}}}"
                          for i, m in enumerate(models))
        return _model(tmp_path / folder, "e", (
            f"platform: 'ensemble'\nmax_batch_size: {batch}\n"
            f"input [{{name: 'data' data_type: TYPE_FP32 dims: [{dims}]}}]\n"
            f"output [{{name: 'prob' data_type: TYPE_FP32 dims: [{out_dims}]}}]\n"
            f"ensemble_scheduling {{ step [{steps}] }}\n"))

    dim1, dim3 = step("dim1", 4, "16", "16"), step("dim3", 4, "16, 16, 16", "16, 16, 16")
    flat, var = step("flat", 0, "-1, 16", "-1, 16"), step("var", 4, "-1", "-1")
    with pytest.raises(ConfigError, match=re.escape(
            "in ensemble e, ensemble tensor t0: inconsistent shape: [-1,16] is inferred from "
            "model dim1 while [-1,16,16,16] is inferred from model dim3")):
        check_wiring(ensemble("a", 2, "16", "16", ["dim1", "dim3"]), [dim1, dim3])
    with pytest.raises(ConfigError, match=re.escape(
            "in ensemble e, ensemble tensor data: inconsistent shape: [-1,8] is inferred from "
            "model e while [-1,16] is inferred from model dim1")):
        check_wiring(ensemble("b", 2, "8", "16", ["dim1"]), [dim1])
    # a batching model beside a non-batching one, and variable dims, are consistent
    assert check_wiring(ensemble("c", 2, "16", "16", ["dim1", "flat", "dim1"]),
                        [dim1, flat, dim1]) is False
    assert check_wiring(ensemble("d", 0, "-1, 16", "-1, 16", ["flat", "dim1"]),
                        [flat, dim1]) is False
    assert check_wiring(ensemble("f", 2, "16", "-1", ["dim1", "var"]), [dim1, var]) is False
