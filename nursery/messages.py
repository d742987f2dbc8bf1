"""Every message that travels between actors: small, immutable, behaviour-free.

A message that needs an answer carries its own reply channel (a one-shot
``trio.MemorySendChannel`` of capacity 1). The requester closes its receive end when it stops
waiting (client gone, deadline passed); the scheduler sees that through the channel's
statistics and drops the request without spending model time on it. A request to a decoupled
model carries an unbounded channel instead, which takes ``nursery.gateway.Part`` messages
(response or error, and whether it is the last) until the final one; a bare error is final.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import trio

    from nursery.errors import NurseryError
    from nursery.stats import BatchReport, StatsSnapshot
    from nursery.types import InferenceRequest, InferenceResponse

    Reply = InferenceResponse | NurseryError


@dataclass(frozen=True, slots=True, eq=False)
class InferWork:
    """One validated request on its way to a scheduler (frontend -> scheduler)."""

    request: InferenceRequest
    reply: trio.MemorySendChannel[Reply]
    batch_size: int  # rows this request adds to a batch (1 when the model does not batch)
    enqueued_ns: int  # time.monotonic_ns() when the core accepted it
    signature: Hashable = None  # requests batch together only when these are equal
    priority: int = 0  # the request's priority parameter (0 = the model's default level)
    timeout_us: int = 0  # the request's timeout parameter (0 = none)

    def abandoned(self) -> bool:
        """True once nobody waits for the answer any more."""
        return self.reply.statistics().open_receive_channels == 0


@dataclass(frozen=True, slots=True)
class InstanceReady:
    """An instance worker can take ``slots`` more batches (instance worker -> scheduler).

    A worker announces all its slots when it starts and one slot per finished batch, with the
    batch's report (for the statistics) and, when the batch asked for ordered replies, the
    answers for the scheduler to release in arrival order."""

    instance: int
    slots: int = 1
    report: BatchReport | None = None
    held: tuple[tuple[InferWork, Any], ...] = ()  # (request, answer) for ordered batches


@dataclass(frozen=True, slots=True, eq=False)
class CancelWork:
    """The requester stopped waiting (client gone); drop it if still queued (core -> scheduler)."""

    work: InferWork


@dataclass(frozen=True, slots=True, eq=False)
class StatsQuery:
    """Ask a scheduler for its statistics (core -> scheduler)."""

    reply: trio.MemorySendChannel[StatsSnapshot]


@dataclass(frozen=True, slots=True)
class CloseIntake:
    """No new requests will come; finish what is queued and stop (manager -> scheduler)."""


@dataclass(frozen=True, slots=True, eq=False)
class ExecuteBatch:
    """Run these requests together on one instance (scheduler -> instance worker)."""

    work: tuple[InferWork, ...]
    ordered: bool = False  # answers go back to the scheduler (preserve_ordering)
