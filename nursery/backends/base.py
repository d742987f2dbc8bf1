"""The backend contract and the registry of backends by name.

A backend has two halves. The *factory* (one per backend kind, stateless) knows the default
model file name and can auto-complete a configuration from the model file. The *instance*
(one per model instance) is created and used only on its instance worker's own thread:
``load`` builds it there, ``execute`` runs one batch there, ``close`` finalizes it there.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from nursery.errors import ConfigError

if TYPE_CHECKING:
    from typing import Any

    from nursery.messages import InferWork
    from nursery.model_config import ModelConfig
    from nursery.protocol._generated import inference as pb

log = logging.getLogger("nursery.backends")


@dataclass(frozen=True, slots=True)
class InstancePlacement:
    """Where one model instance runs."""

    group_name: str
    index: int  # index of the instance within the whole model
    kind: str  # "cpu" or "gpu"
    device_id: int  # GPU id for "gpu", 0 for "cpu"

    @property
    def name(self) -> str:
        return f"{self.group_name}_{self.index}"


class BackendInstance(Protocol):
    def execute(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """Run one batch; return the requested outputs by name."""
        ...

    def close(self) -> None: ...


class RequestBackendInstance(BackendInstance, Protocol):
    """A backend that takes whole requests rather than one batched tensor per input (the
    Python backend): one answer per request (an ``InferenceResponse`` or a ``NurseryError``),
    or ``None`` where the backend answers the requester itself (decoupled models)."""

    def execute_requests(self, work: Sequence[InferWork]) -> list[Any]: ...


class BackendFactory(Protocol):
    name: str  # the config's ``backend`` value, e.g. "onnxruntime"
    platform: str  # the matching ``platform`` value, e.g. "onnxruntime_onnx" ("" if none)
    default_filename: str  # e.g. "model.onnx"

    def auto_complete(self, config: pb.ModelConfig, version_path: Path) -> None:
        """Fill what the model file can tell (inputs, outputs, max_batch_size) into ``config``."""
        ...

    def load(
        self, config: ModelConfig, version_path: Path, placement: InstancePlacement
    ) -> BackendInstance:
        """Create one instance. Called on the instance's own thread."""
        ...


# backend name -> module exposing FACTORY; imported lazily so that a missing optional
# package (torch, tensorrt) only matters to the models that use it.
_MODULES = {
    "onnxruntime": "nursery.backends.onnxruntime",
    "python": "nursery.backends.python",
    "pytorch": "nursery.backends.pytorch",
    "tensorrt": "nursery.backends.tensorrt",
}
# platform -> backend name, and the default model file of each, as Triton fills them in.
PLATFORM_TO_BACKEND = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorrt_plan": "tensorrt",
}
BACKEND_TO_PLATFORM = {v: k for k, v in PLATFORM_TO_BACKEND.items()}
DEFAULT_FILENAMES = {
    "onnxruntime": "model.onnx",
    "pytorch": "model.pt",
    "tensorrt": "model.plan",
    "python": "model.py",
}


_REGISTERED: dict[str, BackendFactory] = {}


def register_backend(name: str, factory: BackendFactory) -> None:
    """Make ``backend: "<name>"`` load through ``factory`` (tests and embedders)."""
    _REGISTERED[name] = factory


def get_factory(backend: str, model_name: str) -> BackendFactory:
    if backend in _REGISTERED:
        return _REGISTERED[backend]
    module_name = _MODULES.get(backend)
    if module_name is None:
        known = ", ".join(sorted({*_MODULES, *_REGISTERED}))
        raise ConfigError(
            f"model '{model_name}': backend '{backend}' is not available in this server "
            f"(available: {known})"
        )
    module = importlib.import_module(module_name)
    factory: BackendFactory = module.FACTORY
    return factory


def detect_backend(version_paths: Sequence[Path]) -> str | None:
    """The backend whose default model file is present in a version folder, if any."""
    for path in version_paths:
        for backend, filename in DEFAULT_FILENAMES.items():
            if (path / filename).exists():
                return backend
    return None


def gpu_count() -> int:
    """Number of CUDA devices usable here, or 0 (no driver, no package, no device)."""
    global _GPU_COUNT
    if _GPU_COUNT is None:
        _GPU_COUNT = _probe_gpus()
    return _GPU_COUNT


_GPU_COUNT: int | None = None


def _probe_gpus() -> int:
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    try:  # no pynvml: the driver still lists its devices here
        return len(list(Path("/proc/driver/nvidia/gpus").iterdir()))
    except OSError:
        return 0
