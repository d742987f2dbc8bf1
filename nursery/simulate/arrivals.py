"""Simulated requests and the processes that make them arrive.

- :func:`poisson`: exponential gaps at a rate (what ``perf_analyzer --request-distribution
  poisson`` sends);
- :func:`constant`: evenly spaced arrivals (``--request-distribution constant``);
- :func:`bursts`: groups of requests arriving together, every period;
- :func:`sequences`: sequences (START ... END, one correlation ID each) for the sequence
  batcher;
- :func:`read_trace`: a recorded trace, one arrival a line: the JSON lines the server writes
  with ``--arrival-log`` (``nursery/observability/arrival_log.py``), or CSV with a header naming the same
  fields. Times are seconds; the first arrival becomes time 0.

Every process is deterministic for its seed.
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

FIELDS = ("time", "model", "batch_size", "priority", "timeout_us", "sequence_id",
          "sequence_start", "sequence_end")


@dataclass(slots=True, eq=False)
class SimRequest:
    """One simulated request; it has every attribute a policy reads from ``InferWork``."""

    id: int
    arrival: float  # seconds on the virtual clock
    batch_size: int = 1
    priority: int = 0
    timeout_us: int = 0
    signature: Hashable = None
    model: str = ""
    sequence_id: Hashable = 0
    sequence_start: bool = False
    sequence_end: bool = False

    def abandoned(self) -> bool:
        return False  # simulated clients always wait


@dataclass(frozen=True)
class RequestShape:
    """What every generated request looks like."""

    batch_size: int = 1
    priority: int = 0
    timeout_us: int = 0
    model: str = ""


def _make(times: Iterable[float], shape: RequestShape) -> list[SimRequest]:
    return [SimRequest(i, t, shape.batch_size, shape.priority, shape.timeout_us, None, shape.model)
            for i, t in enumerate(times)]


def _check(rate: float, duration: float | None, count: int | None) -> None:
    if rate <= 0:
        raise ValueError(f"the arrival rate must be positive, got {rate}")
    if (duration is None) == (count is None):
        raise ValueError("give exactly one of a duration and a count of requests")
    if duration is not None and duration <= 0:
        raise ValueError(f"the duration must be positive, got {duration}")
    if count is not None and count < 0:
        raise ValueError(f"the count must not be negative, got {count}")


def poisson(rate: float, *, duration: float | None = None, count: int | None = None,
            seed: int = 0, shape: RequestShape = RequestShape()) -> list[SimRequest]:
    """Arrivals with exponential gaps of mean ``1/rate``, from time 0."""
    _check(rate, duration, count)
    rng = random.Random(seed)
    times: list[float] = []
    t = 0.0
    while True:
        if count is not None and len(times) >= count:
            break
        if duration is not None and t >= duration:
            break
        times.append(t)
        t += rng.expovariate(rate)
    return _make(times, shape)


def constant(rate: float, *, duration: float | None = None, count: int | None = None,
             shape: RequestShape = RequestShape()) -> list[SimRequest]:
    """One arrival every ``1/rate`` seconds, from time 0."""
    _check(rate, duration, count)
    n = count if count is not None else max(1, int(round(duration * rate)))  # type: ignore[operator]
    return _make((i / rate for i in range(n)), shape)


def bursts(size: int, period: float, *, duration: float | None = None,
           count: int | None = None, seed: int = 0, jitter: float = 0.0,
           shape: RequestShape = RequestShape()) -> list[SimRequest]:
    """``size`` requests at once every ``period`` seconds (each burst's start moved by up to
    ``jitter`` seconds, drawn with ``seed``)."""
    if size < 1 or period <= 0:
        raise ValueError("a burst needs a size of at least 1 and a positive period")
    _check(size / period, duration, count)
    rng = random.Random(seed)
    times: list[float] = []
    k = 0
    while True:
        start = k * period + (rng.uniform(0, jitter) if jitter else 0.0)
        if duration is not None and k * period >= duration:
            break
        for _ in range(size):
            if count is not None and len(times) >= count:
                return _make(sorted(times), shape)
            times.append(start)
        k += 1
    return _make(sorted(times), shape)


def sequences(rate: float, *, length: int, gap: float, duration: float | None = None,
              count: int | None = None, seed: int = 0,
              shape: RequestShape = RequestShape()) -> list[SimRequest]:
    """Sequences of ``length`` requests (the first flagged START, the last END; correlation
    IDs 1, 2, ...), starting as a Poisson process at ``rate / length`` so that requests arrive
    at ``rate`` overall; within a sequence, requests follow each other after exponential gaps
    of mean ``gap`` seconds. ``duration`` bounds the sequences' starts; ``count`` the number
    of requests (whole sequences, so the last one may pass it)."""
    _check(rate, duration, count)
    if length < 1 or gap < 0:
        raise ValueError("a sequence needs a length of at least 1 and a gap of 0 or more")
    rng = random.Random(seed)
    timed: list[tuple[float, int, int]] = []  # (time, sequence, step)
    start, n = 0.0, 0
    while True:
        if count is not None and n * length >= count:
            break
        if duration is not None and start >= duration:
            break
        n += 1
        t = start
        for step in range(length):
            timed.append((t, n, step))
            t += rng.expovariate(1 / gap) if gap > 0 else 0.0
        start += rng.expovariate(rate / length)
    timed.sort()
    return [SimRequest(i, t, shape.batch_size, shape.priority, shape.timeout_us, None,
                       shape.model, seq, step == 0, step == length - 1)
            for i, (t, seq, step) in enumerate(timed)]


def _bool(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes")
    return bool(value)


def _sequence_id(value: object) -> Hashable:
    if isinstance(value, str):
        return int(value) if value.isdigit() else value
    return value if isinstance(value, int) else 0


def read_trace(path: str | Path, *, model: str | None = None) -> list[SimRequest]:
    """Arrivals from a recorded trace (JSON lines or CSV), optionally of one model only."""
    path = Path(path)
    text = path.read_text()
    rows: list[dict[str, object]] = []
    if text.lstrip().startswith("{"):
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not a JSON object: {exc}") from None
    else:
        rows = list(csv.DictReader(text.splitlines()))
    out: list[SimRequest] = []
    for n, row in enumerate(rows, 1):
        if "time" not in row:
            raise ValueError(f"{path}: arrival {n} has no 'time' field")
        if model is not None and row.get("model", model) != model:
            continue
        try:
            out.append(SimRequest(
                len(out), float(row["time"]),  # type: ignore[arg-type]
                int(row.get("batch_size") or 1),  # type: ignore[call-overload]
                int(row.get("priority") or 0),  # type: ignore[call-overload]
                int(row.get("timeout_us") or 0),  # type: ignore[call-overload]
                None, str(row.get("model") or ""),
                _sequence_id(row.get("sequence_id") or 0),
                _bool(row.get("sequence_start") or False),
                _bool(row.get("sequence_end") or False)))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: arrival {n}: {exc}") from None
    out.sort(key=lambda r: r.arrival)
    if out:
        t0 = out[0].arrival
        out = [replace(r, id=i, arrival=r.arrival - t0) for i, r in enumerate(out)]
    return out
