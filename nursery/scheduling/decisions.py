"""What a scheduling policy decides, and the contract every policy meets.

A policy is told about arrivals and free instances (with the current time) and, when polled,
answers with decisions plus the time it next wants to be polled. The actor around it performs
the decisions and sleeps until that time or the next message, whichever comes first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from nursery.errors import ErrorKind

W = TypeVar("W")


@dataclass(frozen=True, slots=True)
class Dispatch(Generic[W]):
    """Run ``items`` together as one batch on ``instance``."""

    instance: int
    items: tuple[W, ...]
    rows: tuple[Any, ...] | None = None  # sequence batcher: one SlotRow per batch row


@dataclass(frozen=True, slots=True)
class Reject(Generic[W]):
    """Answer ``items`` with an error instead of running them."""

    items: tuple[W, ...]
    reason: str
    kind: ErrorKind | None = None  # None: the scheduler's default (UNAVAILABLE)
    # shed for overload: seconds after which a retry may fare better (the HTTP frontend's
    # Retry-After); None: not an overload
    retry_after: float | None = None


@dataclass(frozen=True, slots=True)
class Cancel(Generic[W]):
    """Answer ``items`` CANCELLED without running them (a request their run depended on was
    cancelled: the sequence batcher cancels the rest of a cancelled sequence, as Triton)."""

    items: tuple[W, ...]


@dataclass(frozen=True, slots=True)
class Release:
    """The sequences in these slots of ``instance`` are over: drop their state."""

    instance: int
    slots: tuple[int, ...]


Decision = Dispatch[W] | Reject[W] | Cancel[W] | Release


def rejections(rejected: list[tuple[W, str]],
               kind: ErrorKind | None = None) -> list[Reject[W]]:
    """One :class:`Reject` per reason, each holding its requests in the order rejected."""
    by_reason: dict[str, list[W]] = {}
    for item, reason in rejected:
        by_reason.setdefault(reason, []).append(item)
    return [Reject(tuple(items), reason, kind) for reason, items in by_reason.items()]


@dataclass(frozen=True, slots=True)
class Poll(Generic[W]):
    decisions: list[Decision[W]]
    wake_at: float | None  # poll again at this time even without news; None = only on news


class SchedulingPolicy(Protocol[W]):
    def arrive(self, item: W, now: float) -> None:
        """A request joined the queue."""
        ...

    def instance_ready(self, instance: int, now: float, slots: int = 1) -> None:
        """An instance can take ``slots`` more batches (it started, or finished one)."""
        ...

    def poll(self, now: float) -> Poll[W]:
        """Everything that should happen now, and when to ask again."""
        ...

    def pending(self) -> int:
        """Requests queued and not yet dispatched."""
        ...

    def drain(self) -> list[W]:
        """Remove and return every request still held: the actor answers them when it stops
        (unload deadline, failure), so no accepted request is left without an answer."""
        ...

    def idle_instances(self) -> int: ...

    def add_instance(self, instance: int) -> None:
        """A new instance joined (a reload that changed only the instance groups); it takes
        work once it is ready (:meth:`instance_ready`)."""
        ...

    def retire_instance(self, instance: int) -> None:
        """The instance is leaving: no new work goes to it. It leaves once :meth:`holds` says
        nothing of the policy needs it any more and its batches have finished."""
        ...

    def holds(self, instance: int) -> bool:
        """Whether the policy still needs this retired instance (the sequence batcher: a
        sequence still lives in one of its slots)."""
        ...


class FreeInstances:
    """The instance-set changes of a policy that knows instances only as free or busy (its
    ``_free`` map): a retired instance leaves the map and never comes back to it."""

    _free: dict[int, Any]
    _retired: frozenset[int] = frozenset()

    def add_instance(self, instance: int) -> None:
        """Nothing to do: it becomes free with its first ``instance_ready``."""

    def retire_instance(self, instance: int) -> None:
        self._retired = self._retired | {instance}
        self._free.pop(instance, None)

    def holds(self, instance: int) -> bool:
        return False
