"""CPU and GPU readings for the metrics endpoint, sampled every ``--metrics-interval-ms``.

CPU utilization is the busy share of all CPU time between two readings of ``/proc/stat``; memory
is MemTotal and MemTotal - MemAvailable from ``/proc/meminfo``. GPU readings come from NVML
(pynvml, the ``gpu`` extra) when a GPU is present: utilization, memory, power draw and limit,
and energy since the sampler started. The sampler task publishes an immutable
:class:`SystemSample`; the metrics endpoint reads the latest one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

log = logging.getLogger("nursery.metrics")


@dataclass(frozen=True)
class GpuSample:
    uuid: str
    utilization: float  # 0.0 - 1.0
    memory_total: int
    memory_used: int
    power_watts: float
    power_limit_watts: float
    energy_joules: float


@dataclass(frozen=True)
class SystemSample:
    cpu_utilization: float | None = None  # None with CPU metrics off (0.0 until two readings)
    memory_total: int | None = None
    memory_used: int | None = None
    gpus: tuple[GpuSample, ...] = field(default_factory=tuple)


def read_cpu_times(stat: str | None = None) -> tuple[int, int] | None:
    """(busy, total) jiffies from the aggregate ``cpu`` line of /proc/stat."""
    try:
        text = stat if stat is not None else Path("/proc/stat").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("cpu "):
            values = [int(v) for v in line.split()[1:]]
            idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
            total = sum(values[:8])  # user..steal; guest time is already in user
            return total - idle, total
    return None


def read_memory(meminfo: str | None = None) -> tuple[int, int] | None:
    """(total, used) bytes: MemTotal and MemTotal - MemAvailable."""
    try:
        text = meminfo if meminfo is not None else Path("/proc/meminfo").read_text()
    except OSError:
        return None
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            values[key] = int(parts[0]) * 1024
    if "MemTotal" not in values or "MemAvailable" not in values:
        return None
    return values["MemTotal"], values["MemTotal"] - values["MemAvailable"]


def cpu_utilization(before: tuple[int, int], after: tuple[int, int]) -> float:
    busy = after[0] - before[0]
    total = after[1] - before[1]
    return min(1.0, max(0.0, busy / total)) if total > 0 else 0.0


class _Nvml:
    """NVML, if the package and a GPU are there (imported lazily)."""

    def __init__(self) -> None:
        self.nvml: Any = None
        self.handles: list[Any] = []
        self.energy_start: dict[int, float] = {}
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self.nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:  # no package, no driver, no GPU
            log.info("GPU metrics not available (%s)", exc.__class__.__name__)

    def sample(self) -> tuple[GpuSample, ...]:
        out = []
        for i, h in enumerate(self.handles):
            n = self.nvml
            try:
                uuid = n.nvmlDeviceGetUUID(h)
                uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
                util = n.nvmlDeviceGetUtilizationRates(h).gpu / 100.0
                mem = n.nvmlDeviceGetMemoryInfo(h)
                power = n.nvmlDeviceGetPowerUsage(h) / 1000.0
                limit = n.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
                try:
                    energy = n.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0  # mJ -> J
                except Exception:
                    energy = 0.0
            except Exception:
                continue
            start = self.energy_start.setdefault(i, energy)
            out.append(GpuSample(uuid, util, int(mem.total), int(mem.used), power, limit,
                                 energy - start))
        return tuple(out)


class SystemSampler:
    """Holds the latest :class:`SystemSample`; :meth:`run` refreshes it on its own clock."""

    def __init__(self, *, cpu: bool = True, gpu: bool = True) -> None:
        self.cpu = cpu
        self.gpu = gpu
        self.latest = SystemSample()

    async def run(self, interval: float,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        nvml = await trio.to_thread.run_sync(_Nvml) if self.gpu else None
        previous = read_cpu_times() if self.cpu else None
        self.latest = self._read(previous, None, nvml)
        task_status.started()
        while True:
            await trio.sleep(interval)
            current = read_cpu_times() if self.cpu else None
            self.latest = self._read(previous, current, nvml)
            previous = current

    def _read(self, before: tuple[int, int] | None, after: tuple[int, int] | None,
              nvml: _Nvml | None) -> SystemSample:
        # 0 until two readings exist, as Triton's gauge starts at 0
        util = cpu_utilization(before, after) if before and after else 0.0
        memory = read_memory() if self.cpu else None
        gpus = nvml.sample() if nvml is not None and nvml.handles else ()
        return SystemSample(
            cpu_utilization=util if self.cpu else None,
            memory_total=memory[0] if memory else None,
            memory_used=memory[1] if memory else None,
            gpus=gpus,
        )
