"""TensorFlow models for the tests, made in the test run: small ``tf.Module`` SavedModels (a
dense layer plus a row sum, with its serving signature, with only another signature, with
none) and the same layer frozen into a GraphDef. Each builder returns a numpy function giving
the model's expected answer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

WIDTH, UNITS = 4, 3
WEIGHTS = np.arange(WIDTH * UNITS, dtype=np.float32).reshape(WIDTH, UNITS) / 10 - 0.5


def expected(x: np.ndarray) -> dict[str, np.ndarray]:
    return {"dense": x @ WEIGHTS, "total": x.sum(axis=1, keepdims=True)}


def _module(tf: Any) -> Any:
    class Dense(tf.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(WEIGHTS)

        @tf.function(input_signature=[tf.TensorSpec([None, WIDTH], tf.float32, name="x")])
        def serve(self, x: Any) -> dict[str, Any]:
            return {"dense": tf.matmul(x, self.w), "total": tf.reduce_sum(x, axis=1, keepdims=True)}

    return Dense()


def save_savedmodel(path: Path, signatures: str = "serving_default") -> None:
    """``signatures``: the key to save the serving function under, or "" for none."""
    import tensorflow as tf

    module = _module(tf)
    if signatures:
        tf.saved_model.save(module, str(path), signatures={signatures: module.serve})
    else:
        tf.saved_model.save(module, str(path), signatures={})


def save_graphdef(path: Path) -> None:
    """The dense layer frozen into a GraphDef: input ``x``, outputs ``Identity`` (dense) and
    ``Identity_1`` (total), as TensorFlow names them."""
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    module = _module(tf)
    frozen = convert_variables_to_constants_v2(module.serve.get_concrete_function())
    path.write_bytes(frozen.graph.as_graph_def().SerializeToString())


def tf_config(name: str, platform: str = "tensorflow_savedmodel", max_batch_size: int = 8,
              io: bool = True, params: dict[str, str] | None = None, extra: str = "",
              names: tuple[str, str, str] = ("x", "dense", "total")) -> str:
    lines = [f'name: "{name}"', f'platform: "{platform}"', f"max_batch_size: {max_batch_size}"]
    if io:
        x, dense, total = names
        lines.append(f'input [{{ name: "{x}" data_type: TYPE_FP32 dims: [ {WIDTH} ] }}]')
        lines.append(f'output [{{ name: "{dense}" data_type: TYPE_FP32 dims: [ {UNITS} ] }}, '
                     f'{{ name: "{total}" data_type: TYPE_FP32 dims: [ 1 ] }}]')
    for key, value in (params or {}).items():
        lines.append(f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}')
    lines.append(extra)
    return "\n".join(lines) + "\n"


def write(repo: Path, name: str, config: str, make: Callable[[Path], None],
          filename: str = "model.savedmodel") -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    make(folder / "1" / filename)
    (folder / "config.pbtxt").write_text(config)
    return folder
