"""Plain Python callables as models (``backend: "nursery_callable"``).

The in-process API's ``Server.bind`` (as PyTriton's ``triton.bind``) writes a generated
``config.pbtxt`` naming this backend into the server's private repository, registers the
function here under the model's name, and loads the model like any other: the configuration
is completed and validated, the scheduler (the dynamic batcher when asked for) forms the
batches, and each instance calls the function on its own thread with the batch's inputs as
numpy arrays (one keyword argument per input, or one dict) and expects a mapping of output
name to array back. What the function returns is checked here, output by output, so that a
wrong answer fails that batch's requests with a message naming the output; the server goes
on serving.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nursery.config.model import ModelConfig, TensorSpec
from nursery.errors import ConfigError, InternalError, NurseryError
from nursery.runtime.devices import InstancePlacement
from nursery.schema import inference as pb
from nursery.types import DataType

log = logging.getLogger("nursery.backends.callable")

BACKEND = "nursery_callable"


@dataclass(frozen=True)
class Binding:
    """A function bound to a model name. ``pass_as``: "kwargs" calls ``fn(**inputs)``,
    "dict" calls ``fn(inputs)``."""

    fn: Callable[..., Any]
    pass_as: str = "kwargs"


def call_style(fn: Callable[..., Any], input_names: Sequence[str]) -> str:
    """How to call ``fn``: with one dict when it takes exactly one positional parameter that
    is not named after an input, else with keyword arguments (PyTriton's ``@batch`` style)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or C callable: keyword arguments
        return "kwargs"
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return "kwargs"
    positional = [p for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                  and p.default is p.empty]
    if len(positional) == 1 and positional[0].name not in input_names:
        return "dict"
    return "kwargs"


class CallableFactory:
    """One per server: the functions bound to model names, and their instances."""

    name = BACKEND
    platform = ""
    default_filename = ""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # bind/unbind on the caller's thread, load on an instance's
        self._bound: dict[str, Binding] = {}

    def bind(self, model: str, binding: Binding) -> None:
        with self._lock:
            self._bound[model] = binding

    def unbind(self, model: str) -> None:
        with self._lock:
            self._bound.pop(model, None)

    def bound(self, model: str) -> bool:
        with self._lock:
            return model in self._bound

    def auto_complete(self, config: pb.ModelConfig, version_path: Path) -> None:
        """Nothing to read: the generated configuration is complete."""

    def load(self, config: ModelConfig, version_path: Path,
             placement: InstancePlacement) -> CallableInstance:
        with self._lock:
            binding = self._bound.get(config.name)
        if binding is None:
            raise ConfigError(
                f"model '{config.name}': no Python function is bound to this name in this "
                f"server (a '{BACKEND}' model is made by Server.bind)")
        return CallableInstance(config, binding)


class CallableInstance:
    """One instance: calls the function on its instance thread."""

    inline_safe = False  # a Python function may take any time: never on the trio thread

    def __init__(self, config: ModelConfig, binding: Binding) -> None:
        self.config = config
        self.binding = binding

    def execute(self, inputs: Mapping[str, np.ndarray],
                output_names: Sequence[str]) -> dict[str, np.ndarray]:
        name = self.config.name
        try:
            if self.binding.pass_as == "dict":
                result = self.binding.fn(dict(inputs))
            else:
                result = self.binding.fn(**inputs)
        except NurseryError:
            raise  # the function chose its error (kind and message)
        except Exception as exc:
            log.debug("model '%s': the bound function raised", name, exc_info=True)
            raise InternalError(f"model '{name}': {type(exc).__name__}: {exc}") from None
        if not isinstance(result, Mapping):
            raise InternalError(
                f"model '{name}': the bound function must return a dict of output name to "
                f"array, got {type(result).__name__}")
        rows = _rows(inputs) if self.config.max_batch_size > 0 else None
        out: dict[str, np.ndarray] = {}
        for output in output_names:
            if output not in result:
                raise InternalError(
                    f"model '{name}': the bound function returned no output '{output}' "
                    f"(it returned {sorted(map(str, result))})")
            spec = self.config.output_map[output]
            out[output] = _checked(name, spec, result[output], rows,
                                   self.config.max_batch_size > 0)
        return out

    def close(self) -> None:
        pass


def _rows(inputs: Mapping[str, np.ndarray]) -> int | None:
    for array in inputs.values():
        if array.ndim:
            return int(array.shape[0])
    return None


def _checked(model: str, spec: TensorSpec, value: Any, rows: int | None,
             batching: bool) -> np.ndarray:
    """``value`` as the output ``spec`` describes, or an error naming the output."""
    where = f"model '{model}': output '{spec.name}'"
    try:
        array = np.asarray(value)
    except Exception as exc:
        raise InternalError(f"{where} is not an array: {exc}") from None
    dt = spec.datatype
    if dt is DataType.BYTES:
        if array.dtype.kind not in ("O", "S", "U"):
            raise InternalError(f"{where} has numpy type {array.dtype}, expected bytes "
                                "(TYPE_STRING)")
        if array.dtype.kind != "O":
            array = np.array([v.encode() if isinstance(v, str) else v
                              for v in array.reshape(-1).tolist()],
                             dtype=object).reshape(array.shape)
    elif array.dtype != dt.numpy_dtype and not (
            dt is DataType.BF16 and array.dtype == np.uint16):
        raise InternalError(f"{where} has numpy type {array.dtype}, expected "
                            f"{dt.numpy_dtype} ({dt.config_name})")
    dims = tuple(spec.reshape if spec.reshape is not None else spec.dims)
    expected = (rows, *dims) if batching else dims
    shape = tuple(array.shape)
    if len(shape) != len(expected) or any(
            e is not None and e != -1 and e != s for e, s in zip(expected, shape, strict=True)):
        want = ["batch" if e is None else ("-1" if e == -1 else str(e)) for e in expected]
        raise InternalError(f"{where} has shape {list(shape)}, expected "
                            f"[{', '.join(want)}]" + (f" with batch = {rows}" if batching else ""))
    return array
