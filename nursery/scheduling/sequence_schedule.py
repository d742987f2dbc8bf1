"""A model's sequence batching settings, as the sequence batcher's policy reads them.

Apart from ``sequence_policy.py`` so that reading a model's configuration (which holds them,
``config/sequence.py``), as a Python stub process does at its start, does not load the policy.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SequenceSchedule:
    """What the policy needs from ``execution/sequence.py`` (see ``nursery/config/sequence.py``)."""

    strategy: str = "direct"  # "direct" or "oldest"
    slots_per_instance: int = 1
    max_batch_size: int = 1  # rows in one batch (1 when the model does not batch)
    idle_us: int = 1_000_000
    preferred_batch_sizes: tuple[int, ...] = ()  # oldest only
    max_queue_delay_us: int = 0
    min_slot_utilization: float = 0.0  # direct only: rows ready / max_batch_size to run at once
    # iterative_sequence: a request without a correlation ID starts a sequence of its own;
    # the model may send a request back (rescheduled) to run again in its slot, and a request
    # that completes without being rescheduled ends its sequence
    iterative: bool = False
