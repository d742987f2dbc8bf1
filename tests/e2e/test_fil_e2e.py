"""Forest models (``backend: "fil"``) served end to end: XGBoost (JSON, UBJSON), LightGBM and a
scikit-learn forest (Treelite checkpoint), trained in the test run, each asked over HTTP and
gRPC with tritonclient and compared with the training library's own ``predict`` /
``predict_proba`` on the same rows (NaN rows included); Triton FIL's output shapes, dynamic
batching over two instances, auto-complete, and broken models failing alone with a reason that
names the model, the file and the cause."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests import forest_models as fm
from tests.conftest import ServerProcess, running_server

pytestmark = pytest.mark.e2e
Http = httpclient.InferenceServerClient
Grpc = grpcclient.InferenceServerClient


def _write_broken(repo: Path) -> None:
    xb = fm.xgb_binary(n_estimators=3)
    params = {"model_type": "xgboost_json", "is_classifier": "true"}
    fm.write(repo, "bad_corrupt", "xgboost.json",
             lambda p: p.write_bytes(b'{"learner": {"gradient_booster": tru'),
             fm.fil_config("bad_corrupt", params))
    fm.write(repo, "bad_type", "model.txt",  # XGBoost JSON named as LightGBM
             lambda p: p.write_bytes(bytes(xb.get_booster().save_raw("json"))),
             fm.fil_config("bad_type", {"model_type": "lightgbm", "is_classifier": "true"}))
    fm.write(repo, "bad_features", "xgboost.json", xb.save_model,
             fm.fil_config("bad_features", params, features=fm.FEATURES + 1))
    fm.write(repo, "bad_model_type", "xgboost.json", xb.save_model,
             fm.fil_config("bad_model_type", {"model_type": "catboost"}))


@pytest.fixture(scope="module")
def fil_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, dict[str, Any]]]:
    repo = tmp_path_factory.mktemp("fil_repo")
    models = fm.write_all(repo)
    _write_broken(repo)
    with running_server(repo, "--exit-on-error=false", "--strict-readiness=false",
                        tmp_path_factory=tmp_path_factory) as proc:
        yield proc, models


@pytest.fixture(scope="module")
def http(fil_server: tuple[ServerProcess, dict[str, Any]]) -> Iterator[Http]:
    client = httpclient.InferenceServerClient(fil_server[0].url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(fil_server: tuple[ServerProcess, dict[str, Any]]) -> Iterator[Grpc]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{fil_server[0].grpc_port}")
    yield client
    client.close()


def _rows(nan: bool = False) -> np.ndarray:
    x, _, _ = fm.data(rows=40, seed=7)
    if nan:
        x[::3, 0] = np.nan
        x[1::4, 2] = np.nan
    return x


def _infer(client: Http | Grpc, model: str, rows: np.ndarray) -> np.ndarray:
    module = httpclient if isinstance(client, Http) else grpcclient
    inp = module.InferInput("input__0", list(rows.shape), "FP32")
    inp.set_data_from_numpy(rows)
    result = client.infer(model, [inp])
    out = result.as_numpy("output__0")
    assert out is not None
    return out


CASES = [
    # model, estimator key, what the library answers
    ("xgb_binary", "xgb_binary", "proba"),
    ("xgb_binary_class", "xgb_binary", "predict"),
    ("xgb_multi", "xgb_multi", "proba"),
    ("xgb_multi_class", "xgb_multi", "predict"),
    ("xgb_regressor", "xgb_regressor", "predict"),
    ("lgb_binary", "lgb_binary", "proba"),
    ("lgb_regressor", "lgb_regressor", "predict"),
    ("sklearn_forest", "sklearn_forest", "proba"),
    ("xgb_auto", "xgb_multi", "proba"),
]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(("model", "key", "method"), CASES)
def test_matches_library(fil_server: tuple[ServerProcess, dict[str, Any]], http: Http,
                         grpc: Grpc, protocol: str, model: str, key: str, method: str) -> None:
    estimator = fil_server[1][key]
    client = http if protocol == "http" else grpc
    for nan in (False, True):  # NaN: a missing value, routed as the library routes it
        rows = _rows(nan)
        got = _infer(client, model, rows)
        want = (estimator.predict_proba(rows) if method == "proba"
                else estimator.predict(rows)).astype(np.float32)
        if want.ndim == 2 and want.shape[1] == 1:
            want = want.reshape(-1)
        assert got.dtype == np.float32
        assert got.shape == want.shape  # FIL's shapes: [batch] for dims [1], else [batch, k]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_threshold_decides_binary_class(fil_server: tuple[ServerProcess, dict[str, Any]],
                                        http: Http) -> None:
    rows = _rows()
    got = _infer(http, "xgb_binary_class", rows)
    proba = fil_server[1]["xgb_binary"].predict_proba(rows)[:, 1]
    np.testing.assert_array_equal(got, (proba > 0.5).astype(np.float32))


def test_auto_complete_fills_io_from_the_forest(http: Http) -> None:
    config = http.get_model_config("xgb_auto")
    assert config["input"][0]["name"] == "input__0"
    assert config["input"][0]["dims"] == [fm.FEATURES]
    assert config["output"][0]["dims"] == [3]  # three classes, predict_proba
    assert config["max_batch_size"] == 64
    meta = http.get_model_metadata("xgb_binary")
    assert meta["platform"] == "fil"
    assert meta["inputs"][0]["shape"] == [-1, fm.FEATURES]


def test_dynamic_batching_over_two_instances(fil_server: tuple[ServerProcess, dict[str, Any]],
                                             grpc: Grpc) -> None:
    x, _, _ = fm.data(rows=64, seed=11)
    want = fil_server[1]["xgb_binary"].predict_proba(x).astype(np.float32)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: _infer(grpc, "xgb_binary", x[i:i + 1]), range(64)))
    np.testing.assert_allclose(np.concatenate(answers), want, rtol=1e-5, atol=1e-5)
    stats = grpc.get_inference_statistics("xgb_binary", as_json=True)["model_stats"][0]
    assert int(stats["inference_count"]) >= 64


def test_wrong_feature_count_is_refused(http: Http) -> None:
    rows = np.zeros((2, fm.FEATURES - 1), dtype=np.float32)
    with pytest.raises(InferenceServerException, match="input__0"):
        _infer(http, "xgb_regressor", rows)


@pytest.mark.parametrize(("model", "words"), [
    ("bad_corrupt", ["bad_corrupt", "xgboost.json", "xgboost_json"]),
    ("bad_type", ["bad_type", "model.txt", "lightgbm", "LightGBM"]),
    ("bad_features", ["bad_features", "xgboost.json", f"{fm.FEATURES + 1} features",
                      f"has {fm.FEATURES}"]),
    ("bad_model_type", ["bad_model_type", "catboost", "not recognized"]),
])
def test_broken_forest_fails_alone(http: Http, model: str, words: list[str]) -> None:
    index = {m["name"]: m for m in http.get_model_repository_index()}
    assert index[model]["state"] == "UNAVAILABLE"
    for word in words:
        assert word in index[model]["reason"], index[model]["reason"]
    assert not http.is_model_ready(model)
    assert http.is_model_ready("xgb_binary")
    assert _infer(http, "xgb_regressor", _rows()).shape == (40,)
