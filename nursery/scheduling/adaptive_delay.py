"""A research example: Triton's dynamic batcher whose queue delay follows the arrival rate.

Triton waits up to ``max_queue_delay_microseconds`` for a batch to grow, whatever the traffic.
At a low rate that wait is wasted (no other request is likely to come); at a high rate a
shorter wait already fills the batch. This policy keeps Triton's batch-forming rules
(:class:`~nursery.scheduling.batch_policy.DynamicBatchPolicy`, unchanged) and only sets the
delay on every arrival, from the rate measured over the last ``window`` arrivals (rows per
second, ``r``), with ``D`` the configured delay and ``B`` the largest preferred batch size:

- ``r * D < 1`` (fewer than one more row expected within ``D``): delay 0, send at once;
- otherwise ``min(D, (B - 1) / r)``: about the time a full batch takes to arrive.

The configured delay is therefore an upper bound, so every invariant of Triton's batcher that
bounds waiting still holds (``tests/property/test_batch_invariants.py`` runs against it).
Select it with ``python -m nursery simulate --policy adaptive``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from nursery.scheduling.batch_policy import BatchConfig, BatchItem, DynamicBatchPolicy
from nursery.scheduling.decisions import W


class AdaptiveDelayPolicy(DynamicBatchPolicy[W]):
    def __init__(self, config: BatchConfig, *, window: int = 32,
                 describe: Callable[[W], BatchItem] | None = None) -> None:
        super().__init__(config, describe=describe)
        self.max_delay = config.max_queue_delay_us / 1e6
        preferred = config.preferred_batch_sizes or (max(1, config.max_batch_size),)
        self.target = max(preferred)
        self._arrivals: deque[tuple[float, int]] = deque(maxlen=max(2, window))
        self.delay = 0.0  # the delay in force, for reports and tests
        self.set_queue_delay(0.0)

    @classmethod
    def from_config(cls, batch: BatchConfig, instances: int) -> AdaptiveDelayPolicy[W]:
        return cls(batch)

    def rate(self) -> float:
        """Rows per second over the remembered arrivals (0 until two arrived)."""
        if len(self._arrivals) < 2:
            return 0.0
        span = self._arrivals[-1][0] - self._arrivals[0][0]
        rows = sum(rows for _, rows in list(self._arrivals)[1:])
        return float("inf") if span <= 0 else rows / span

    def arrive(self, item: W, now: float) -> None:
        rows = max(1, self._describe(item).batch_size)
        self._arrivals.append((now, rows))
        rate = self.rate()
        if self.max_delay <= 0 or rate * self.max_delay < 1:
            delay = 0.0
        else:
            delay = min(self.max_delay, (self.target - 1) / rate)
        self.delay = delay
        self.set_queue_delay(delay)
        super().arrive(item, now)
