"""Config dims and datatypes against the ONNX model's declared ones, at load: Triton's ORT
backend (onnxruntime_backend ``ValidateInputs`` / ``ValidateOutputs`` /
``CompareDimsSupported``), its checks and words."""

from __future__ import annotations

from pathlib import Path

import pytest

from nursery.backends.base import get_factory
from nursery.backends.onnxruntime import FACTORY, check_dims
from nursery.config.model import read_model_config
from nursery.errors import ConfigError
from nursery.runtime.devices import InstancePlacement
from tests.conftest import make_models

BATCH_WORDS = ("(an initial batch dimension because max_batch_size > 0 followed by the explicit "
               "tensor shape, making complete shape ")


@pytest.mark.parametrize(("model", "dims", "batch", "exact"), [
    ([-1, 4], [4], 8, False), ([-1, 4], [4], 8, True), ([-1, -1], [7], 8, False),
    ([-1, -1], [-1], 8, True), ([2, 3], [2, 3], 0, True), ([-1, 3], [5, 3], 0, False),
    ([], [1], 0, False), ([], [], 0, True), ([], [1, 1], 4, False),
])
def test_dims_the_model_accepts(model: list[int], dims: list[int], batch: int, exact: bool) -> None:
    assert check_dims("m", "T", model, dims, batch, exact=exact) is None


def test_an_input_may_narrow_a_variable_dimension_an_output_may_not() -> None:
    assert check_dims("m", "IN", [-1, -1], [7], 8, exact=False) is None
    assert check_dims("m", "OUT", [-1, -1], [7], 8, exact=True) == (
        "model 'm', tensor 'OUT': the model expects 2 dimensions (shape [-1,-1]) but the model "
        "configuration specifies 2 dimensions " + BATCH_WORDS + "[-1,7])")


def test_wrong_rank_and_size_with_batching() -> None:
    assert check_dims("m", "X", [-1, 16], [8], 8, exact=False) == (
        "model 'm', tensor 'X': the model expects 2 dimensions (shape [-1,16]) but the model "
        "configuration specifies 2 dimensions " + BATCH_WORDS + "[-1,8])")
    assert check_dims("m", "X", [-1, 16], [4, 4], 8, exact=False) == (
        "model 'm', tensor 'X': the model expects 2 dimensions (shape [-1,16]) but the model "
        "configuration specifies 3 dimensions " + BATCH_WORDS + "[-1,4,4])")


def test_batching_needs_a_variable_first_dimension() -> None:
    assert check_dims("m", "X", [2, 16], [16], 8, exact=False) == (
        "model 'm', tensor 'X': for the model to support batching the shape should have at "
        "least 1 dimension and the first dimension must be -1; but shape expected by the "
        "model is [2,16]")


def test_without_batching() -> None:
    assert check_dims("m", "X", [2, 3], [3, 2], 0, exact=False) == (
        "model 'm', tensor 'X': the model expects 2 dimensions (shape [2,3]) but the model "
        "configuration specifies 2 dimensions (shape [3,2])")


def test_scalars_and_ragged_inputs() -> None:
    assert check_dims("m", "S", [], [2], 0, exact=True) == (
        "unable to load model 'm', scalar tensor 'S', should only provide 1 in the model "
        "configuration when the model doesn't support batching. Model configuration "
        "provided: [2].")
    assert check_dims("m", "R", [-1], [1], 8, exact=False, ragged=True) is None
    assert check_dims("m", "R", [-1, 2], [2], 8, exact=False, ragged=True) == (
        "unable to load model 'm', configuration expects model provides input with shape [-1]  "
        "for ragged input 'R', model provides [-1,2]")


def _load(tmp_path: Path, config: str) -> None:
    """A model made the scripts/make_models.py way (identity, INPUT0 [batch, 16] FP32), loaded
    as the model manager loads it."""
    make_models.write_model(tmp_path, "m", make_models.build_identity("FP32", ["batch", 16]),
                            config)
    proto_config, _ = read_model_config(tmp_path / "m", "m", backends=get_factory)
    instance = FACTORY.load(proto_config, tmp_path / "m" / "1", InstancePlacement("m_0", 0, "cpu", 0))
    instance.close()


def _config(in_dims: str, out_dims: str, in_type: str = "TYPE_FP32",
            out_type: str = "TYPE_FP32", batch: int = 8) -> str:
    return (f'name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {batch}\n'
            f'input [{{ name: "INPUT0" data_type: {in_type} dims: {in_dims} }}]\n'
            f'output [{{ name: "OUTPUT0" data_type: {out_type} dims: {out_dims} }}]\n')


def test_a_matching_config_loads(tmp_path: Path) -> None:
    _load(tmp_path, _config("[16]", "[16]"))


def test_contradicting_dims_are_refused_at_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        _load(tmp_path, _config("[8]", "[16]"))
    assert refused.value.message == (
        "model 'm', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,16]) but the "
        "model configuration specifies 2 dimensions " + BATCH_WORDS + "[-1,8])")
    with pytest.raises(ConfigError, match="tensor 'OUTPUT0': the model expects 2 dimensions"):
        _load(tmp_path, _config("[16]", "[4, 4]"))


def test_a_model_without_a_batch_dimension_refuses_batching(tmp_path: Path) -> None:
    make_models.write_model(tmp_path, "m", make_models.build_identity("FP32", [2, 16]),
                            _config("[16]", "[16]", batch=0))
    proto_config, _ = read_model_config(tmp_path / "m", "m", backends=get_factory)
    with pytest.raises(ConfigError, match=r"expects 2 dimensions \(shape \[2,16\]\) but the "
                                          r"model configuration specifies 1 dimensions"):
        FACTORY.load(proto_config, tmp_path / "m" / "1", InstancePlacement("m_0", 0, "cpu", 0))


def test_contradicting_datatypes_are_refused_at_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        _load(tmp_path, _config("[16]", "[16]", in_type="TYPE_INT32"))
    assert refused.value.message == (
        "unable to load model 'm', configuration expects datatype TYPE_INT32 for input "
        "'INPUT0', model provides TYPE_FP32")
    with pytest.raises(ConfigError, match="configuration expects datatype TYPE_STRING for "
                                          "output 'OUTPUT0', model provides TYPE_FP32"):
        _load(tmp_path, _config("[16]", "[16]", out_type="TYPE_STRING"))


def test_the_input_count_is_checked_before_the_names(tmp_path: Path) -> None:
    """Triton's ORT backend compares the number of inputs first: a config with an input the
    model lacks, beside all the model's, is refused for its count (L0_model_config's
    too_many_inputs); with the counts equal, the unknown name is named."""
    extra = ('input [{ name: "INPUT_EXTRA" data_type: TYPE_FP32 dims: [16] }]\n')
    with pytest.raises(ConfigError) as refused:
        _load(tmp_path, _config("[16]", "[16]") + extra)
    assert refused.value.message == (
        "unable to load model 'm', configuration expects 2 inputs, model provides 1")
    renamed = _config("[16]", "[16]").replace('"INPUT0"', '"INPUT_OTHER"')
    with pytest.raises(ConfigError, match="unexpected inference input 'INPUT_OTHER', allowed "
                                          "inputs are: INPUT0"):
        _load(tmp_path / "b", renamed)


def test_an_initializer_listed_as_an_input_is_an_optional_input(tmp_path: Path) -> None:
    """Triton's L0_initializer_as_input: an initializer the graph also lists as an input is
    an input a request may give (the model then uses it) or leave out (the stored value); the
    config marks it optional, and Triton's input count leaves optional inputs out."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    ones = np.ones((5, 5), np.float32)
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT", "INITIALIZER"], ["OUTPUT"])], "init_input",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [5, 5])
         for n in ("INPUT", "INITIALIZER")],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, [5, 5])],
        initializer=[numpy_helper.from_array(ones, "INITIALIZER")])
    (tmp_path / "m" / "1").mkdir(parents=True)
    onnx.save(helper.make_model(graph), str(tmp_path / "m" / "1" / "model.onnx"))
    io = ('input [{ name: "INPUT" data_type: TYPE_FP32 dims: [5, 5] }, { name: "INITIALIZER" '
          'data_type: TYPE_FP32 dims: [5, 5] optional: true }]\n'
          'output [{ name: "OUTPUT" data_type: TYPE_FP32 dims: [5, 5] }]\n')
    (tmp_path / "m" / "config.pbtxt").write_text('backend: "onnxruntime"\n' + io)
    config, _ = read_model_config(tmp_path / "m", "m", backends=get_factory)
    instance = FACTORY.load(config, tmp_path / "m" / "1", InstancePlacement("m_0", 0, "cpu", 0))
    try:
        x = np.full((5, 5), 2, np.float32)
        np.testing.assert_array_equal(instance.execute({"INPUT": x}, ["OUTPUT"])["OUTPUT"], x + 1)
        np.testing.assert_array_equal(
            instance.execute({"INPUT": x, "INITIALIZER": x}, ["OUTPUT"])["OUTPUT"], x + x)
    finally:
        instance.close()
    # without `optional` it counts, as in Triton: 2 inputs expected, the graph's 1 provided
    (tmp_path / "m" / "config.pbtxt").write_text(
        'backend: "onnxruntime"\n' + io.replace(" optional: true", ""))
    config, _ = read_model_config(tmp_path / "m", "m", backends=get_factory)
    with pytest.raises(ConfigError, match="configuration expects 2 inputs, model provides 1"):
        FACTORY.load(config, tmp_path / "m" / "1", InstancePlacement("m_0", 0, "cpu", 0))
