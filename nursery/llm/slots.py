"""Which waiting request takes which free slot: the decode loop's policy, pure and
synchronous (no threads, no clock), so hypothesis can drive it (tests/property).

Three modes, chosen by the model's ``batching_mode`` parameter:

- ``continuous`` (in-flight batching): at every step, waiting requests take free slots in
  arrival order; a finished or cancelled sequence frees its slot for the next step.
- ``static``: a batch is formed only when no sequence is running (up to ``slots`` of the
  waiting requests); later arrivals wait until the whole batch has finished.
- ``sequential``: one request at a time (``static`` with one slot).

A slot is the lowest free number, so the active slots stay packed at the low end (the
decoder's attention reads the span of active slots).

``plan_prefill`` is the other half of a step's policy (chunked prefill): how many prompt
tokens each admitted sequence runs in a step, under the per-step token budget and, in
``continuous`` mode, under a cap that keeps the running sequences' inter-token latency:
``StepCost`` learns what a step costs from the steps the loop measured (a fixed part, a
part per row, a part per cache position the attention reads) and ``prefill_cap`` gives the
prompt tokens a step may carry beside its decode rows so that it costs at most
``1 + overhead`` times what those decode rows cost alone (stall-free batching, as
Sarathi-Serve's token budget, but derived from the measured cost).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

import numpy as np

MODES = ("continuous", "static", "sequential")


def plan_prefill(budget: int, decoding: int, remaining: Sequence[int],
                 cap: int | None = None) -> list[int]:
    """Chunked prefill: a step runs every decoding sequence's next token (``decoding`` of
    them) and at most ``budget - decoding`` prompt tokens (and at most ``cap``, when given),
    given to the prompts in ``remaining`` (each one's tokens not yet run, in admission order)
    first come, first served. While a prompt waits, at least one of its tokens runs in every
    step, so no budget or cap starves it. Returns how many tokens of each prompt run now (a
    0 runs nothing)."""
    if budget < 1:
        raise ValueError(f"the token budget must be at least 1, got {budget}")
    room = budget - decoding if cap is None else min(budget - decoding, cap)
    left = max(room, 1 if any(remaining) else 0)
    plan = []
    for want in remaining:
        take = min(want, left)
        plan.append(take)
        left -= take
    return plan

class StepCost:
    """What a decode step costs, learned from the steps measured: ``seconds = fixed +
    per_row * rows + per_read * reads`` (``rows``: tokens the step runs, decode rows and
    prompt tokens; ``reads``: cache positions its decode rows' attention reads; a prompt
    chunk's attention, over its own short past, is left in the per-row part), fitted by
    weighted least squares, older steps weighing less (``memory``: the weight a step keeps
    per step after it), so the fit follows the machine. A part the steps cannot tell apart
    from the fixed one (the row counts, or the reads, hardly varied) is not guessed: without
    varied row counts there is no fit (``coef`` None), without varied reads the fit has no
    part per read. Pure: the caller measures and says what it measured."""

    def __init__(self, memory: float = 0.98, warmup: int = 8) -> None:
        if not 0 < memory <= 1:
            raise ValueError(f"memory must be in (0, 1], got {memory}")
        self.memory = memory
        self.warmup = warmup
        self.seen = 0
        self._xx = np.zeros((3, 3))  # the weighted normal equations
        self._xy = np.zeros(3)
        self.coef: tuple[float, float, float] | None = None
        self.split = False  # the fit told all three parts apart (the reads varied on their own)

    def observe(self, rows: int, reads: int, seconds: float) -> None:
        if rows < 1 or not math.isfinite(seconds) or seconds < 0:
            return
        x = np.array([1.0, rows, reads])
        self._xx = self._xx * self.memory + np.outer(x, x)
        self._xy = self._xy * self.memory + x * seconds
        self.seen += 1
        self.coef = self._solve() if self.seen >= self.warmup else None
        if self.coef is None:
            self.split = False

    def _solve(self) -> tuple[float, float, float] | None:
        n = self._xx[0, 0]
        mean = self._xx[0, 1:] / n
        cov = self._xx[1:, 1:] / n - np.outer(mean, mean)  # of rows and reads
        if cov[0, 0] < 0.25:  # rows varied by less than half a row: per row unknown
            return None
        # reads that hardly varied, or varied with the rows alone, cannot be told apart
        partial = cov[1, 1] - cov[0, 1] ** 2 / cov[0, 0]
        use = [0, 1, 2] if partial > 1e-6 * (1.0 + mean[1] ** 2) else [0, 1]
        self.split = len(use) == 3
        try:
            solved = np.linalg.solve(self._xx[np.ix_(use, use)], self._xy[use])
        except np.linalg.LinAlgError:
            return None
        coef = [0.0, 0.0, 0.0]
        for i, value in zip(use, solved, strict=True):
            coef[i] = float(value)
        if not all(math.isfinite(c) for c in coef) or coef[1] <= 0:
            return None
        return coef[0], coef[1], coef[2]

    def predict(self, rows: int, reads: int) -> float | None:
        if self.coef is None:
            return None
        fixed, per_row, per_read = self.coef
        return fixed + per_row * rows + per_read * reads


def prefill_cap(cost: StepCost, decoding: int, reads: int, overhead: float) -> int | None:
    """Prompt tokens a step may run beside ``decoding`` decode rows (their attention reading
    ``reads`` cache positions) so that it costs at most ``1 + overhead`` times what the
    decode rows cost alone: by ``cost``'s fit, ``overhead * alone / per_row``; without a fit
    (the first steps, or steps that did not vary enough to tell a row's cost), the cap that
    holds for any cost with nothing but non-negative parts, ``overhead * decoding`` (as if
    all the cost were per row). The same safe cap while the fit has not told the reads' part
    apart (``cost.split``): its part per row then carries some of the reads' cost, and a cap
    from it could let through more prompt tokens than the bound allows (a few percent too
    many: hypothesis found one). None (no cap) when nothing decodes: no one waits on the
    step. ``plan_prefill`` still runs one token at least, so a cap of 0 slows a prompt
    down, never stops it."""
    if decoding < 1 or overhead < 0:
        return None
    safe = int(overhead * decoding)
    alone = cost.predict(decoding, reads)
    if alone is None or cost.coef is None or not cost.split:
        return safe
    return max(safe, int(overhead * alone / cost.coef[1]))


K = TypeVar("K", bound=Hashable)


class SlotScheduler(Generic[K]):
    def __init__(self, slots: int, mode: str = "continuous") -> None:
        if mode not in MODES:
            raise ValueError(f"batching_mode must be one of {', '.join(MODES)}; got {mode!r}")
        if slots < 1:
            raise ValueError(f"the number of slots must be at least 1, got {slots}")
        self.mode = mode
        self.slots = 1 if mode == "sequential" else slots
        self.waiting: deque[K] = deque()
        self.active: dict[K, int] = {}
        self._free = list(range(self.slots))  # a heap: the lowest free slot first

    def submit(self, key: K) -> None:
        self.waiting.append(key)

    def admit(self) -> list[tuple[K, int]]:
        """The waiting requests that start now, each with its slot, in arrival order."""
        if self.mode != "continuous" and self.active:
            return []  # a static batch runs to its end before the next one forms
        admitted = []
        while self.waiting and self._free:
            key = self.waiting.popleft()
            slot = heapq.heappop(self._free)
            self.active[key] = slot
            admitted.append((key, slot))
        return admitted

    def finish(self, key: K) -> None:
        """A running sequence ended (done, cancelled or failed): its slot is free at once."""
        heapq.heappush(self._free, self.active.pop(key))

    def cancel(self, key: K) -> None:
        """A request leaves, waiting or running."""
        if key in self.active:
            self.finish(key)
        else:
            try:
                self.waiting.remove(key)
            except ValueError:
                pass

    @property
    def idle(self) -> bool:
        return not self.active and not self.waiting
