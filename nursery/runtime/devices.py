"""Where instances run: the placement of one model instance and the GPUs this machine has."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


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


def gpu_count() -> int:
    """Number of CUDA devices usable here, or 0 (no driver, no package, no device)."""
    global _GPU_COUNT
    if _GPU_COUNT is None:
        _GPU_COUNT = _probe_gpus()
    return _GPU_COUNT


_GPU_COUNT: int | None = None


def _probe_gpus() -> int:
    try:
        import pynvml

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
