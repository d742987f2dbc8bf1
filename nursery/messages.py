"""Every message that travels between actors: small, immutable, behaviour-free.

A message that needs an answer carries its own reply channel (a one-shot
``trio.MemorySendChannel`` of capacity 1). The requester closes its receive end when it stops
waiting (client gone, deadline passed); the scheduler sees that through the channel's
statistics and drops the request without spending model time on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import trio

    from nursery.errors import NurseryError
    from nursery.types import InferenceRequest, InferenceResponse

    Reply = InferenceResponse | NurseryError


@dataclass(frozen=True, slots=True, eq=False)
class InferWork:
    """One validated request on its way to a scheduler (frontend -> scheduler)."""

    request: InferenceRequest
    reply: trio.MemorySendChannel[Reply]
    batch_size: int  # rows this request adds to a batch (1 when the model does not batch)
    enqueued_ns: int  # time.monotonic_ns() when the core accepted it

    def abandoned(self) -> bool:
        """True once nobody waits for the answer any more."""
        return self.reply.statistics().open_receive_channels == 0


@dataclass(frozen=True, slots=True)
class InstanceReady:
    """An instance worker can take ``slots`` more batches (instance worker -> scheduler).

    A worker announces all its slots when it starts and one slot per finished batch."""

    instance: int
    slots: int = 1


@dataclass(frozen=True, slots=True)
class CloseIntake:
    """No new requests will come; finish what is queued and stop (manager -> scheduler)."""


@dataclass(frozen=True, slots=True, eq=False)
class ExecuteBatch:
    """Run these requests together on one instance (scheduler -> instance worker)."""

    work: tuple[InferWork, ...]
