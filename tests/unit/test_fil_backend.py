"""The FIL backend without a server: Triton FIL's parameters, its default file names, the
checks of a config against a forest, and the one line a missing extra gives."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from nursery.backends import fil
from nursery.backends.base import get_factory
from nursery.config.model import read_model_config
from nursery.errors import ConfigError
from nursery.runtime.devices import InstancePlacement
from tests import forest_models as fm

CPU = InstancePlacement("g", 0, "cpu", 0)


def test_defaults_are_fils() -> None:
    options = fil.parse_options({}, "m")
    assert options.model_type == "xgboost"
    assert options.is_classifier is None
    assert options.predict_proba is False
    assert options.threshold == 0.5
    assert options.nthread == -1


def test_parameters_are_read() -> None:
    options = fil.parse_options({"model_type": "lightgbm", "is_classifier": "true",
                                 "predict_proba": "TRUE", "threshold": "0.3",
                                 "cpu_nthread": "2", "xgboost_allow_unknown_field": "false",
                                 "chunk_size": "4", "layout": "depth_first"}, "m")
    assert (options.model_type, options.is_classifier, options.predict_proba,
            options.threshold, options.nthread) == ("lightgbm", True, True, 0.3, 2)


def test_output_class_still_names_a_classifier(caplog: pytest.LogCaptureFixture) -> None:
    options = fil.parse_options({"output_class": "false", "is_classifier": "true",
                                 "storage_type": "AUTO", "threads_per_tree": "1"}, "m")
    assert options.is_classifier is False  # as FIL: the older name wins
    text = caplog.text
    assert "`output_class` parameter has been removed" in text
    assert "`storage_type` parameter has been removed" in text
    assert "`threads_per_tree` parameter has been removed" in text


@pytest.mark.parametrize(("params", "words"), [
    ({"model_type": "onnx"}, "onnx not recognized as a valid serialization format"),
    ({"predict_proba": "yes"}, "parameter predict_proba"),
    ({"threshold": "half"}, "parameter threshold"),
    ({"cpu_nthread": "1.5"}, "parameter cpu_nthread"),
])
def test_bad_parameters_name_model_and_parameter(params: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigError, match="model 'm'") as info:
        fil.parse_options(params, "m")
    assert words in str(info.value)


@pytest.mark.parametrize(("model_type", "filename"), list(fil.MODEL_FILES.items()))
def test_default_file_names(tmp_path: Path, model_type: str, filename: str) -> None:
    assert fil.model_path("", tmp_path, model_type) == tmp_path / filename
    assert fil.model_path("mine.bin", tmp_path, model_type) == tmp_path / "mine.bin"


def _read(repo: Path, name: str):  # type: ignore[no-untyped-def]
    return read_model_config(repo / name, name, backends=get_factory)[0]


def test_forest_loads_and_answers_like_lightgbm(tmp_path: Path) -> None:
    model = fm.lgb_binary()
    fm.write(tmp_path, "lgb", "model.txt", lambda p: model.booster_.save_model(str(p)),
             fm.fil_config("lgb", {"model_type": "lightgbm", "is_classifier": "true"}))
    config = _read(tmp_path, "lgb")
    instance = fil.FACTORY.load(config, tmp_path / "lgb" / "1", CPU)
    rows, _, _ = fm.data(rows=9, seed=3)
    out = instance.execute({"input__0": rows}, ["output__0"])["output__0"]
    assert out.shape == (9,)
    np.testing.assert_array_equal(out, model.predict(rows).astype(np.float32))
    instance.close()


def test_output_width_must_fit_the_forest(tmp_path: Path) -> None:
    model = fm.xgb_multiclass()
    fm.write(tmp_path, "m3", "xgboost.json", model.save_model,
             fm.fil_config("m3", {"model_type": "xgboost_json", "is_classifier": "true",
                                  "predict_proba": "true"}, width=2))
    config = _read(tmp_path, "m3")
    with pytest.raises(ConfigError, match="output 'output__0' 2 values per row") as info:
        fil.FACTORY.load(config, tmp_path / "m3" / "1", CPU)
    assert "xgboost.json" in str(info.value) and "3 class(es)" in str(info.value)


def test_missing_extra_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = fm.xgb_regressor()
    fm.write(tmp_path, "r", "xgboost.json", model.save_model,
             fm.fil_config("r", {"model_type": "xgboost_json", "is_classifier": "false"}))
    config = _read(tmp_path, "r")
    monkeypatch.setitem(sys.modules, "treelite", None)  # as if the extra were not installed
    with pytest.raises(ConfigError) as info:
        fil.FACTORY.load(config, tmp_path / "r" / "1", CPU)
    message = str(info.value)
    assert "\n" not in message
    assert "model 'r'" in message and "pip install 'nursery[fil]'" in message
