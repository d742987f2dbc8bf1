"""Triton's scheduler start delay, a debugging and testing hook: batching waits until enough
requests have queued.

Triton reads two environment variables when it creates a model's scheduler:

- ``TRITONSERVER_DELAY_SCHEDULER=<n>``: the dynamic batcher and the direct sequence batcher
  form no batch until ``n`` requests are queued (the sequence batcher counts the requests
  queued in sequence slots, over all instances);
- ``TRITONSERVER_BACKLOG_DELAY_SCHEDULER=<n>``: with the first, the sequence batcher also
  waits until ``n`` requests are queued in its backlog (sequences that found every slot
  taken).

Once the condition has held, it is dropped for good: from then on the policy batches as it
always does. Triton's own qa tests (L0_batcher, L0_sequence_batcher) set these so that a
known set of requests is queued before the first batch forms, which makes the batch sizes
they check deterministic. Requests are still refused, timed out and reaped while the start
is delayed; only batch forming waits.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger("nursery.scheduler")

DELAY_ENV = "TRITONSERVER_DELAY_SCHEDULER"
BACKLOG_DELAY_ENV = "TRITONSERVER_BACKLOG_DELAY_SCHEDULER"


@dataclass(frozen=True, slots=True)
class StartDelay:
    requests: int = 0  # queued requests (in slots, for the sequence batcher) to wait for
    backlog: int = 0  # requests in the sequence batcher's backlog to wait for

    def waiting(self, queued: int, backlogged: int | None = None) -> bool:
        """True while batch forming must still wait (``backlogged``: None for a scheduler
        without a backlog, which waits for ``requests`` alone)."""
        return queued < self.requests or (backlogged is not None
                                          and backlogged < self.backlog)


def env_count(value: str | None) -> int:
    """C's atoi, as Triton reads its debugging variables (these and the gRPC port's reply
    delay): leading digits, anything else 0; never below 0."""
    text = (value or "").strip()
    digits = ""
    for i, ch in enumerate(text):
        if ch.isdigit() or (i == 0 and ch in "+-"):
            digits += ch
        else:
            break
    try:
        return max(0, int(digits))
    except ValueError:
        return 0


def from_environment(env: Mapping[str, str], model: str = "") -> StartDelay | None:
    """The start delay the environment asks for; None when it asks for none."""
    delay = StartDelay(env_count(env.get(DELAY_ENV)), env_count(env.get(BACKLOG_DELAY_ENV)))
    if not delay.requests:  # Triton looks at the backlog only while it delays anyway
        return None
    log.info("Delaying scheduler for %s until %d queued requests and %d backlog queued "
             "requests...", model, delay.requests, delay.backlog)
    return delay
