"""Where instances run: the placement of one model instance and the GPUs this machine has."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
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


@cache
def gpu_count() -> int:
    """Number of CUDA devices usable here, or 0 (no driver, no package, no device); probed
    once per process (a fact of the machine)."""
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
