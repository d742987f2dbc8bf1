"""--backend-config as Triton reads it: the malformed forms refused in its words, global
settings under each backend's own, and default-max-batch-size in the backends' auto-complete
(Triton's L0_backend_config)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from nursery.backends.base import Backends
from nursery.config.model import read_model_config
from nursery.errors import ConfigError
from nursery.settings import FlagError, settings_from_args
from tests.conftest import make_models


@pytest.mark.parametrize(("arg", "words"), [
    (",default-max-batch-size=3", "No backend specified. --backend-config option format is "
                                  "<backend name>,<setting>=<value> or <setting>=<value>. Got "
                                  ",default-max-batch-size=3"),
    ("default-max-batch-size=", "--backend-config option format is '<backend "
                                "name>,<setting>=<value>'. Got default-max-batch-size="),
    ("default-max-batch-size", "--backend-config option format is '<backend "
                               "name>,<setting>=<value>'. Got default-max-batch-size"),
])
def test_malformed_settings_are_refused_in_tritons_words(arg: str, words: str) -> None:
    with pytest.raises(FlagError) as err:
        settings_from_args([f"--backend-config={arg}"], raise_errors=True)
    assert words in str(err.value)


def test_global_settings_give_way_to_a_backends_own() -> None:
    settings = settings_from_args(["--backend-config=default-max-batch-size=7",
                                   "--backend-config=onnxruntime,default-max-batch-size=8",
                                   "--backend-config=a=1"])
    assert settings.backend_config == (("", "default-max-batch-size", "7"),
                                       ("onnxruntime", "default-max-batch-size", "8"),
                                       ("", "a", "1"))
    backends = Backends(settings={"": {"default-max-batch-size": "7", "a": "1"},
                                  "onnxruntime": {"default-max-batch-size": "8"}})
    assert backends.resolved("onnxruntime") == {"default-max-batch-size": "8", "a": "1"}
    assert backends.resolved("openvino") == {"default-max-batch-size": "7", "a": "1"}
    assert Backends().resolved("fil") == {"default-max-batch-size": "4"}  # Triton's default


def _no_config_model(repo: Path) -> Path:
    import onnx

    folder = repo / "no_config"
    (folder / "1").mkdir(parents=True)
    onnx.save_model(make_models.build_add_sub(), str(folder / "1" / "model.onnx"))
    return folder


@pytest.mark.parametrize(("size", "batching"), [("5", True), ("0", False), (None, True)])
def test_auto_complete_takes_the_default_max_batch_size(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, size: str | None,
        batching: bool) -> None:
    folder = _no_config_model(tmp_path)
    settings = {"onnxruntime": {"default-max-batch-size": size}} if size is not None else {}
    with caplog.at_level(logging.DEBUG, logger="nursery.backends"):
        config, _ = read_model_config(folder, "no_config", backends=Backends(settings=settings))
    expected = int(size) if size is not None else 4
    assert config.max_batch_size == expected
    assert (config.scheduler == "dynamic") is batching
    # without batching the model's own batch dimension stays in the dims
    assert config.inputs[0].dims == ((16,) if batching else (-1, 16))
    logged = "\n".join(r.getMessage() for r in caplog.records)
    if size is None:
        assert "Adding default backend config setting: default-max-batch-size,4" in logged
    else:
        assert f"Found overwritten default setting: default-max-batch-size,{size}" in logged
    shown = logged.split("backend configuration:\n", 1)[1].splitlines()[0]
    assert json.loads(shown)["cmdline"]["default-max-batch-size"] == str(expected)


def test_a_bad_default_max_batch_size_fails_the_model(tmp_path: Path) -> None:
    folder = _no_config_model(tmp_path)
    backends = Backends(settings={"": {"default-max-batch-size": "many"}})
    with pytest.raises(ConfigError, match="default-max-batch-size: a non-negative integer, "
                                          "not 'many'"):
        read_model_config(folder, "no_config", backends=backends)
