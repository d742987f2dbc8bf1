"""The OpenVINO backend without a server: Triton's OpenVINO parameters as OpenVINO
properties, their errors in Triton's words, and the one line a missing extra gives."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nursery.backends import openvino
from nursery.backends.base import get_factory
from nursery.config.model import read_model_config
from nursery.errors import ConfigError
from nursery.runtime.devices import InstancePlacement
from tests import openvino_models as ovm


def test_parameters_become_openvino_properties() -> None:
    options = openvino.parse_options({
        "NUM_STREAMS": "auto", "PERFORMANCE_HINT": "throughput", "INFERENCE_NUM_THREADS": "2",
        "COMPILATION_NUM_THREADS": "1", "HINT_BF16": "yes", "ENABLE_BATCH_PADDING": "YES",
        "RESHAPE_IO_LAYERS": "yes", "SKIP_OV_DYNAMIC_BATCHSIZE": "no"}, "m")
    assert options.properties == {
        "NUM_STREAMS": "AUTO", "PERFORMANCE_HINT": "THROUGHPUT", "INFERENCE_NUM_THREADS": "2",
        "COMPILATION_NUM_THREADS": "1", "INFERENCE_PRECISION_HINT": "bf16"}
    assert options.batch_padding and options.reshape_io_layers
    assert not options.skip_dynamic_batch
    assert options.target_device == "CPU"
    assert openvino.parse_options({"NUM_STREAMS": "3"}, "m").properties == {"NUM_STREAMS": "3"}


@pytest.mark.parametrize(("params", "words"), [
    ({"NUM_STREAMS": "lots"}, "'NUM_STREAMS' to be either AUTO/NUMA/<int_value>, got lots"),
    ({"PERFORMANCE_HINT": "fast"},
     "'PERFORMANCE_HINT' to be LATENCY/THROUGHPUT/CUMULATIVE_THROUGHPUT, got fast"),
    ({"INFERENCE_NUM_THREADS": "-1"}, "'INFERENCE_NUM_THREADS' to be a non-negative number"),
    ({"HINT_BF16": "no"}, "'HINT_BF16' to be YES, got no"),
])
def test_bad_parameters_in_tritons_words(params: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigError, match="model 'm'") as info:
        openvino.parse_options(params, "m")
    assert words in str(info.value)


def test_missing_extra_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ovm.write_model(tmp_path, "ov", ovm.ov_config("ov"))
    config = read_model_config(tmp_path / "ov", "ov", backends=get_factory)[0]
    assert config.default_model_filename == "model.xml"
    monkeypatch.setitem(sys.modules, "openvino", None)  # as if the extra were not installed
    with pytest.raises(ConfigError) as info:
        openvino.FACTORY.load(config, tmp_path / "ov" / "1", InstancePlacement("g", 0, "cpu", 0))
    message = str(info.value)
    assert "\n" not in message
    assert "model 'ov'" in message and "pip install 'nursery[openvino]'" in message


def test_gpu_instances_are_refused_as_triton_does(tmp_path: Path) -> None:
    ovm.write_model(tmp_path, "ov", ovm.ov_config("ov"))
    config = read_model_config(tmp_path / "ov", "ov", backends=get_factory)[0]
    with pytest.raises(ConfigError, match="supports only Kind CPU and AUTO"):
        openvino.FACTORY.load(config, tmp_path / "ov" / "1", InstancePlacement("g", 0, "gpu", 0))
