"""Small real forests for the FIL backend's tests, trained in the test run: XGBoost (JSON and
UBJSON), LightGBM (text) and scikit-learn (a Treelite checkpoint), each written into a model
repository with Triton FIL's ``config.pbtxt``. Each builder returns the fitted estimator, so a
test compares the server's answers with the library's own ``predict`` / ``predict_proba``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

FEATURES = 6


def data(rows: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of FEATURES FP32 features, a binary label and a three-class label."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    binary = (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype(np.int32)
    three = (x[:, 0] > 0).astype(np.int32) + (x[:, 3] > 0.5).astype(np.int32)
    return x, binary, three


def fil_config(name: str, params: dict[str, str], *, features: int | None = FEATURES,
               width: int | None = 1, max_batch_size: int = 64, extra: str = "") -> str:
    """Triton FIL's config.pbtxt; ``features`` / ``width`` None leave input / output out."""
    lines = [f'name: "{name}"', 'backend: "fil"', f"max_batch_size: {max_batch_size}"]
    if features is not None:
        lines.append(f'input [{{ name: "input__0" data_type: TYPE_FP32 dims: [ {features} ] }}]')
    if width is not None:
        lines.append(f'output [{{ name: "output__0" data_type: TYPE_FP32 dims: [ {width} ] }}]')
    for key, value in params.items():
        lines.append(f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}')
    lines.append(extra)
    return "\n".join(lines) + "\n"


def write(repo: Path, name: str, filename: str, write_file: Any, config: str) -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    write_file(folder / "1" / filename)
    (folder / "config.pbtxt").write_text(config)
    return folder


def xgb_binary(n_estimators: int = 12) -> Any:
    import xgboost as xgb

    x, y, _ = data()
    return xgb.XGBClassifier(n_estimators=n_estimators, max_depth=3, n_jobs=1).fit(x, y)


def xgb_multiclass() -> Any:
    import xgboost as xgb

    x, _, y = data()
    return xgb.XGBClassifier(n_estimators=8, max_depth=3, n_jobs=1).fit(x, y)


def xgb_regressor() -> Any:
    import xgboost as xgb

    x, _, _ = data()
    return xgb.XGBRegressor(n_estimators=10, max_depth=3, n_jobs=1).fit(x, x[:, 0] * 2 + x[:, 1])


def lgb_binary() -> Any:
    import lightgbm as lgb

    x, y, _ = data()
    return lgb.LGBMClassifier(n_estimators=10, num_leaves=8, verbose=-1, n_jobs=1).fit(x, y)


def lgb_regressor() -> Any:
    import lightgbm as lgb

    x, _, _ = data()
    return lgb.LGBMRegressor(n_estimators=10, num_leaves=8, verbose=-1, n_jobs=1).fit(
        x, x[:, 0] * 2 + x[:, 1])


def sklearn_forest() -> Any:
    from sklearn.ensemble import RandomForestClassifier

    x, _, y = data()
    return RandomForestClassifier(n_estimators=6, max_depth=5, random_state=0).fit(x, y)


def save_treelite(estimator: Any, path: Path) -> None:
    import treelite

    treelite.sklearn.import_model(estimator).serialize(str(path))


def write_all(repo: Path) -> dict[str, Any]:
    """The forests the e2e tests serve, by model name, each with its estimator."""
    models: dict[str, Any] = {}
    xb = models["xgb_binary"] = xgb_binary()
    write(repo, "xgb_binary", "xgboost.json", xb.save_model,
          fil_config("xgb_binary", {"model_type": "xgboost_json", "is_classifier": "true",
                                    "predict_proba": "true"}, width=2,
                     extra="dynamic_batching { max_queue_delay_microseconds: 2000 }\n"
                           "instance_group [{ kind: KIND_CPU count: 2 }]"))
    write(repo, "xgb_binary_class", "xgboost.ubj", lambda p: xb.get_booster().save_model(str(p)),
          fil_config("xgb_binary_class", {"model_type": "xgboost_ubj", "output_class": "true",
                                          "threshold": "0.5", "storage_type": "AUTO"}))
    xm = models["xgb_multi"] = xgb_multiclass()
    write(repo, "xgb_multi", "xgboost.json", xm.save_model,
          fil_config("xgb_multi", {"model_type": "xgboost_json", "is_classifier": "true",
                                   "predict_proba": "true"}, width=3))
    write(repo, "xgb_multi_class", "xgboost.json", xm.save_model,
          fil_config("xgb_multi_class", {"model_type": "xgboost_json", "is_classifier": "true"}))
    xr = models["xgb_regressor"] = xgb_regressor()
    write(repo, "xgb_regressor", "xgboost.json", xr.save_model,
          fil_config("xgb_regressor", {"model_type": "xgboost_json", "is_classifier": "false"}))
    lb = models["lgb_binary"] = lgb_binary()
    write(repo, "lgb_binary", "model.txt", lambda p: lb.booster_.save_model(str(p)),
          fil_config("lgb_binary", {"model_type": "lightgbm", "is_classifier": "true",
                                    "predict_proba": "true"}, width=2))
    lr = models["lgb_regressor"] = lgb_regressor()
    write(repo, "lgb_regressor", "model.txt", lambda p: lr.booster_.save_model(str(p)),
          fil_config("lgb_regressor", {"model_type": "lightgbm", "is_classifier": "false"}))
    rf = models["sklearn_forest"] = sklearn_forest()
    write(repo, "sklearn_forest", "checkpoint.tl", lambda p: save_treelite(rf, p),
          fil_config("sklearn_forest", {"model_type": "treelite_checkpoint",
                                        "is_classifier": "true", "predict_proba": "true"},
                     width=3))
    # auto-complete: no input, no output
    write(repo, "xgb_auto", "xgboost.json", xm.save_model,
          'backend: "fil"\nmax_batch_size: 64\n'
          'parameters { key: "model_type" value: { string_value: "xgboost_json" } }\n'
          'parameters { key: "predict_proba" value: { string_value: "true" } }\n'
          'parameters { key: "is_classifier" value: { string_value: "true" } }\n')
    return models
