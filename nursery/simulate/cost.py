"""The backend's cost: seconds to execute a batch, as a function of its rows.

A :class:`CostTable` holds measured points (rows -> seconds) and interpolates linearly between
them; below the first point it takes the first point's cost, above the last it continues the
line through the last two points. It is written as ``"1:0.4ms,8:1.1ms,64:6ms"`` (units s, ms
or us; a bare number is seconds) or as a JSON file ``{"1": 0.0004, "8": 0.0011}``.

:func:`profile` measures one: it loads a model of the repository through its real backend (the
same ``BackendFactory`` the instance worker uses), builds batches of random inputs, and times
what an instance thread does for a batch (``nursery.execution.batch.gather_inputs``, the backend's
``execute`` and ``split_outputs``), taking the median of several runs per size.
"""

from __future__ import annotations

import bisect
import json
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nursery.backends.base import get_factory
from nursery.config.model import read_model_config
from nursery.execution.batch import gather_inputs, output_names, split_outputs
from nursery.runtime.devices import InstancePlacement
from nursery.types import DataType, InferenceRequest, Tensor

_UNITS = (("us", 1e-6), ("ms", 1e-3), ("s", 1.0))


def parse_duration(text: str) -> float:
    text = text.strip()
    for suffix, scale in _UNITS:
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * scale
    return float(text)


@dataclass(frozen=True)
class CostTable:
    points: tuple[tuple[int, float], ...]  # (rows, seconds), rows ascending

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("a cost table needs at least one point")
        rows = [r for r, _ in self.points]
        if rows != sorted(set(rows)) or rows[0] < 1:
            raise ValueError("cost table rows must be distinct positive integers")
        if any(s < 0 for _, s in self.points):
            raise ValueError("cost table times must not be negative")

    @classmethod
    def constant(cls, seconds: float) -> CostTable:
        return cls(((1, seconds),))

    @classmethod
    def parse(cls, text: str) -> CostTable:
        """``"1:0.4ms,8:1.1ms"``, a JSON file's path, or one duration (constant cost)."""
        if Path(text).is_file():
            return cls.load(Path(text))
        points = []
        for part in text.split(","):
            rows, sep, cost = part.partition(":")
            try:
                if not sep:
                    return cls.constant(parse_duration(rows))
                points.append((int(rows), parse_duration(cost)))
            except ValueError:
                raise ValueError(f"cannot read the cost table entry '{part}' (expected "
                                 "ROWS:SECONDS such as 8:1.2ms)") from None
        return cls(tuple(sorted(points)))

    @classmethod
    def load(cls, path: Path) -> CostTable:
        data = json.loads(path.read_text())
        table = data.get("cost", data) if isinstance(data, dict) else data
        return cls(tuple(sorted((int(k), float(v)) for k, v in table.items())))

    def to_json(self) -> dict[str, float]:
        return {str(r): s for r, s in self.points}

    def __call__(self, rows: int) -> float:
        pts = self.points
        if len(pts) == 1 or rows <= pts[0][0]:
            return pts[0][1]
        i = bisect.bisect_left([r for r, _ in pts], rows)
        if i < len(pts) and pts[i][0] == rows:
            return pts[i][1]
        if i >= len(pts):
            i = len(pts) - 1
        (r0, s0), (r1, s1) = pts[i - 1], pts[i]
        return max(0.0, s0 + (s1 - s0) * (rows - r0) / (r1 - r0))


def parse_percentiles(text: str) -> tuple[tuple[float, float], ...]:
    """``50:1.6ms,90:1.9ms,99:2.5ms`` -> ((0.5, 0.0016), (0.9, 0.0019), (0.99, 0.0025))."""
    points = []
    for part in text.split(","):
        pct, _, value = part.partition(":")
        try:
            points.append((float(pct) / 100, parse_duration(value)))
        except ValueError:
            raise ValueError(f"cannot read the overhead percentile '{part}' (expected "
                             "PERCENT:TIME such as 99:2.5ms)") from None
    points.sort()
    if any(not 0 < q < 1 for q, _ in points) or any(v < 0 for _, v in points):
        raise ValueError("overhead percentiles must lie strictly between 0 and 100 and the "
                         "times must not be negative")
    return tuple(points)


def quantile(points: Sequence[tuple[float, float]], u: float) -> float:
    """The value at quantile ``u`` of a distribution given by percentile points (linear
    between them, clamped outside)."""
    i = bisect.bisect_left([q for q, _ in points], u)
    if i == 0:
        return points[0][1]
    if i == len(points):
        return points[-1][1]
    (q0, v0), (q1, v1) = points[i - 1], points[i]
    return v0 + (v1 - v0) * (u - q0) / (q1 - q0)


def mean_above_median(points: Sequence[tuple[float, float]]) -> float:
    """How far, on average, a value of the distribution ``points`` (see :func:`quantile`) lies
    above its median (0 for values below it)."""
    mid = quantile(points, 0.5)
    return statistics.fmean(max(0.0, quantile(points, (i + 0.5) / 1000) - mid)
                            for i in range(1000))


def parse_overhead(text: str, seed: int = 0) -> float | Callable[..., float]:
    """The time a request spends outside the instance (frontend, network, client): one
    duration (``0.3ms``), its distribution as percentiles ``50:1.6ms,90:1.9ms,99:2.5ms``,
    sampled per request (linear between percentiles, clamped outside) with ``seed``, or an
    :class:`IdleOverhead` written ``warm=PERCENTILES;cold=PERCENTILES;tau=TIME``."""
    if "=" in text:
        return IdleOverhead.parse(text, seed)
    if ":" not in text:
        return parse_duration(text)
    points = parse_percentiles(text)
    rng = random.Random(seed)

    def draw(_request: object) -> float:
        return quantile(points, rng.random())

    return draw


class IdleOverhead:
    """Overhead that depends on how long the server had been idle when the request came.

    Measured on a real server, the time outside the instance is not one distribution: a
    request that finds the server busy (its threads awake, thread pools still spinning, caches
    warm) is answered faster than one that wakes it after a quiet spell, so the measured
    latency *falls* as the arrival rate rises while a constant overhead cannot. This model
    holds two measured distributions, ``warm`` (back-to-back requests: perf_analyzer at
    concurrency 1) and ``cold`` (requests that find the server long idle: a low Poisson rate),
    and says the server is made of ``parts`` (default 1) parts that each *fall asleep* after an
    idle time drawn from an exponential distribution of mean ``tau``: a request that finds the
    server idle for ``g`` seconds finds each part asleep, independently, with probability
    ``1 - exp(-g / tau)``, and each sleeping part adds ``1/parts`` of the way from the warm to
    the cold distribution (at one quantile drawn for the request). With one part the overhead
    is drawn from ``cold`` or from ``warm``; with many, the expected fraction of the way grows
    smoothly with the idle time. ``tau`` is fitted at other rates (``bench/sim_fidelity.py``).

    Where the waking happens is ``wake``: ``outside`` (default) adds the whole overhead after
    the answer, as a delay nothing else waits for; ``frontend`` spends the share above the warm
    figure (what sleeping cost) on the server's frontend thread as the request arrives, so
    that requests arriving while the server wakes wait for it (the engine's ``split``);
    ``tail`` spends everything above the warm *median* there: the warm tail too, that is, the
    server's own stalls (a slow wake-up of the instance thread, a garbage collection), which
    every request behind a stalled one waits out, so that the tail grows with the load (with
    ``tail`` the frontend cost given to the engine should be lowered by the tail's mean,
    :meth:`warm_frontend_mean`, as ``bench/sim_fidelity.py`` does, or the frontend is charged
    it twice).
    """

    uses_idle = True

    def __init__(self, warm: Sequence[tuple[float, float]], cold: Sequence[tuple[float, float]],
                 tau: float, seed: int = 0, parts: int = 1, wake: str = "outside") -> None:
        if tau <= 0:
            raise ValueError("the idle time constant tau must be positive")
        if parts < 1:
            raise ValueError("an idle overhead needs at least one part")
        if wake not in ("outside", "frontend", "tail"):
            raise ValueError(f"wake={wake} of the idle overhead: expected outside, frontend or "
                             "tail")
        self.wake = wake
        if not warm or not cold:
            raise ValueError("an idle overhead needs both a warm and a cold distribution")
        self.warm, self.cold, self.tau, self.parts = tuple(warm), tuple(cold), tau, parts
        self._warm_median = quantile(self.warm, 0.5)
        self._rng = random.Random(seed)

    @classmethod
    def parse(cls, text: str, seed: int = 0) -> IdleOverhead:
        parts: dict[str, str] = {}
        for part in text.split(";"):
            key, sep, value = part.partition("=")
            if not sep or key.strip() not in ("warm", "cold", "tau", "parts", "wake"):
                raise ValueError(f"cannot read '{part}' of the idle overhead (expected "
                                 "warm=PERCENTILES;cold=PERCENTILES;tau=TIME[;parts=N]"
                                 "[;wake=outside|frontend|tail])")
            parts[key.strip()] = value.strip()
        if not {"warm", "cold", "tau"} <= set(parts):
            raise ValueError("an idle overhead needs warm=..., cold=... and tau=...")
        try:
            count = int(parts.get("parts", "1"))
        except ValueError:
            raise ValueError(f"parts={parts['parts']} of the idle overhead is not a whole "
                             "number") from None
        return cls(parse_percentiles(parts["warm"]), parse_percentiles(parts["cold"]),
                   parse_duration(parts["tau"]), seed, count, parts.get("wake", "outside"))

    def __str__(self) -> str:
        def fmt(points: Sequence[tuple[float, float]]) -> str:
            return ",".join(f"{q * 100:g}:{v * 1e3:.4f}ms" for q, v in points)

        return (f"warm={fmt(self.warm)};cold={fmt(self.cold)};tau={self.tau * 1e3:.4g}ms"
                + (f";parts={self.parts}" if self.parts != 1 else "")
                + (f";wake={self.wake}" if self.wake != "outside" else ""))

    def warm_frontend_mean(self) -> float:
        """The mean seconds :meth:`split` puts on the frontend thread for a request that finds
        the server busy (0 unless ``wake=tail``: then the warm tail above its median). A
        frontend cost measured at saturation already holds it, so a caller lowers
        ``--frontend`` by this much or charges it twice."""
        return mean_above_median(self.warm) if self.wake == "tail" else 0.0

    def split(self, _request: object, idle: float = 0.0) -> tuple[float, float]:
        """(seconds on the frontend thread, seconds outside the server) for one request."""
        p = 1.0 - math.exp(-idle / self.tau)
        rng = self._rng
        asleep = sum(rng.random() < p for _ in range(self.parts))
        u = rng.random()
        warm = quantile(self.warm, u)
        value = warm if asleep == 0 else quantile(self.cold, u) if asleep == self.parts else (
            warm + (quantile(self.cold, u) - warm) * asleep / self.parts)
        if self.wake == "frontend":
            return max(0.0, value - warm), min(value, warm)
        if self.wake == "tail":
            mid = self._warm_median
            return max(0.0, value - mid), min(value, mid)
        return 0.0, value

    def __call__(self, request: object, idle: float = 0.0) -> float:
        inside, outside = self.split(request, idle)
        return inside + outside


def default_sizes(max_batch_size: int) -> list[int]:
    sizes = [1]
    while sizes[-1] * 2 < max_batch_size:
        sizes.append(sizes[-1] * 2)
    if max_batch_size > 1:
        sizes.append(max_batch_size)
    return sizes


def profile(model_path: Path, model_name: str, *, sizes: Sequence[int] | None = None,
            runs: int = 20, seed: int = 0) -> CostTable:
    """Measure a real model of the repository at a few batch sizes (in this process)."""
    config, versions = read_model_config(model_path, model_name, backends=get_factory)
    version = versions[-1]
    sizes = list(sizes or default_sizes(max(1, config.max_batch_size)))
    if config.max_batch_size == 0 and sizes != [1]:
        raise ValueError(f"model '{model_name}' does not batch: profile it at size 1 only")
    factory = get_factory(config.backend, model_name)
    backend = factory.load(config, model_path / str(version),
                           InstancePlacement("profile", 0, "cpu", 0))
    rng = np.random.default_rng(seed)

    def request() -> InferenceRequest:
        inputs = {}
        for spec in config.inputs:
            if spec.optional:
                continue
            dims = tuple(1 if d < 0 else d for d in spec.dims)
            shape = (1, *dims) if config.max_batch_size > 0 else dims
            if spec.datatype == DataType.BYTES:
                data = np.array([b"x"] * int(np.prod(shape)), dtype=object).reshape(shape)
            elif spec.datatype == DataType.BOOL:
                data = rng.integers(0, 2, shape).astype(bool)
            else:
                data = rng.random(shape).astype(spec.datatype.numpy_dtype)
            inputs[spec.name] = Tensor(spec.name, spec.datatype, shape, data)
        return InferenceRequest(model_name, str(version), inputs)

    points = []
    try:
        for rows in sizes:
            requests = [request() for _ in range(rows)]
            names = output_names(requests, config)
            times = []
            for _ in range(runs + 2):
                t0 = time.perf_counter()
                inputs = gather_inputs(requests, config)
                results = backend.execute(inputs, names)
                split_outputs(requests, [1] * rows, results, config, str(version))
                times.append(time.perf_counter() - t0)
            points.append((rows, statistics.median(times[2:])))  # the first runs warm up
    finally:
        backend.close()
    return CostTable(tuple(points))
