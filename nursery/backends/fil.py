"""Forest models (``backend: "fil"``): XGBoost, LightGBM, scikit-learn and Treelite forests.

Reads Triton FIL's own ``config.pbtxt``: ``parameters`` ``model_type`` (``xgboost``,
``xgboost_json``, ``xgboost_ubj``, ``lightgbm``, ``treelite_checkpoint``; default
``xgboost``), ``is_classifier`` (the older ``output_class`` still names it), ``predict_proba``,
``threshold``, ``xgboost_allow_unknown_field`` and ``cpu_nthread``. The GPU-only tuning
parameters (``chunk_size``, ``layout``, ``transfer_threshold``) are accepted and have nothing to
tune on a CPU; the parameters FIL removed in 25.09 (``algo``, ``threads_per_tree``,
``storage_type``, ``blocks_per_sm``) are accepted with FIL's warning. The model file is the
version folder's ``default_model_filename``, else FIL's default for the model type
(``xgboost.model``, ``xgboost.json``, ``xgboost.ubj``, ``model.txt``, ``checkpoint.tl``);
scikit-learn forests are served as Treelite checkpoints (``treelite.sklearn.import_model(m)
.serialize("checkpoint.tl")``), as in Triton.

The engine is Treelite's GTIL, the CPU path of Triton FIL itself, so outputs follow FIL's
conventions exactly: one FP32 input ``input__0`` of ``[features]`` per row, one FP32 output
``output__0``. A regressor returns its prediction; a classifier returns the class index
(``threshold`` decides a binary one) or, with ``predict_proba``, a score per class (a binary
classifier configured with ``dims: [ 2 ]`` gets ``[1 - p, p]``, with ``dims: [ 1 ]`` gets
``p``). As in FIL, an output's dims of 1 are squeezed away: ``dims: [ 1 ]`` answers shape
``[batch]``. NaN inputs are missing values, routed as the training library routes them.

Engine choice (``bench/fil_engines.py``, 100 trees of depth 6, 32 features, 2 shared cores):
GTIL answers one row in ~40 us against ~170 us for XGBoost's ``inplace_predict`` and ~26 us
for LightGBM's ``predict``; at 256 rows XGBoost's own predictor is ~5x faster than GTIL. GTIL
is kept: one engine for every format, and FIL's exact semantics (thresholding, binary scores,
multi-class postprocessing) on every row.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import betterproto
import numpy as np

from nursery.backends.base import AutofillsBatching, missing_extra
from nursery.config.model import ModelConfig
from nursery.errors import ConfigError, InternalError, InvalidArgument
from nursery.runtime.devices import InstancePlacement
from nursery.schema import inference as pb

log = logging.getLogger("nursery.backends.fil")

EXTRA = "fil"
INPUT_NAME = "input__0"
OUTPUT_NAME = "output__0"
# model_type -> FIL's default file name in a version folder
MODEL_FILES = {
    "xgboost": "xgboost.model",
    "xgboost_json": "xgboost.json",
    "xgboost_ubj": "xgboost.ubj",
    "lightgbm": "model.txt",
    "treelite_checkpoint": "checkpoint.tl",
}
_REMOVED = {"algo": "layout", "threads_per_tree": "chunk_size", "output_class": "is_classifier"}
_REMOVED_NO_SUCCESSOR = ("storage_type", "blocks_per_sm")
# Treelite's TaskType values
_BINARY_CLF, _REGRESSOR, _MULTI_CLF = 0, 1, 2
_FP32 = pb.DataType(pb.DataType.TYPE_FP32)


@dataclass(frozen=True, slots=True)
class FilOptions:
    model_type: str
    is_classifier: bool | None  # None: neither is_classifier nor output_class; from the model
    predict_proba: bool
    threshold: float
    allow_unknown_field: bool
    nthread: int


def _bool(parameters: Mapping[str, str], key: str, model: str) -> bool | None:
    if key not in parameters:
        return None
    value = parameters[key].strip().lower()
    if value in ("true", "1"):
        return True
    if value in ("false", "0"):
        return False
    raise ConfigError(f"model '{model}': Bad input for parameter {key}: '{parameters[key]}' "
                      "(expected true or false)")


def _number(parameters: Mapping[str, str], key: str, model: str, kind: type) -> Any:
    if key not in parameters:
        return None
    try:
        return kind(parameters[key].strip())
    except ValueError:
        raise ConfigError(f"model '{model}': Bad input for parameter {key}: '{parameters[key]}' "
                          f"(expected {'an integer' if kind is int else 'a number'})") from None


def parse_options(parameters: Mapping[str, str], model: str) -> FilOptions:
    """Triton FIL's parameters, checked; errors name the model and the parameter."""
    for removed, successor in _REMOVED.items():
        if parameters.get(removed):
            log.warning("model '%s': The `%s` parameter has been removed in 25.09 release. Use "
                        "`%s` instead.", model, removed, successor)
    for removed in _REMOVED_NO_SUCCESSOR:
        if parameters.get(removed):
            log.warning("model '%s': The `%s` parameter has been removed in 25.09 release.",
                        model, removed)
    model_type = parameters.get("model_type", "xgboost").strip()
    if model_type not in MODEL_FILES:
        raise ConfigError(
            f"model '{model}': parameter model_type: {model_type} not recognized as a valid "
            f"serialization format (one of: {', '.join(MODEL_FILES)})")
    classifier = _bool(parameters, "output_class", model)  # FIL's older name wins, as in FIL
    if classifier is None:
        classifier = _bool(parameters, "is_classifier", model)
    threshold = _number(parameters, "threshold", model, float)
    nthread = _number(parameters, "cpu_nthread", model, int)
    return FilOptions(
        model_type=model_type,
        is_classifier=classifier,
        predict_proba=bool(_bool(parameters, "predict_proba", model)),
        threshold=0.5 if threshold is None else threshold,
        allow_unknown_field=bool(_bool(parameters, "xgboost_allow_unknown_field", model)),
        nthread=-1 if nthread is None or nthread == 0 else nthread,
    )


def _treelite(model: str) -> Any:
    try:
        import treelite
        import treelite.gtil  # noqa: F401
    except ImportError as exc:
        raise missing_extra(model, "FIL", EXTRA, exc) from None
    return treelite


def model_path(default_model_filename: str, version_path: Path, model_type: str) -> Path:
    """The model file: ``default_model_filename`` in the version folder, else FIL's default
    name for the model type (also inside a folder that ``default_model_filename`` names)."""
    path = version_path / default_model_filename if default_model_filename else version_path
    if path.is_dir():
        path = path / MODEL_FILES[model_type]
    return path


_TIMESTAMP = re.compile(r"^\[\d\d:\d\d:\d\d\] ", re.MULTILINE)


def _tl_message(exc: Exception) -> str:
    """A Treelite error on one line, without its timestamps."""
    return " ".join(_TIMESTAMP.sub("", str(exc)).split())


def _load_forest(path: Path, options: FilOptions, model: str) -> Any:
    treelite = _treelite(model)
    if not path.is_file():
        raise ConfigError(f"model '{model}': unable to find '{path}' (model_type "
                          f"'{options.model_type}')")
    try:
        if options.model_type == "xgboost":
            forest = treelite.frontend.load_xgboost_model_legacy_binary(str(path))
        elif options.model_type in ("xgboost_json", "xgboost_ubj"):
            forest = treelite.frontend.load_xgboost_model(
                str(path), format_choice="json" if options.model_type == "xgboost_json" else "ubjson",
                allow_unknown_field=options.allow_unknown_field)
        elif options.model_type == "lightgbm":
            forest = treelite.frontend.load_lightgbm_model(str(path))
        else:
            forest = treelite.Model.deserialize(str(path))
    except Exception as exc:  # TreeliteError, or a bare runtime error from a parser
        raise ConfigError(
            f"model '{model}': failed to load '{path}' as model_type '{options.model_type}': "
            f"{_tl_message(exc)}") from None
    header = forest.get_header_accessor()
    if int(header.get_field("num_target")[0]) != 1:
        raise ConfigError(f"model '{model}': '{path}': multi-target forests are not supported "
                          "(as in Triton FIL)")
    return forest


@dataclass(frozen=True, slots=True)
class _Facts:
    num_feature: int
    num_class: int  # 1 for a regressor or a binary classifier with one score
    task_type: int


def _facts(forest: Any) -> _Facts:
    header = forest.get_header_accessor()
    return _Facts(int(forest.num_feature), int(header.get_field("num_class")[0]),
                  int(header.get_field("task_type")[0]))


def _is_classifier(options: FilOptions, facts: _Facts) -> bool:
    if options.is_classifier is not None:
        return options.is_classifier
    return facts.task_type in (_BINARY_CLF, _MULTI_CLF)


def _output_width(options: FilOptions, facts: _Facts) -> int:
    """Values per row of ``output__0`` when the config does not say."""
    if options.predict_proba and _is_classifier(options, facts):
        return max(facts.num_class, 2)
    if not _is_classifier(options, facts) and facts.num_class > 1:
        return facts.num_class
    return 1


def _parameters(config: pb.ModelConfig) -> dict[str, str]:
    return {k: v.string_value for k, v in config.parameters.items()}


class FilInstance:
    """One forest; every call runs on the owning instance worker's thread."""

    inline_safe = False

    def __init__(self, forest: Any, options: FilOptions, facts: _Facts, width: int,
                 model: str) -> None:
        self._gtil = _treelite(model).gtil
        self._forest = forest
        self._options = options
        self._facts = facts
        self._classifier = _is_classifier(options, facts)
        self._width = width  # values per row the config's output__0 holds
        self._model = model
        self._dtype = np.float64 if str(forest.input_type) == "float64" else np.float32

    def execute(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        array = inputs[INPUT_NAME]
        features = self._facts.num_feature
        if array.ndim == 0 or array.size % features:
            raise InvalidArgument(
                f"model '{self._model}': input '{INPUT_NAME}' with shape {list(array.shape)} "
                f"does not hold rows of {features} features")
        rows = np.ascontiguousarray(array.reshape(-1, features), dtype=self._dtype)
        n = rows.shape[0]
        try:
            raw = self._gtil.predict(self._forest, rows, nthread=self._options.nthread)
        except Exception as exc:
            raise InternalError(f"model '{self._model}': forest prediction failed: "
                                f"{_tl_message(exc)}") from exc
        scores = np.asarray(raw, dtype=np.float32).reshape(n, -1)
        out = self._postprocess(scores)
        if out.shape[1] == 1:
            out = out.reshape(n)  # FIL squeezes the output's 1-dims away
        return {OUTPUT_NAME: out}

    def _postprocess(self, scores: np.ndarray) -> np.ndarray:
        if not self._classifier:
            return scores
        if self._options.predict_proba:
            if scores.shape[1] == 1 and self._width == 2:
                return np.concatenate([1.0 - scores, scores], axis=1)
            return scores
        if scores.shape[1] > 1:
            return np.argmax(scores, axis=1).astype(np.float32).reshape(-1, 1)
        return (scores > self._options.threshold).astype(np.float32)

    def close(self) -> None:
        self._forest = None


class FilFactory(AutofillsBatching):
    name = "fil"
    platform = ""
    default_filename = ""  # FIL's default depends on model_type (MODEL_FILES)

    def auto_complete(self, config: pb.ModelConfig, version_path: Path) -> None:
        """Fill ``input__0`` (features) and ``output__0`` (classes) from the forest, and a
        batch size with dynamic batching, when the config leaves them out."""
        if config.input and config.output:
            return
        options = parse_options(_parameters(config), config.name)
        path = model_path(config.default_model_filename, version_path, options.model_type)
        facts = _facts(_load_forest(path, options, config.name))
        if config.max_batch_size == 0 and self.default_max_batch > 0:
            config.max_batch_size = self.default_max_batch  # --backend-config, 4 by default
            log.warning(
                "autofilled max_batch_size to %d for model '%s' since batching is supported "
                "but no max_batch_size is specified in model configuration",
                self.default_max_batch, config.name)
            if betterproto.which_one_of(config, "scheduling_choice")[0] == "":
                config.dynamic_batching = pb.ModelDynamicBatching()
        if not config.input:
            config.input.append(pb.ModelInput(name=INPUT_NAME, data_type=_FP32,
                                              dims=[facts.num_feature]))
        if not config.output:
            config.output.append(pb.ModelOutput(name=OUTPUT_NAME,
                                                data_type=_FP32,
                                                dims=[_output_width(options, facts)]))

    def load(
        self, config: ModelConfig, version_path: Path, placement: InstancePlacement
    ) -> FilInstance:
        options = parse_options(config.parameters, config.name)
        path = model_path(config.default_model_filename, version_path, options.model_type)
        forest = _load_forest(path, options, config.name)
        facts = _facts(forest)
        if options.predict_proba and facts.task_type == _MULTI_CLF:
            # as Triton FIL: scores per class, whatever the training objective's transform
            shape = forest.get_header_accessor().get_field("leaf_vector_shape")
            forest.get_header_accessor().set_field(
                "postprocessor", "softmax" if int(shape[1]) == 1 else "identity_multiclass")
        width = _check_io(config, path, options, facts)
        if placement.kind == "gpu":
            log.warning("model '%s' instance %s: the FIL backend runs forests on the CPU here",
                        config.name, placement.name)
        return FilInstance(forest, options, facts, width, config.name)


def _check_io(config: ModelConfig, path: Path, options: FilOptions, facts: _Facts) -> int:
    """The config's ``input__0`` / ``output__0`` against the forest; the output's values per
    row."""
    where = f"model '{config.name}'"
    names = [t.name for t in config.inputs]
    if names != [INPUT_NAME]:
        raise ConfigError(f"{where}: the FIL backend takes one input named '{INPUT_NAME}'; "
                          f"config.pbtxt has {names}")
    spec = config.inputs[0]
    if spec.datatype.config_name != "TYPE_FP32":
        raise ConfigError(f"{where}: input '{INPUT_NAME}' must be TYPE_FP32 (FIL computes in "
                          f"32-bit floats), config.pbtxt says {spec.datatype.config_name}")
    dims = list(spec.reshape if spec.reshape is not None else spec.dims)
    features = dims[-1] if dims else 0
    if config.max_batch_size == 0 and len(dims) != 2 or config.max_batch_size > 0 and len(dims) != 1:
        raise ConfigError(f"{where}: input '{INPUT_NAME}' dims {dims} must be [features] (with "
                          "max_batch_size > 0) or [rows, features]")
    if features != facts.num_feature:
        raise ConfigError(
            f"{where}: config.pbtxt gives input '{INPUT_NAME}' {features} features but the "
            f"model file '{path}' has {facts.num_feature}")
    out_names = [t.name for t in config.outputs]
    if OUTPUT_NAME not in out_names or len(out_names) != 1:
        raise ConfigError(f"{where}: the FIL backend gives one output named '{OUTPUT_NAME}' "
                          f"(treeshap_output is not served here); config.pbtxt has {out_names}")
    out = config.outputs[0]
    if out.datatype.config_name != "TYPE_FP32":
        raise ConfigError(f"{where}: output '{OUTPUT_NAME}' must be TYPE_FP32, config.pbtxt "
                          f"says {out.datatype.config_name}")
    out_dims = [d for d in (out.reshape if out.reshape is not None else out.dims)]
    if config.max_batch_size == 0:
        out_dims = out_dims[1:]
    width = int(np.prod(out_dims)) if out_dims else 1
    classifier = _is_classifier(options, facts)
    if options.predict_proba and classifier:
        allowed = {1, 2} if facts.num_class == 1 else {facts.num_class}
    elif not classifier and facts.num_class > 1:
        allowed = {facts.num_class}
    else:
        allowed = {1}
    if width not in allowed:
        what = ("one score per class" if options.predict_proba and classifier
                else "one value per row")
        raise ConfigError(
            f"{where}: config.pbtxt gives output '{OUTPUT_NAME}' {width} values per row but "
            f"the model file '{path}' ({facts.num_class} class(es), predict_proba "
            f"{str(options.predict_proba).lower()}) gives {what}: "
            f"{' or '.join(str(a) for a in sorted(allowed))}")
    return width


FACTORY = FilFactory()
