"""InstanceWorker: one model instance, its own OS thread, its backend.

Receives ``ExecuteBatch`` from its scheduler, runs the batch on its dedicated thread (gather
inputs, execute, split outputs: all off the trio thread), answers each requester on its own
reply channel, then tells the scheduler it is ready again. The backend is loaded on that
thread before ``task_status.started()`` and finalized on it when the inbox closes.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import outcome
import trio

from nursery.actors import mailbox
from nursery.actors.model_client import ModelClient
from nursery.actors.rate_limiter import RateLimiterClient
from nursery.backends.base import BackendFactory, BackendInstance
from nursery.config.model import ModelConfig
from nursery.config.warmup import WarmupSample
from nursery.errors import AnsweredError, ConfigError, InternalError, NurseryError, Unavailable
from nursery.execution import batch as batching
from nursery.execution.classification import classify_response
from nursery.execution.reshape import converted
from nursery.execution.sequence import SlotStates
from nursery.messages import ExecuteBatch, InferWork, InstanceReady, ReleaseSlots, Rescheduled
from nursery.observability.stats import BatchReport
from nursery.observability.tracing import Trace
from nursery.runtime.devices import InstancePlacement
from nursery.runtime.threads import DedicatedThread
from nursery.scheduling.rate_limit_policy import ResourceNeed
from nursery.types import InferenceResponse, Tensor

log = logging.getLogger("nursery.instance")

# Seconds a cancelled worker still waits for the batches on its thread before abandoning it.
ABANDON_GRACE = 1.0
# Seconds an instance's close (a Python model's ``finalize``, a stub's exit) may take at
# unload or shutdown before it is left to finish alone: longer than a batch's grace, since a
# model finalizing is not hung (Triton waits for it; its "Finalize complete" line is logged)
CLOSE_GRACE = 10.0
READY_TIMEOUT = 5.0  # seconds a backend's readiness hook may take (Triton's is_ready limit)


def _run_batch(
    backend: BackendInstance, config: ModelConfig, version: str, batch: ExecuteBatch,
    states: SlotStates | None = None,
) -> tuple[list[InferenceResponse] | NurseryError, BatchReport]:
    """Everything a batch needs, on the instance thread. Errors become the batch's answer."""
    t0 = time.monotonic_ns()
    t1 = t2 = t0
    try:
        requests = [w.request for w in batch.work]
        responses: list[InferenceResponse] | NurseryError
        if batch.rows is not None and states is not None:  # the sequence batcher's batch
            inputs = states.gather(requests, batch.rows)
            names = states.output_names(requests)
            t1 = time.monotonic_ns()
            results = backend.execute(inputs, names)
            t2 = time.monotonic_ns()
            responses = states.scatter(requests, batch.rows, dict(results), version)
        else:
            inputs = batching.gather_inputs(requests, config)
            names = batching.output_names(requests, config)
            t1 = time.monotonic_ns()
            results = backend.execute(inputs, names)
            t2 = time.monotonic_ns()
            responses = batching.split_outputs(
                requests, [w.batch_size for w in batch.work], results, config, version
            )
        responses = _classified(batch, responses, config)
    except NurseryError as exc:
        responses = exc
    except Exception as exc:  # a backend bug must not take the instance down
        log.exception("model '%s' version %s: batch failed", config.name, version)
        responses = InternalError(f"model '{config.name}' failed to execute: {exc}")
    t3 = time.monotonic_ns()
    _stamp(batch, ("COMPUTE_START", t0), ("COMPUTE_INPUT_END", t1),
           ("COMPUTE_OUTPUT_START", t2), ("COMPUTE_END", t3))
    return responses, _report(batch, not isinstance(responses, NurseryError), t0, t1, t2, t3)


def _stamp(batch: ExecuteBatch, *stamps: tuple[str, int]) -> None:
    """The compute stamps of the batch's traced requests."""
    for w in batch.work:
        trace = w.request.trace
        if trace:
            for name, ns in stamps:
                trace.stamp(name, ns)


def _traces(batch: ExecuteBatch, held: bool) -> None:
    """The batch's traced requests are held while it runs (trio thread): a request whose
    client leaves meanwhile keeps its trace open for the compute stamps."""
    for w in batch.work:
        trace = w.request.trace
        if isinstance(trace, Trace):
            if held:
                trace.hold()
            else:
                trace.release()


def _report(batch: ExecuteBatch, succeeded: bool, t0: int, t1: int, t2: int,
            t3: int) -> BatchReport:
    """The batch for the statistics: started at ``t0``, inputs ready at ``t1``, outputs
    started at ``t2``, answered at ``t3`` (time.monotonic_ns)."""
    return BatchReport(
        batch_size=sum(w.batch_size for w in batch.work),
        requests=len(batch.work),
        succeeded=succeeded,
        queue_ns=sum(t0 - w.enqueued_ns for w in batch.work),
        request_ns=sum(t3 - w.enqueued_ns for w in batch.work),
        compute_input_ns=t1 - t0,
        compute_infer_ns=t2 - t1,
        compute_output_ns=t3 - t2,
        finished_ms=time.time_ns() // 1_000_000,
        enqueued_ns=tuple([w.enqueued_ns for w in batch.work]),
        started_ns=t0,
        ended_ns=t3,
        rows=len(batch.rows) if batch.rows else 0,  # padding rows included
    )


def resource_needs(config: ModelConfig,
                   placement: InstancePlacement) -> tuple[tuple[ResourceNeed, ...], int]:
    """The rate-limiter resources and priority of the instance's group."""
    for group in config.proto.instance_group:
        if group.name == placement.group_name:
            limits = group.rate_limiter
            needs = tuple(ResourceNeed(r.name, r.count, r.global_) for r in limits.resources)
            return needs, limits.priority
    return (), 0


def _run_requests(
    backend: Any, config: ModelConfig, version: str, batch: ExecuteBatch,
    states: SlotStates | None = None,
) -> tuple[list[Any] | NurseryError, BatchReport]:
    """A batch for a backend that takes whole requests (``execute_requests``): it answers
    each request itself; ``None`` answers are already on their way (decoupled models)."""
    t0 = time.monotonic_ns()
    responses: list[Any] | NurseryError
    try:
        if batch.rows is not None and states is not None:  # a sequence model's batch
            responses = _run_sequence_requests(backend, batch, states)
        else:
            responses = backend.execute_requests(_normalized(batch.work, config))
    except NurseryError as exc:
        responses = exc
    except Exception as exc:
        log.exception("model '%s' version %s: batch failed", config.name, version)
        responses = InternalError(f"model '{config.name}' failed to execute: {exc}")
    return _requests_answered(batch, responses, t0, config)


def _requests_answered(batch: ExecuteBatch, responses: list[Any] | NurseryError,
                       t0: int, config: ModelConfig,
                       ) -> tuple[list[Any] | NurseryError, BatchReport]:
    """A whole-request batch's answers with its report (its compute ends now)."""
    t1 = time.monotonic_ns()
    # the model gets its inputs at once and its outputs are its answers (Triton's Python
    # backend reports its compute the same way): the input and output stages take no time
    _stamp(batch, ("COMPUTE_START", t0), ("COMPUTE_INPUT_END", t0),
           ("COMPUTE_OUTPUT_START", t1), ("COMPUTE_END", t1))
    failed = isinstance(responses, NurseryError) or any(  # an answered error: executed, a
        isinstance(r, NurseryError) and not isinstance(r, AnsweredError)  # success to Triton
        for r in responses)
    # outputs with a `reshape` are in their dims already: the backend's answers are converted
    # where it makes them (execution/reshape.py), its sender's too
    responses = _classified(batch, responses, config)
    return responses, _report(batch, not failed, t0, t0, t1, t1)  # all of it is "infer"


def _normalized(work: Any, config: ModelConfig) -> Any:
    """The work items with their inputs that have a `reshape` in the model's configuration
    in that shape, as Triton normalizes a request before any backend sees it (a model that
    takes whole requests, a Python model, reads them so; an array backend's batch is reshaped
    where it is gathered)."""
    reshaped = config.reshaped_inputs
    if not reshaped:
        return work
    batching = config.max_batch_size > 0
    out = []
    for w in work:
        inputs = dict(w.request.inputs)
        changed = False
        for name, t in w.request.inputs.items():
            spec = reshaped.get(name)
            if spec is not None and spec.reshape is not None:
                inputs[name] = converted(t, spec.dims, spec.reshape, batching)
                changed = changed or inputs[name] is not t
        out.append(dataclasses.replace(w, request=dataclasses.replace(w.request, inputs=inputs))
                   if changed else w)
    return type(work)(out) if isinstance(work, tuple) else out


def _classified(batch: ExecuteBatch, responses: list[Any] | NurseryError,
                config: ModelConfig) -> list[Any] | NurseryError:
    """The answers with the classes their requests ask for (the classification extension):
    a request whose output cannot be classified gets its own error."""
    if isinstance(responses, NurseryError):
        return responses
    return [classify_response(w.request, r, config)
            for w, r in zip(batch.work, responses, strict=True)]


def _run_sequence_requests(backend: Any, batch: ExecuteBatch, states: SlotStates) -> list[Any]:
    """A sequence batch for a backend that takes whole requests (the Python backend): each
    request gets its row's control tensors, correlation ID and implicit state as extra inputs,
    as Triton gives them; each response's state outputs go back to the slot and are not sent."""
    rows = [row for row in batch.rows or () if row.ready]
    work = [batch.work[row.item] for row in rows]
    # only the extra inputs: each request keeps its own data inputs (ragged ones differ in shape)
    arrays = states.gather([w.request for w in work], rows, data=False)
    extra = states.seq.extra_input_types
    served = []
    for i, w in enumerate(work):
        inputs = dict(w.request.inputs)
        for name, datatype in extra.items():
            array = arrays[name][i:i + 1] if states.batching else arrays[name]
            inputs[name] = Tensor(name, datatype, tuple(array.shape), array)
        served.append(dataclasses.replace(w, request=dataclasses.replace(w.request,
                                                                         inputs=inputs)))
    answers = backend.execute_requests(_normalized(served, states.config))
    out: list[Any] = [None] * len(batch.work)
    state_names = {s.output_name: s.input_name for s in states.seq.states}
    listed = {o.name for o in states.config.outputs}  # a state listed as an output stays one
    for row, answer in zip(rows, answers, strict=True):
        if isinstance(answer, InferenceResponse) and state_names:
            kept = {}
            outputs = []
            for tensor in answer.outputs:
                if tensor.name in state_names:
                    kept[state_names[tensor.name]] = np.array(
                        tensor.data[0] if states.batching else tensor.data, copy=True)
                if tensor.name not in state_names or tensor.name in listed:
                    outputs.append(tensor)
            if kept:
                states.held().setdefault(row.slot, {}).update(kept)
            answer.outputs = outputs
        if row.end:
            states.release([row.slot])
        out[row.item] = answer
    return out


def _warm(backend: BackendInstance, config: ModelConfig, sample: WarmupSample, instance: str,
          iteration: int) -> None:
    """One iteration of a warm-up sample on the instance, with Triton's lines (at
    --log-verbose 1) and its words for a failure (each error followed by "; ")."""
    log.debug("model '%s' instance %s is running warmup sample '%s' for iteration %d",
              config.name, instance, sample.name, iteration)
    try:
        inputs = batching.gather_inputs([sample.request], config)
        backend.execute(inputs, batching.output_names([sample.request], config))
    except Exception as exc:
        log.debug("model '%s' instance %s failed to run warmup sample '%s'", config.name,
                  instance, sample.name)
        raise ConfigError(f"model '{config.name}': failed to run warmup sample "
                          f"'{sample.name}': {getattr(exc, 'message', exc)}; ") from exc


def _answers(work: tuple[InferWork, ...],
             result: list[InferenceResponse] | NurseryError) -> list[tuple[InferWork, Any]]:
    if isinstance(result, NurseryError):
        return [(item, result) for item in work]
    return list(zip(work, result, strict=True))


class InlinePolicy:
    """Whether a batch runs on the trio thread itself instead of the instance's thread.

    Handing a batch to a thread and its answers back costs two cross-thread wake-ups: on this
    class of machine (a VM, 2 cores) about 60 µs each, more than a small model computes. A
    backend that says it is safe to call from the trio thread (``inline_safe``: it cannot hang
    and holds no thread-affine state, as ONNX Runtime on the CPU) has its batches run inline
    while the time they take stays below the hand-offs' cost (a moving average of what batches
    measured, inline or not, refreshed by a threaded batch every ``probe`` batches so a model
    that got slower is noticed) and the batch has no more rows than the largest batch measured
    fast (a bigger batch goes to the thread and is measured there). The hand-offs' cost is
    measured too (``hop_ns``: a batch sent to an idle thread, its round trip less its time
    there), and the bound follows it between ``below_ns`` (100 µs) and ``quiet_below_ns``: on a
    slower host both the model and the hand-offs cost more, and a fixed bound sent a model
    that was cheaper than its hand-offs to the thread (add_sub at c=16 on 2026-11-29's slow
    host: about 120 µs a batch against hand-offs of about twice that). Never for batches whose
    answers must keep their order (``preserve_ordering``), sequence batches (their state lives
    on the thread) or instances under the rate limiter. A request answered inline is answered
    before the scheduler's dispatch returns; nothing else changes for it (statistics, tracing,
    errors).

    ``quiet_below_ns`` is the bound for a batch that holds every request of its model in flight
    (``take(batch, quiet=True)``: nothing else of the model queued, nobody waiting behind it).
    Then the thread's parallelism buys nothing, and running inline saves the two hand-offs
    (about 120 µs) on the request's own latency, so batches up to 300 µs qualify: the peer
    sweep's MLP at concurrency 1 computes a request in about 100 µs. The loop is blocked that
    long only while the model has no other request in flight.

    ``idle_below_ns`` (1 ms) is the bound for a batch that holds every request the whole
    server has in flight (``take(batch, quiet=True, idle=True)``). Nothing then waits on the
    loop but what arrives while the batch runs, and that is read at most this long later.
    What it saves is more than the hand-offs: while the instance's thread runs a batch's
    Python (gathering the inputs, splitting the outputs), the trio thread and it take the
    interpreter lock from each other. Clients that all wait on one batch (a closed loop whose
    requests the batcher gathered into one batch, the peer sweep's MLP at concurrency 4 and
    16) come back to a loop that has nothing else to do."""

    __slots__ = ("enabled", "below_ns", "quiet_below_ns", "idle_below_ns", "avg_ns", "count",
                 "probe", "rows_ok", "quiet_rows_ok", "idle_rows_ok", "hop_ns")

    def __init__(self, enabled: bool, below_ns: int = 100_000, probe: int = 64,
                 quiet_below_ns: int = 300_000, idle_below_ns: int = 1_000_000) -> None:
        self.enabled = enabled
        self.below_ns = below_ns
        self.quiet_below_ns = max(quiet_below_ns, below_ns)
        self.idle_below_ns = max(idle_below_ns, self.quiet_below_ns)
        self.avg_ns = float(self.idle_below_ns)  # unknown: start threaded
        self.count = 0
        self.probe = probe
        self.rows_ok = 0  # the largest batch (rows) measured below ``below_ns``
        self.quiet_rows_ok = 0  # ... below ``quiet_below_ns``
        self.idle_rows_ok = 0  # ... below ``idle_below_ns``
        self.hop_ns = float(below_ns)  # a threaded batch's round trip, less its time there

    @property
    def bound_ns(self) -> float:
        """The bound for any batch: what the hand-offs cost (``hop_ns``), within
        [``below_ns``, ``quiet_below_ns``]."""
        return min(max(self.hop_ns, self.below_ns), self.quiet_below_ns)

    def take(self, batch: ExecuteBatch, quiet: bool = False, idle: bool = False) -> bool:
        if not self.enabled or batch.ordered:
            return False
        self.count += 1
        if self.count % self.probe == 0:
            return False
        rows = sum(w.batch_size for w in batch.work)
        if self.avg_ns < self.bound_ns and rows <= self.rows_ok:
            return True
        if quiet and self.avg_ns < self.quiet_below_ns and rows <= self.quiet_rows_ok:
            return True
        return idle and self.avg_ns < self.idle_below_ns and rows <= self.idle_rows_ok

    def ran(self, ns: int, rows: int) -> None:
        self.avg_ns += (ns - self.avg_ns) / 8
        self.rows_ok = _rows_below(self.rows_ok, ns, rows, int(self.bound_ns))
        self.quiet_rows_ok = _rows_below(self.quiet_rows_ok, ns, rows, self.quiet_below_ns)
        self.idle_rows_ok = _rows_below(self.idle_rows_ok, ns, rows, self.idle_below_ns)

    def timed(self, batch: ExecuteBatch, finished: Callable[[ExecuteBatch, Any], None],
              spent: list[int], result: outcome.Outcome[Any]) -> None:
        """A threaded batch is back (on the trio thread): ``spent`` holds when it was
        submitted (0: behind another batch) and its time on the thread (``_timed``)."""
        submitted, wall = spent
        if submitted:  # it went to an idle thread: the round trip is the hand-offs alone
            self.hop_ns += (time.monotonic_ns() - submitted - wall - self.hop_ns) / 8
        self.ran(wall, sum(w.batch_size for w in batch.work))
        finished(batch, result)


def _timed(spent: list[int], fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on an instance thread, its wall time into ``spent[1]`` (InlinePolicy)."""
    t0 = time.monotonic_ns()
    try:
        return fn(*args)
    finally:
        spent[1] = time.monotonic_ns() - t0


def _rows_below(ok: int, ns: int, rows: int, bound_ns: int) -> int:
    """The largest batch (rows) known to run below ``bound_ns``, after a batch of ``rows``
    took ``ns``: a fast one widens it, a slow one narrows it below its own size."""
    if ns < bound_ns:
        return max(ok, rows)
    return rows - 1 if rows <= ok else ok


def _quiet(client: ModelClient | None, name: str, batch: ExecuteBatch) -> tuple[bool, bool]:
    """Whether ``batch`` holds every request of model ``name`` in flight, and every request of
    the whole server (InlinePolicy's ``quiet`` and ``idle``)."""
    if client is None:
        return False, False
    held = len(batch.work)
    if client.in_flight.get(name, 0) > held:
        return False, False
    return True, sum(client.in_flight.values()) <= held


def _ignore(result: outcome.Outcome[Any]) -> None:
    if isinstance(result, outcome.Error):  # runs on the trio thread: never raise here
        log.error("releasing sequence slots failed: %r", result.error)


def _deliver(pairs: list[tuple[InferWork, Any]]) -> None:
    for item, answer in pairs:
        if answer is None:
            continue  # the backend answers this request itself (decoupled)
        mailbox.answer(item.reply, answer)  # False: the requester stopped waiting


async def run(
    *,
    config: ModelConfig,
    version: str,
    version_path: Path,
    placement: InstancePlacement,
    factory: BackendFactory,
    scheduler: trio.MemorySendChannel[Any],
    slots: int = 1,
    warmup: tuple[WarmupSample, ...] = (),
    rate_limiter: RateLimiterClient | None = None,
    client: ModelClient | None = None,
    abandon_grace: float = ABANDON_GRACE,
    granted: bool = False,
    task_status: trio.TaskStatus[WorkerIntake] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Load the instance, then serve batches until the scheduler closes the
    :class:`WorkerIntake` it got from ``task_status.started``; ``slots`` batches may be queued
    on the thread at once (the scheduler never sends more), so the thread can go from one to
    the next without waiting for the trio thread. With a rate limiter and resources listed for
    this instance, each batch first waits for a grant and runs alone, holding its resources;
    with ``granted`` its scheduler holds the grants instead (asks before it forms a batch,
    releases when the batch's ``InstanceReady`` comes), and each batch runs at once.

    Cancelled (the unload or shutdown deadline passed, or the version failed), the worker
    gives the batches on its thread ``abandon_grace`` seconds more, then abandons the thread:
    their requests are answered UNAVAILABLE, the thread is left to its hung job, and the
    worker returns, so a model that never returns cannot hold up an unload or the shutdown.

    ``client`` goes to the instance's thread as its context: the Python backend's BLS calls
    reach other models through it."""
    needs, priority = resource_needs(config, placement)
    limit_key = (config.name, version, placement.index)
    limiter = rate_limiter if needs else None
    by_scheduler = granted and limiter is not None  # the scheduler asks and releases
    if limiter is not None:
        try:
            await limiter.register(limit_key, placement.device_id, needs, priority)
        except BaseException:
            scheduler.close()  # the version's scheduler must not wait for a worker that
            raise              # never started (its inbox ends when every sender closed)
    thread = DedicatedThread(f"{config.name}:{version}:{placement.name}", context=client)
    backend: BackendInstance | None = None
    # the sequence slots' state lives with the instance and is touched only on its thread
    states = SlotStates(config) if config.sequence is not None else None
    iterative = config.sequence is not None and config.sequence.schedule.iterative
    running: dict[int, ExecuteBatch] = {}  # batches on the thread, by id
    all_done = trio.Event()
    all_done.set()

    def finished(batch: ExecuteBatch, result: outcome.Outcome[Any]) -> None:
        # runs on the trio thread (DedicatedThread.submit), no task switch
        if running.pop(id(batch), None) is None:
            return  # abandoned: its requests were answered already
        _traces(batch, held=False)
        if limiter is not None and not by_scheduler:
            limiter.release(limit_key)
        report: BatchReport | None
        try:
            responses, report = result.unwrap()
        except BaseException as exc:  # _run_batch catches Exception; this is the rest
            responses = InternalError(f"model '{config.name}' failed to execute: {exc!r}")
            report = None
        try:
            pairs = _answers(batch.work, responses)
        except Exception as exc:  # never raise here: a callback's error would end trio
            log.exception("model '%s' version %s: answers of a batch", config.name, version)
            pairs = _answers(batch.work, InternalError(
                f"model '{config.name}' returned answers that do not fit its requests: {exc}"))
        held: tuple[tuple[InferWork, Any], ...] = ()
        rescheduled: tuple[InferWork, ...] = ()
        ended: tuple[Any, ...] = ()
        if iterative:  # a rescheduled request runs again; any other ends its sequence
            rescheduled = tuple([w for w, a in pairs if isinstance(a, Rescheduled)])
            ended = tuple([w.request.sequence_id for w, a in pairs
                          if not isinstance(a, Rescheduled)])
            pairs = [(w, a) for w, a in pairs if not isinstance(a, Rescheduled)]
        if batch.ordered:
            held = tuple(pairs)  # the scheduler releases them in arrival order
        else:
            _deliver(pairs)
        if not mailbox.tell(scheduler, InstanceReady(placement.index, 1, report, held,
                                                     rescheduled, ended)):
            _deliver(list(held))  # the scheduler is gone: the answers go out unordered
            _deliver([(w, Unavailable(f"model '{config.name}' is unloading"))
                      for w in rescheduled])
        if not running:
            all_done.set()

    def start(batch: ExecuteBatch) -> None:
        """The batch onto the thread; ``finished`` answers it there after."""
        nonlocal all_done
        alone = not running  # inline only behind nothing: answers never overtake a batch
        if alone:            # still on the thread (one instance answers in FIFO order)
            all_done = trio.Event()
        running[id(batch)] = batch
        _traces(batch, held=True)
        if alone and inline.take(batch, *_quiet(client, config.name, batch)):
            t0 = time.monotonic_ns()
            result = outcome.capture(runner, backend, config, version, batch,  # type: ignore[call-overload]
                                     states)
            inline.ran(time.monotonic_ns() - t0, sum(w.batch_size for w in batch.work))
            finished(batch, result)
            return
        if starter is not None:  # an instance in a process: no thread waits for the batch
            t0 = time.monotonic_ns()
            if starter(_normalized(batch.work, config), partial(answered, batch, t0)):
                return
        spent = [time.monotonic_ns() if alone else 0, 0]
        thread.submit(partial(_timed, spent, runner), (backend, config, version, batch, states),
                      partial(inline.timed, batch, finished, spent))

    def answered(batch: ExecuteBatch, t0: int, responses: list[Any]) -> None:
        finished(batch, outcome.Value(_requests_answered(batch, responses, t0, config)))

    def accept(message: ExecuteBatch | ReleaseSlots) -> None:  # in the scheduler's task
        if isinstance(message, ReleaseSlots):  # in order with the batches, on the thread
            if states is not None:
                thread.submit(states.release, (message.slots,), _ignore)
        else:
            start(message)

    queued_send, queued = trio.open_memory_channel[ExecuteBatch | ReleaseSlots](math.inf)
    def healthy() -> bool:
        return backend is None or bool(getattr(backend, "healthy", True))

    check = _ReadyCheck()

    async def unready() -> str | None:
        if not healthy():
            return str(getattr(backend, "unhealthy_reason", "")
                       or f"instance {placement.name} is not healthy")
        if backend is None or not getattr(backend, "has_ready_hook", False):
            return None  # no hook: no call to the model at all
        return await check(backend, getattr(backend, "instance_name", placement.name))

    intake = WorkerIntake(accept if limiter is None or by_scheduler else queued_send.send_nowait,
                          healthy, unready, limit_key if by_scheduler else None)
    try:
        async with scheduler:
            backend = await thread.call(factory.load, config, version_path, placement,
                                        abandon_on_cancel=True)
            runner = _run_requests if hasattr(backend, "execute_requests") else _run_batch
            inline = InlinePolicy(enabled=states is None and limiter is None
                                  and bool(getattr(backend, "inline_safe", False)))
            # a backend whose batches go elsewhere (a stub process) may start them from here
            starter = getattr(backend, "start_requests", None) if states is None else None
            for sample in warmup:  # the instance is ready only once its warm-up ran
                for iteration in range(1, sample.count + 1):
                    await thread.call(_warm, backend, config, sample, placement.name, iteration,
                                      abandon_on_cancel=True)
            log.info(
                "model '%s' version %s: instance %s ready (%s %d)",
                config.name, version, placement.name, placement.kind.upper(), placement.device_id,
            )
            task_status.started(intake)
            await scheduler.send(InstanceReady(placement.index, slots))
            if limiter is None or by_scheduler:
                await intake.closed.wait()  # the scheduler hands batches straight to the thread
            else:
                async with trio.open_nursery() as closing:
                    closing.start_soon(_close_when, intake, queued_send)
                    async for message in queued:
                        if isinstance(message, ReleaseSlots):
                            accept(message)
                            continue
                        # asked while the batch before may still run: the limiter grants it
                        # only after that batch released its resources (one batch at a time
                        # holds them), and the turn is weighed against the other instances'
                        await limiter.acquire(limit_key)
                        start(message)
            await all_done.wait()  # answered requests are never dropped (bounded by the
            # version's deadline: past it, the batches still running are abandoned below)
    finally:
        intake.close()  # a batch sent from now on is refused (ClosedResourceError)
        with trio.CancelScope(shield=True):
            if running:
                with trio.move_on_after(abandon_grace):
                    await all_done.wait()
            if thread.abandoned:  # a load or warm-up call that the cancellation gave up on
                with trio.move_on_after(abandon_grace):
                    await thread.caught_up.wait()
            if running or thread.abandoned:
                if limiter is not None and running:
                    limiter.release(limit_key)  # the grant the stuck batch held
                _abandon(config, version, placement.name, running)
                kill = getattr(backend, "kill", None)
                if kill is not None:  # an instance in a process of its own: end it now
                    kill()
            elif backend is not None:
                try:
                    with trio.move_on_after(max(abandon_grace, CLOSE_GRACE)) as waited:
                        await thread.call(backend.close, abandon_on_cancel=True)
                    if waited.cancelled_caught:
                        log.error("model '%s': instance %s did not finish closing; abandoned",
                                  config.name, placement.name)
                except Exception:
                    log.exception("model '%s': instance %s failed to close", config.name,
                                  placement.name)
            thread.stop()
            if limiter is not None:
                limiter.unregister(limit_key)


class _ReadyCheck:
    """A backend's readiness hook, called off the trio thread with Triton's time limit, one
    call at a time per instance, as Triton's Python backend calls ``is_ready()``: a check
    that comes while a call is in flight (even one an earlier check stopped waiting for)
    waits for that call, within the same limit, and shares its answer. A hook that raises,
    answers late or is not a bool: not ready, with the reason in Triton's words (the
    readiness endpoint logs it at --log-verbose 1)."""

    def __init__(self) -> None:
        self._inflight: trio.Event | None = None  # set when the hook call in flight returns
        self._answer: str | None = None  # its answer: None (ready) or why not

    async def __call__(self, backend: Any, instance: str) -> str | None:
        """None when the hook says ready, else why not."""
        inflight = self._inflight
        if inflight is not None:
            with trio.move_on_after(READY_TIMEOUT):
                await inflight.wait()
                return self._answer
            return "Timed out waiting for in-flight is_ready() response"
        self._inflight = done = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def finish(answer: str | None) -> None:  # on the trio thread, whoever waits or not
            self._answer = answer
            self._inflight = None
            done.set()

        def check() -> None:
            answer: str | None
            try:
                answer = None if bool(backend.check_ready()) else (
                    f"Model '{instance}' is not ready (user-defined check failed).")
            except Exception as exc:  # noqa: BLE001 - a failing hook means not ready
                answer = str(getattr(exc, "message", exc))
            try:
                token.run_sync_soon(finish, answer)
            except trio.RunFinishedError:
                pass

        with trio.move_on_after(READY_TIMEOUT):
            await trio.to_thread.run_sync(check, abandon_on_cancel=True)
            await done.wait()
            return self._answer
        return "Timed out waiting for user-defined is_ready() response"


async def _close_when(intake: WorkerIntake, queued: trio.MemorySendChannel[Any]) -> None:
    await intake.closed.wait()
    queued.close()  # the queued batches still run; then the loop ends


class WorkerIntake:
    """The worker's inbox as its scheduler holds it. Without rate-limiter resources a batch
    given to :meth:`send_nowait` goes onto the instance's thread at once, in the scheduler's
    own task: no task switch between the scheduler's decision and the computation. With
    resources, batches queue for the worker's task, which waits for each grant.
    :meth:`aclose` says no more batches will come."""

    def __init__(self, accept: Callable[[ExecuteBatch | ReleaseSlots], None],
                 healthy: Callable[[], bool] = lambda: True,
                 unready: Callable[[], Awaitable[str | None]] | None = None,
                 limit_key: Any = None) -> None:
        self._accept = accept
        self.limit_key = limit_key  # set: the scheduler holds this instance's grants
        self.healthy = healthy  # the instance can serve now (a dead stub: not until restarted)
        self._unready = unready
        self.closed = trio.Event()

    async def unready(self) -> str | None:
        """The instance's readiness as a readiness endpoint asks it: None when it is healthy
        and the backend's own hook (a Python model's ``is_ready()``) says so; else why not
        (Triton's words: "Stub process '<instance>' is not healthy.", ...)."""
        if self._unready is None:
            return None if self.healthy() else "the instance is not healthy"
        return await self._unready()

    def send_nowait(self, message: ExecuteBatch | ReleaseSlots) -> None:
        if self.closed.is_set():
            raise trio.ClosedResourceError("the instance worker takes no more batches")
        self._accept(message)

    def close(self) -> None:
        self.closed.set()

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()


def _abandon(config: ModelConfig, version: str, instance: str,
             running: dict[int, ExecuteBatch]) -> None:
    """The thread is stuck in a job: answer what it held and leave it behind."""
    requests = sum(len(b.work) for b in running.values())
    log.error("model '%s' version %s: instance %s did not return from its model within the "
              "timeout; abandoned its thread and failed %d request(s)", config.name, version,
              instance, requests)
    error = Unavailable(f"model '{config.name}' version {version}: instance {instance} did not "
                        "return within the unload timeout and was abandoned")
    for batch in running.values():
        _deliver([(w, error) for w in batch.work])
        _traces(batch, held=False)
    running.clear()
