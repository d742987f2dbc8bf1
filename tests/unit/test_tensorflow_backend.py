"""The TensorFlow backend's configuration without a server: Triton's TensorFlow parameters,
the platform and default file a ``backend: "tensorflow"`` config gets, and the one line a
missing extra gives."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nursery.backends import tensorflow
from nursery.backends.base import get_factory
from nursery.config.model import read_model_config
from nursery.errors import ConfigError
from nursery.runtime.devices import InstancePlacement


def test_parameters_are_read() -> None:
    options = tensorflow.parse_options({
        "TF_NUM_INTRA_THREADS": "2", "TF_NUM_INTER_THREADS": "1",
        "TF_USE_PER_SESSION_THREADS": "On", "TF_GRAPH_TAG": "serve1",
        "TF_SIGNATURE_DEF": "serving2", "MAX_SESSION_SHARE_COUNT": "3"}, "m")
    assert (options.intra_threads, options.inter_threads, options.per_session_threads,
            options.graph_tag, options.signature_def, options.share_count) == (
        2, 1, True, "serve1", "serving2", 3)
    assert tensorflow.parse_options({}, "m") == tensorflow.TfOptions()


def test_bad_number_names_model_and_parameter() -> None:
    with pytest.raises(ConfigError, match="model 'm'.*TF_NUM_INTRA_THREADS"):
        tensorflow.parse_options({"TF_NUM_INTRA_THREADS": "two"}, "m")


def _folder(tmp_path: Path, config: str, filename: str) -> Path:
    (tmp_path / "m" / "1" / filename).mkdir(parents=True)
    (tmp_path / "m" / "config.pbtxt").write_text(config)
    return tmp_path / "m"


IO = ('max_batch_size: 8\ninput [{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }]\n'
      'output [{ name: "y" data_type: TYPE_FP32 dims: [ 3 ] }]\n')


@pytest.mark.parametrize(("config", "filename", "platform", "default"), [
    ('backend: "tensorflow"\n', "model.savedmodel", "tensorflow_savedmodel", "model.savedmodel"),
    ('backend: "tensorflow"\n', "model.graphdef", "tensorflow_graphdef", "model.graphdef"),
    ('platform: "tensorflow_graphdef"\n', "model.graphdef", "tensorflow_graphdef",
     "model.graphdef"),
    ("", "model.savedmodel", "tensorflow_savedmodel", "model.savedmodel"),
    ("", "model.graphdef", "tensorflow_graphdef", "model.graphdef"),
])
def test_platform_and_default_file_as_triton_fills_them(
        tmp_path: Path, config: str, filename: str, platform: str, default: str) -> None:
    folder = _folder(tmp_path, config + IO, filename)
    # auto-complete off: the folders are empty, only the names are looked at
    model = read_model_config(folder, "m", backends=get_factory, auto_complete=False)[0]
    assert (model.backend, model.platform, model.default_model_filename) == (
        "tensorflow", platform, default)


def test_missing_extra_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _folder(tmp_path, 'platform: "tensorflow_savedmodel"\n' + IO, "model.savedmodel")
    config = read_model_config(folder, "m", backends=get_factory, auto_complete=False)[0]
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # as if the extra were not installed
    with pytest.raises(ConfigError) as info:
        tensorflow.FACTORY.load(config, folder / "1", InstancePlacement("g", 0, "cpu", 0))
    message = str(info.value)
    assert "\n" not in message
    assert "model 'm'" in message and "pip install 'nursery[tensorflow]'" in message


def test_init_ops_file_is_refused_with_its_reason(tmp_path: Path) -> None:
    folder = _folder(tmp_path, 'platform: "tensorflow_graphdef"\n' + IO +
                     'parameters { key: "TF_INIT_OPS_FILE" value: { string_value: "i.json" } }\n',
                     "model.graphdef")
    config = read_model_config(folder, "m", backends=get_factory, auto_complete=False)[0]
    with pytest.raises(ConfigError, match="TF_INIT_OPS_FILE is not supported"):
        tensorflow.FACTORY.load(config, folder / "1", InstancePlacement("g", 0, "cpu", 0))
