"""Every message that travels between actors: small, immutable, behaviour-free.

A message that needs an answer carries its own reply channel (a one-shot
``trio.MemorySendChannel`` of capacity 1). The requester closes its receive end when it stops
waiting (client gone, deadline passed); the scheduler sees that through the channel's
statistics and drops the request without spending model time on it. A request to a decoupled
model carries an unbounded channel instead, which takes :class:`Part` messages
(response or error, and whether it is the last) until the final one; a bare error is final.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nursery.errors import NurseryError
from nursery.schema import inference as pb
from nursery.types import InferenceRequest, InferenceResponse

if TYPE_CHECKING:  # named in annotations only: a Python stub process loads neither
    import trio

    from nursery.observability.stats import BatchReport, StatsSnapshot

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
class Part:
    """One answer of a streamed request: a response or an error, and whether it is the last."""

    response: InferenceResponse | None
    error: NurseryError | None
    final: bool


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
    # iterative sequences: the requests the model rescheduled (they run again in their
    # sequence's slot) and the sequences whose request completed (they end)
    rescheduled: tuple[InferWork, ...] = ()
    ended: tuple[Hashable, ...] = ()


@dataclass(frozen=True, slots=True)
class Rescheduled:
    """A request's answer from a model that released it with
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE: it runs again instead of being answered."""


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
class UpdateInstances:
    """A reload changed only the instance groups (version -> scheduler): ``added`` instances
    (index -> the worker's intake; each announces itself with ``InstanceReady``) join,
    ``retired`` ones take no new work and are closed once their batches end (and, under the
    sequence batcher, once no sequence lives in their slots). The reply: the retired instances
    that are closed without waiting for a sequence."""

    added: Mapping[int, Any]
    retired: tuple[int, ...]
    reply: trio.MemorySendChannel[Any]


@dataclass(frozen=True, slots=True, eq=False)
class ExecuteBatch:
    """Run these requests together on one instance (scheduler -> instance worker)."""

    work: tuple[InferWork, ...]
    ordered: bool = False  # answers go back to the scheduler (preserve_ordering)
    rows: tuple[Any, ...] | None = None  # sequence batcher: one SlotRow per batch row


@dataclass(frozen=True, slots=True)
class ReleaseSlots:
    """These sequence slots' sequences are over: drop their state (scheduler -> instance
    worker, in order with the batches)."""

    slots: tuple[int, ...]


@dataclass(frozen=True, slots=True, eq=False)
class CacheLookup:
    """Is there an answer for this key? (core -> ResponseCache; reply: response or None)"""

    key: bytes
    reply: trio.MemorySendChannel[Any]


@dataclass(frozen=True, slots=True, eq=False)
class CacheInsert:
    """Keep this answer for this key (core -> ResponseCache, no reply). The sender gives the
    cache its own read-only copy (``cache_store.frozen_copy``)."""

    key: bytes
    response: InferenceResponse


@dataclass(frozen=True, slots=True, eq=False)
class CacheStatsQuery:
    """Ask the ResponseCache for its totals (metrics -> ResponseCache)."""

    reply: trio.MemorySendChannel[Any]


@dataclass(frozen=True, slots=True)
class CacheOutcome:
    """A request of this version was answered from the cache (hit) or looked up and then
    inserted (miss): for the version's statistics (core -> scheduler)."""

    hit: bool
    cache_ns: int  # lookup (hit), or lookup + insert (miss)
    request_ns: int = 0  # the whole request, for hits (they never reach a worker)


@dataclass(frozen=True, slots=True, eq=False)
class RegisterInstance:
    """An instance that lists rate-limiter resources is starting (worker -> RateLimiter;
    reply: None, or the error that must fail the load)."""

    key: Hashable
    device: int
    needs: tuple[Any, ...]  # nursery.scheduling.rate_limit_policy.ResourceNeed
    priority: int
    reply: trio.MemorySendChannel[Any]


@dataclass(frozen=True, slots=True)
class UnregisterInstance:
    key: Hashable


@dataclass(frozen=True, slots=True, eq=False)
class AcquireResources:
    """The instance has a batch to run (worker -> RateLimiter; reply: a grant, once its
    resources are free and its turn has come)."""

    key: Hashable
    reply: trio.MemorySendChannel[Any]


@dataclass(frozen=True, slots=True)
class ReleaseResources:
    """The instance's batch ended (worker -> RateLimiter)."""

    key: Hashable


@dataclass(frozen=True, slots=True)
class DecoupledResponse:
    """One response of a decoupled model reached its requester (model client -> scheduler), for the
    version's ``response_stats`` and first-response histogram."""

    index: int  # 0 for the first response of the request
    kind: str  # "success", "fail" or "empty_response"
    ns: int  # since the previous response (the request's arrival for the first)
    first_response_ns: int  # request arrival -> this response, for index 0
    buckets: tuple[float, ...]  # the first-response histogram's bounds (ms), from the config


# -- the ModelManager's commands (core, repository poller -> ModelManager) -----------------


@dataclass(frozen=True, slots=True, eq=False)
class LoadModel:
    """Load or reload a model; ``config`` and ``files`` override what is on disk (reply: None,
    or the error that failed the load)."""

    name: str
    reply: trio.MemorySendChannel[NurseryError | None]
    config: pb.ModelConfig | None = None
    files: Mapping[str, bytes] | None = None  # "<version>/<path>" -> content (needs config)
    # with --model-namespacing: only the model of this namespace (the poller's); None: the
    # model of that name in every repository
    namespace: str | None = None


@dataclass(frozen=True, slots=True, eq=False)
class UnloadModel:
    """Unload a model (and the models only its ensembles loaded, with ``unload_dependents``)."""

    name: str
    reply: trio.MemorySendChannel[NurseryError | None]
    unload_dependents: bool = False
    namespace: str | None = None  # as LoadModel's


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One row of the repository index: a model, or one version of it with its state."""

    name: str
    version: int | None = None
    state: str | None = None
    reason: str = ""

    def as_json(self) -> dict[str, Any]:
        """The row as the repository index answers it (absent fields left out)."""
        out: dict[str, Any] = {"name": self.name}
        if self.version is not None:
            out["version"] = str(self.version)
        if self.state is not None:
            out["state"] = self.state
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True, slots=True, eq=False)
class IndexRepository:
    """List the repository's models and their states (answered at once, never queued)."""

    ready_only: bool
    reply: trio.MemorySendChannel[list[IndexEntry] | NurseryError]


@dataclass(frozen=True, slots=True, eq=False)
class RegisterRepository:
    """Add a model repository, its folders ``names`` mapped to model names (Triton's
    repository registration; reply: None, or the error that refused it)."""

    path: Path
    names: tuple[tuple[str, str], ...]
    reply: trio.MemorySendChannel[NurseryError | None]


@dataclass(frozen=True, slots=True, eq=False)
class UnregisterRepository:
    """Remove a registered repository (its loaded models stay loaded; reply as above)."""

    path: Path
    reply: trio.MemorySendChannel[NurseryError | None]


ManagerCommand = (LoadModel | UnloadModel | IndexRepository | RegisterRepository
                  | UnregisterRepository)
