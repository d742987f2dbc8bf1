"""Which scheduling policy a model's configuration asks for, and how many batches each of its
instances may hold: Triton's choice between the sequence batcher, the dynamic batcher and the
default scheduler, as one pure function."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic

from nursery.config.model import ModelConfig
from nursery.scheduling.batch_policy import BatchConfig, DynamicBatchPolicy
from nursery.scheduling.decisions import SchedulingPolicy, W
from nursery.scheduling.fifo import FifoPolicy
from nursery.scheduling.latency_objective import LatencyObjectivePolicy
from nursery.scheduling.sequence_policy import SequencePolicy
from nursery.scheduling.start_delay import StartDelay

MAX_QUEUE = 65536  # requests the default scheduler holds before rejecting (UNAVAILABLE)
# Places per instance under the default scheduler: the thread holds its next request while it
# computes (see nursery/scheduling/fifo.py).
DEFAULT_SCHEDULER_SLOTS = 2


@dataclass(frozen=True, slots=True)
class PolicyChoice(Generic[W]):
    policy: SchedulingPolicy[W]
    slots: int  # batches one instance holds at once


def policy_for(config: ModelConfig, instances: int,
               describe: Callable[[W], Any] = lambda work: work,
               signature: Callable[[W], Hashable] | None = None,
               start_delay: StartDelay | None = None) -> PolicyChoice[W]:
    """The policy of one version of ``config`` served by ``instances`` instances
    (``describe`` and ``signature``: what the sequence batcher reads of a request;
    ``start_delay``: Triton's TRITONSERVER_DELAY_SCHEDULER hook, for the dynamic and
    sequence batchers)."""
    if config.sequence is not None:
        # the SequenceBatcher: one batch at a time per instance
        return PolicyChoice(SequencePolicy[W](config.sequence.schedule, instances,
                                              model=config.name, describe=describe,
                                              signature=signature,
                                              start_delay=start_delay), 1)
    if config.objective is not None:
        # nursery's latency-objective batcher (parameters nursery.batcher ...), with the
        # dynamic_batching block's priority levels and queue bounds when there is one
        batch = config.batching or BatchConfig(max_batch_size=config.max_batch_size)
        return PolicyChoice(LatencyObjectivePolicy[W](batch, config.objective,
                                                      model=config.name), 1)
    if config.batching is not None:
        # the DynamicBatcher: batches form while instances are busy, so an instance takes
        # one batch at a time
        return PolicyChoice(DynamicBatchPolicy[W](config.batching, start_delay=start_delay), 1)
    return PolicyChoice(FifoPolicy[W](DEFAULT_SCHEDULER_SLOTS, MAX_QUEUE), DEFAULT_SCHEDULER_SLOTS)
