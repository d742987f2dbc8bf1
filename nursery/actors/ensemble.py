"""EnsembleScheduler: runs an ensemble's step graph for each request.

The ensemble's version nursery holds this one actor (an ensemble has no instances). Its inbox
takes what any scheduler's does (``InferWork``, ``CancelWork``, ``StatsQuery``,
``CloseIntake``). Each request flows through the graph in a task of its own: every step whose
input tensors exist starts at once (independent steps run concurrently), as a request to the
step's model through ``infer`` (the server's core: that model's own scheduler, so its
batching applies). Tensors pass between steps as the same numpy arrays, renamed, never
copied. An optional ensemble input the request leaves out is left out of the requests of the
steps that read it (they still run, as in Triton). The first failing step fails the request
("in ensemble '<name>', ..."), the other steps of that request are cancelled; when every step
has run, the requested ensemble outputs are the answer. As in Triton, only the steps the
requested outputs need run, and a step output its model did not produce is absent, not an
error: a later step gets no such input, the answer leaves it out. The graph bookkeeping is the
pure
:class:`~nursery.scheduling.ensemble_plan.Flow`.

A *decoupled* ensemble (one with a decoupled step: the manager serves it so, as Triton fills in
its ``model_transaction_policy``) runs as Triton's does, by iteration (the pure
:class:`~nursery.scheduling.ensemble_plan.IterFlow`): every response of a step feeds the steps
after it once more, and every time the ensemble outputs are complete for an iteration the
ensemble sends a response, as a stream of :class:`~nursery.messages.Part` on the request's
reply channel (the protocol of a decoupled model); the last response carries the final flag,
or a bare final flag follows when no step is left running.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from itertools import count
from operator import itemgetter
from pathlib import Path
from typing import Any

import trio

from nursery.actors import mailbox
from nursery.config.model import ModelConfig, TensorSpec
from nursery.errors import Cancelled, InternalError, InvalidArgument, NurseryError, Unavailable
from nursery.execution.classification import classify_response
from nursery.messages import (
    CacheOutcome,
    CancelWork,
    CloseIntake,
    InferWork,
    Part,
    StatsQuery,
)
from nursery.observability.stats import BatchReport, StatsAccumulator
from nursery.observability.tracing import child_of
from nursery.runtime.supervision import Boundary, FaultCounter
from nursery.scheduling.ensemble_plan import EnsemblePlan, IterFlow
from nursery.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor

log = logging.getLogger("nursery.ensemble")

# Seconds a step waits for room under max_inflight_requests before it goes anyway (Triton's
# kMutexTimeoutSeconds: a stuck limit must not deadlock the ensemble)
STEP_WAIT_LIMIT = 300.0

Infer = Callable[[InferenceRequest], Awaitable[InferenceResponse]]
OnPart = Callable[[Any], Awaitable[None]]
Stream = Callable[[InferenceRequest, OnPart], Awaitable[None]]  # Gateway.stream


class StepLimit:
    """``max_inflight_requests`` for one step (Triton's StepInflightRequestLimiter): shared by
    every request of the ensemble, a step request takes a place before it is sent and gives it
    back when its model's final answer came, so a fast producer cannot flood a slow consumer.
    A place not found within ``STEP_WAIT_LIMIT`` seconds is taken anyway (logged)."""

    def __init__(self, ensemble: str, step: int, limit: int) -> None:
        self.ensemble, self.step, self.limit = ensemble, step, limit
        self.inflight = 0
        self._waiting = trio.lowlevel.ParkingLot()

    async def acquire(self) -> None:
        with trio.move_on_after(STEP_WAIT_LIMIT) as waited:
            while self.inflight >= self.limit:
                await self._waiting.park()
        if waited.cancelled_caught:
            log.error("Ensemble '%s' unable to schedule step %d (inflight: %d >= limit: %d) "
                      "for %.0f seconds; proceeding to avoid deadlock", self.ensemble,
                      self.step, self.inflight, self.limit, STEP_WAIT_LIMIT)
        self.inflight += 1

    def release(self) -> None:
        if self.inflight:
            self.inflight -= 1
            self._waiting.unpark()


def step_limits(plan: EnsemblePlan) -> list[StepLimit] | None:
    if plan.max_inflight <= 0:
        return None
    return [StepLimit(plan.name, i, plan.max_inflight) for i in range(len(plan.steps))]


def _step_error(plan: EnsemblePlan, index: int, error: NurseryError) -> NurseryError:
    model = plan.steps[index].model_name
    message = error.message
    if f"'{model}" not in message:  # name the step when the model's message does not
        message = f"step {index} (model '{model}'): {message}"
    return NurseryError(f"in ensemble '{plan.name}', {message}", error.kind)


def _renamed(name: str, t: Tensor) -> Tensor:
    return Tensor(name, t.datatype, t.shape, t.data)


def _sequence_parameters(request: InferenceRequest) -> dict[str, Any]:
    """An ensemble's answer to a request of a sequence names the sequence and its flags, as
    Triton's EnsembleContext does (each step output carries its step request's correlation ID
    and flags, which the steps take from the ensemble's request)."""
    if not request.sequence_id:
        return {}
    return {"sequence_id": request.sequence_id, "sequence_start": request.sequence_start,
            "sequence_end": request.sequence_end}


def _shaped(name: str, t: Tensor, shape: tuple[int, ...]) -> Tensor:
    if shape == t.shape:
        return _renamed(name, t)
    return Tensor(name, t.datatype, shape, t.data.reshape(shape))


def _step_request(plan: EnsemblePlan, index: int, request: InferenceRequest,
                  inputs: Mapping[str, Tensor | None]) -> InferenceRequest:
    """The request to a step's model: ``inputs`` by the model's input names (an absent
    tensor, None, is left out, as Triton does; a batch dim of 1 added or taken away where a
    batching and a non-batching model meet), the step's outputs requested, and the ensemble
    request's id, parameters, priority, timeout, correlation ID and sequence flags (Triton's
    EnsembleContext gives every step request the ensemble request's). A traced ensemble
    request's steps are traced as its children, as Triton's; the steps of an untraced one are
    never sampled."""
    step = plan.steps[index]
    return InferenceRequest(
        step.model_name, step.version_str,
        {n: _shaped(n, t, plan.step_input_shape(index, n, t.shape))
         for n, t in inputs.items() if t is not None},
        tuple([RequestedOutput(o) for o in step.output_map]), request.id,
        request.parameters, request.priority, request.timeout_us,
        trace=child_of(request.trace), sequence_id=request.sequence_id,
        sequence_start=request.sequence_start, sequence_end=request.sequence_end,
        model_namespace=plan.namespace)


def _answer_output(plan: EnsemblePlan, name: str, t: Tensor) -> Tensor:
    return _shaped(name, t, plan.answer_shape(name, t.shape))


def _ensemble_inputs(plan: EnsemblePlan, inputs: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The request's inputs as ensemble tensors: an input with a `reshape` in the ensemble's
    configuration takes that shape (Triton normalizes the request so before its ensemble
    scheduler sees it)."""
    return {n: _shaped(n, t, plan.input_shape(n, t.shape)) for n, t in inputs.items()}


async def run_flow(plan: EnsemblePlan, version: str, request: InferenceRequest,
                   infer: Infer, limits: list[StepLimit] | None = None) -> InferenceResponse:
    """One request through the graph; raises the failing step's error. ``limits``: the
    ensemble's max_inflight_requests, one per step."""
    tensors: dict[str, Tensor | None] = dict.fromkeys(plan.inputs)  # None: absent
    tensors.update(_ensemble_inputs(plan, request.inputs))
    wanted = [o.name for o in request.requested_outputs] or list(plan.outputs)
    flow = plan.start(wanted)
    send, receive = trio.open_memory_channel[tuple[int, Any]](math.inf)

    def step_request(index: int) -> InferenceRequest:
        step = plan.steps[index]  # an optional input the request left out is left out here
        return _step_request(plan, index, request, step.request_inputs(tensors))

    async def call(index: int) -> Any:
        try:
            return await infer(step_request(index))
        except NurseryError as error:
            return error
        finally:
            if limits is not None:
                limits[index].release()

    async def run_step(index: int) -> None:
        send.send_nowait((index, await call(index)))

    failure: NurseryError | None = None
    running = 0
    async with trio.open_nursery() as steps:
        ready = flow.take_ready()
        while not flow.complete():
            if len(ready) == 1 and running == 0:
                index = ready[0]  # a chain: the step runs right here, no task, no hop
                if limits is not None:
                    await limits[index].acquire()
                answer = await call(index)
            else:
                for i in ready:
                    if limits is not None:
                        await limits[i].acquire()
                    steps.start_soon(run_step, i)
                running += len(ready)
                index, answer = await receive.receive()
                running -= 1
            step = plan.steps[index]
            if not isinstance(answer, NurseryError):
                for written in step.output_map.values():
                    tensors[written] = None  # absent unless the model produced it
                for out in answer.outputs:
                    name = step.output_map.get(out.name)
                    if name is not None:
                        tensors[name] = _renamed(name, out)
            if isinstance(answer, NurseryError):
                failure = _step_error(plan, index, answer)
                steps.cancel_scope.cancel()  # the request failed: its other steps stop
                break
            flow.finished(index)
            ready = flow.take_ready()
    if failure is not None:
        raise failure
    outputs = []
    for name in wanted:
        value = tensors.get(name)
        if value is not None:
            outputs.append(_answer_output(plan, name, value))
        else:  # absent: the answer leaves it out (Triton's verbose line)
            log.debug("Composing models did not output tensor %s", name)
    return InferenceResponse(plan.name, version, outputs, id=request.id,
                             parameters=_sequence_parameters(request))


class CallbackFlow:
    """One request through the graph with no task waiting on its steps (what :func:`run`
    uses for a non-decoupled ensemble when it can): each step is queued with
    ``ModelClient.dispatch``, and its answer is handed to :meth:`_answered` right where the
    step's model delivers it, which queues the steps it readies at once. So the steps of
    concurrent requests reach each model in the order the answers before them came (however
    trio orders the tasks a batch's answers wake), a stream's answers keep its order, and a
    chain of steps costs no task switch per step. ``done`` gets the answer (the response or
    the request's error) once, unless :meth:`abandon` came first. A step that cannot be
    dispatched so (tracing switched on meanwhile) runs in a task of ``spawn``."""

    def __init__(self, plan: EnsemblePlan, version: str, request: InferenceRequest,
                 client: Any, done: Callable[[Any], None],
                 spawn: Callable[..., None]) -> None:
        self.plan, self.version, self.request, self.client = plan, version, request, client
        self.done, self.spawn = done, spawn
        self.tensors: dict[str, Tensor | None] = dict.fromkeys(plan.inputs)
        self.tensors.update(_ensemble_inputs(plan, request.inputs))
        self.wanted = [o.name for o in request.requested_outputs] or list(plan.outputs)
        self.flow = plan.start(self.wanted)
        self.outstanding: dict[int, Callable[[], None]] = {}  # step -> its abandon
        self.over = False

    def start(self) -> None:
        if self.flow.complete():
            self.end(self._response())
            return
        for index in self.flow.take_ready():
            self._send(index)

    def abandon(self) -> None:
        """The request was cancelled: its queued steps are dropped, ``done`` never comes."""
        self.over = True
        outstanding, self.outstanding = self.outstanding, {}
        for abandon in outstanding.values():
            abandon()

    def _send(self, index: int) -> None:
        if self.over:
            return
        plan, client = self.plan, self.client
        step = plan.steps[index]  # an optional input the request left out is left out here
        request = _step_request(plan, index, self.request, step.request_inputs(self.tensors))
        try:
            handle = client.resolve(request.model_name, request.model_version,
                                    request.model_namespace)
            if handle.config.decoupled:  # ModelClient.infer_one's refusal, in its words
                raise InvalidArgument(
                    f"model '{handle.name}' uses the decoupled transaction policy; it must be "
                    "called with decoupled=True (a stream of responses)")
            abandon = client.dispatch(request, handle, partial(self._answered, index))
        except NurseryError as error:  # refused before it was queued: the request fails
            self.end(_step_error(plan, index, error))
            return
        if abandon is None:
            self.spawn(self._slowly, index, request)
            self.outstanding[index] = lambda: None
        else:
            self.outstanding[index] = abandon

    async def _slowly(self, index: int, request: InferenceRequest) -> None:
        try:
            answer: Any = await self.client.infer_one(request)
        except NurseryError as error:
            answer = error
        self._answered(index, answer)

    def _answered(self, index: int, answer: Any) -> None:
        if self.over or self.outstanding.pop(index, None) is None:
            return  # abandoned, or the request already failed
        try:
            plan = self.plan
            if isinstance(answer, NurseryError):
                self.end(_step_error(plan, index, answer))
                return
            step = plan.steps[index]
            for written in step.output_map.values():
                self.tensors[written] = None  # absent unless the model produced it
            for out in answer.outputs:
                name = step.output_map.get(out.name)
                if name is not None:
                    self.tensors[name] = _renamed(name, out)
            self.flow.finished(index)
            if self.flow.complete():
                self.end(self._response())
                return
            for ready in self.flow.take_ready():
                self._send(ready)
        except Exception as exc:  # noqa: BLE001 - this request's boundary (the model's
            # answering code runs this: nothing may reach it)
            log.exception("in ensemble '%s': a request failed unexpectedly", self.plan.name)
            self.end(InternalError(f"in ensemble '{self.plan.name}': {exc!r}"))

    def _response(self) -> InferenceResponse:
        outputs = []
        for name in self.wanted:
            value = self.tensors.get(name)
            if value is not None:
                outputs.append(_answer_output(self.plan, name, value))
            else:  # absent: the answer leaves it out (Triton's verbose line)
                log.debug("Composing models did not output tensor %s", name)
        return InferenceResponse(self.plan.name, self.version, outputs, id=self.request.id,
                                 parameters=_sequence_parameters(self.request))

    def end(self, answer: Any) -> None:
        """Give the request its answer (once) and drop its steps still queued."""
        if self.over:
            return
        self.abandon()
        self.done(answer)


def _callbacks_serve(plan: EnsemblePlan, client: Any) -> bool:
    """Whether a request can run as a :class:`CallbackFlow` (its steps dispatched with no
    task): not while tracing samples requests (a traced step request needs its task), nor
    when a step model answers from the response cache."""
    if client is None or client.tracer.active:
        return False
    if client.cache is None:
        return True
    for step in plan.steps:
        try:
            if client.resolve(step.model_name, step.version_str,
                              plan.namespace).config.uses_response_cache:
                return False
        except NurseryError:
            pass  # the step fails in the flow, with its words
    return True


async def run_decoupled_flow(plan: EnsemblePlan, version: str, request: InferenceRequest,
                             stream: Stream, emit: Callable[[Any], None],
                             limits: list[StepLimit] | None = None) -> None:
    """One request through a decoupled ensemble: ``emit`` gets each
    :class:`~nursery.messages.Part` of the answer, the last one final. Raises the first
    failing step's error (no further part is emitted then)."""
    wanted = [o.name for o in request.requested_outputs] or list(plan.outputs)
    flow = IterFlow(plan, wanted)
    send, receive = trio.open_memory_channel[tuple[int, Any]](math.inf)

    runs: list[list[int]] = []  # per run: step, iteration, responses so far

    async def run_step(run: int, index: int, iteration: int) -> None:
        step_request = _step_request(plan, index, request,
                                     flow.inputs(index, iteration))  # type: ignore[arg-type]

        async def on_part(part: Any) -> None:
            send.send_nowait((run, part))

        try:
            await stream(step_request, on_part)
        finally:
            if limits is not None:
                limits[index].release()

    running = 0
    failure: NurseryError | None = None  # raised after the nursery (not wrapped in a group)
    # with max_inflight_requests a step's runs wait for a place in a starter task of their
    # own, in the order they became ready, while this loop goes on taking the parts that
    # come: Triton holds back the upstream response that would issue the step, never the
    # answers of the other steps (waiting here held every later part, the ensemble's
    # finished answers too, behind a full step)
    starters: dict[int, trio.MemorySendChannel[int]] = {}

    async def starter(index: int, pending: trio.MemoryReceiveChannel[int],
                      steps: trio.Nursery) -> None:
        assert limits is not None
        async for run in pending:
            await limits[index].acquire()
            steps.start_soon(run_step, run, index, runs[run][1])

    async with trio.open_nursery() as steps:
        # an optional input the request left out is absent (None), as Triton's placeholder
        given = _ensemble_inputs(plan, request.inputs)
        updates = flow.add_inputs({n: given.get(n) for n in plan.inputs})
        try:
            while True:
                for index, iteration in flow.ready(updates):
                    runs.append([index, iteration, 0])
                    running += 1
                    if limits is None:
                        steps.start_soon(run_step, len(runs) - 1, index, iteration)
                        continue
                    if index not in starters:
                        starters[index], pending = trio.open_memory_channel[int](math.inf)
                        steps.start_soon(starter, index, pending, steps)
                    starters[index].send_nowait(len(runs) - 1)
                answers = flow.answers(updates)
                for k, iteration in enumerate(answers):
                    outputs = []
                    for name in wanted:
                        value = flow.output(name, iteration)
                        if value is not None:
                            outputs.append(_answer_output(plan, name, value))  # type: ignore[arg-type]
                        else:  # absent: the answer leaves it out (Triton's verbose line)
                            log.debug("Composing models did not output tensor %s", name)
                    final = running == 0 and k == len(answers) - 1
                    emit(Part(InferenceResponse(plan.name, version, outputs, id=request.id,
                                                parameters=_sequence_parameters(request)), None,
                              final))
                if running == 0:
                    if not answers:
                        emit(Part(None, None, True))  # no step left: the bare final flag
                    break
                run, part = await receive.receive()
                index, iteration, seen = runs[run]
                if part.error is not None:
                    failure = _step_error(plan, index, part.error)
                    steps.cancel_scope.cancel()  # the request failed: its other steps stop
                    break
                if part.final:
                    running -= 1
                updates = []
                if part.response is not None:
                    step = plan.steps[index]
                    produced: dict[str, Tensor | None] = dict.fromkeys(step.output_map)
                    produced.update((o.name, o) for o in part.response.outputs
                                    if o.name in step.output_map)
                    runs[run][2] += 1
                    # a run's one and only answer stays at its iteration; a stream gets new ones
                    updates = flow.add_outputs(index, produced,
                                               iteration if part.final and seen == 0 else None)
        finally:  # the starters end with the flow
            for waiting in starters.values():
                waiting.close()
    if failure is not None:
        raise failure


async def run(
    *,
    plan: EnsemblePlan,
    version: str,
    infer: Infer,
    inbox: trio.MemoryReceiveChannel[Any],
    stream: Stream | None = None,
    faults: FaultCounter | None = None,
    summaries: bool = False,
    client: Any = None,
    config: ModelConfig | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve requests until every sender of the inbox is gone, then let the requests in
    flight finish. With ``stream`` the ensemble is decoupled: it answers in parts. With
    ``client`` (the server's ModelClient) a request's steps are dispatched with no task
    waiting on them where nothing needs one (:class:`CallbackFlow`); else ``infer`` runs
    each step in the request's task. With ``config`` (the ensemble's) the answers carry the
    classes their requests ask for (labels as :func:`label_source` finds them)."""
    faults = faults or FaultCounter()
    labels = label_source(config, client.resolve if client is not None else None) \
        if config is not None else None

    def deliver(work: InferWork, answer: Any) -> None:
        if labels is not None:
            answer = _classified(work, answer, config, labels)
        _answer(work, answer)

    # every request's first response goes into the histogram: a decoupled ensemble's first
    # part, another's one answer (Triton's first-response histogram, ensembles included)
    buckets = config.first_response_buckets if config is not None else ()
    stats = StatsAccumulator(summaries, () if stream is not None else buckets)
    limits = step_limits(plan)
    if limits is not None:  # Triton's line, which scripts look for
        log.info("Ensemble model '%s' configured with max_inflight_requests: %d", plan.name,
                 plan.max_inflight)
    scopes: dict[int, trio.CancelScope] = {}  # id(work) -> the scope of its flow
    # answers finished in one scheduling round leave in the order their requests came: trio
    # wakes the tasks a batch's answers woke in either order, so each finished answer waits
    # here for the round to end (a stream's answers keep its order, as in Triton)
    finished: list[tuple[int, InferWork, Any]] = []
    wake, woken = trio.open_memory_channel[None](math.inf)
    arrivals = count()

    def finish(arrival: int, work: InferWork, answer: Any) -> None:
        if not finished:
            wake.send_nowait(None)
        finished.append((arrival, work, answer))

    async def answer_in_order() -> None:
        async for _ in woken:
            finished.sort(key=itemgetter(0))
            for _arrival, work, answer in finished:
                deliver(work, answer)
            finished.clear()

    async def serve(work: InferWork,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        answer: Any
        arrival = next(arrivals)
        # started at once: this task goes on to queue its first steps before its first
        # wait, and only then does the loop take the next request, so the steps of
        # successive requests reach each model in the order the requests came (a stream's
        # answers and a sequence's requests keep their order, as in Triton)
        task_status.started()
        if stream is None and limits is None and _callbacks_serve(plan, client):
            await serve_by_callbacks(work)
            return
        with trio.CancelScope() as scope:
            scopes[id(work)] = scope
            # one request is the unit of failure: an unexpected error answers it INTERNAL
            with Boundary(faults, "model", log, f"a request of ensemble '{plan.name}'") as b:
                try:
                    if stream is not None:
                        await run_decoupled_flow(plan, version, work.request, stream,
                                                 parts(work), limits)
                        answer = None  # every part is sent
                    else:
                        answer = await run_flow(plan, version, work.request, infer, limits)
                except NurseryError as error:
                    answer = error
                finally:
                    del scopes[id(work)]
            if b.failure is not None:
                answer = InternalError(f"in ensemble '{plan.name}': {b.failure}")
        if scope.cancelled_caught:
            stats.record_failure("CANCELED")
            answer = Cancelled("")
        else:
            record(work, answer)
        if answer is not None:
            finish(arrival, work, answer)

    def record(work: InferWork, answer: Any) -> None:
        now = time.monotonic_ns()
        if isinstance(answer, NurseryError):
            # a failed ensemble request is a failure (reason OTHER), not an execution:
            # Triton's ensemble counts executions and batch statistics on success only. It
            # counts the failure twice, in the statistics and the failure metric: once where
            # it answers the error, once where the request's tracker ends unsuccessfully
            # (L0_model_queue's `test_policy_reject` expects it)
            for _ in range(2):
                stats.record_failure("OTHER", 1, now - work.enqueued_ns)
            return
        stats.record_batch(BatchReport(
            batch_size=work.batch_size, requests=1,
            succeeded=True, queue_ns=0,
            request_ns=now - work.enqueued_ns, compute_input_ns=0,
            compute_infer_ns=now - work.enqueued_ns, compute_output_ns=0,
            finished_ms=time.time_ns() // 1_000_000, enqueued_ns=(work.enqueued_ns,),
            started_ns=work.enqueued_ns, ended_ns=now))

    def parts(work: InferWork) -> Callable[[Any], None]:
        """A decoupled ensemble's delivery of ``work``'s parts, its first response counted."""
        first = True

        def emit(answer: Any) -> None:
            nonlocal first
            if first and isinstance(answer, Part) and answer.response is not None:
                first = False
                stats.record_first_response(time.monotonic_ns() - work.enqueued_ns, buckets)
            deliver(work, answer)
        return emit

    async def serve_by_callbacks(work: InferWork) -> None:
        """A CallbackFlow's request: its answer is given where its last step's answer is
        delivered (in the order the model delivered them); this task holds its cancel
        scope (CancelWork) until then."""
        ended = trio.Event()

        def done(answer: Any) -> None:
            record(work, answer)  # counted before the client can ask for the statistics
            deliver(work, answer)
            ended.set()

        with trio.CancelScope() as scope:
            scopes[id(work)] = scope
            flow = CallbackFlow(plan, version, work.request, client, done,
                                requests_nursery[0].start_soon)
            try:
                with Boundary(faults, "model", log,
                              f"a request of ensemble '{plan.name}'") as b:
                    flow.start()
                if b.failure is not None:
                    flow.end(InternalError(f"in ensemble '{plan.name}': {b.failure}"))
                await ended.wait()
            finally:
                del scopes[id(work)]
                if not ended.is_set():
                    flow.abandon()
        if scope.cancelled_caught and not ended.is_set():
            stats.record_failure("CANCELED")
            _answer(work, Cancelled(""))

    requests_nursery: list[trio.Nursery] = []  # the intake's, for a step that needs a task

    async with trio.open_nursery() as answering:
        answering.start_soon(answer_in_order)
        async with wake:
            await _intake(inbox, serve, scopes, stats, plan, task_status, requests_nursery)


async def _intake(inbox: trio.MemoryReceiveChannel[Any], serve: Callable[..., Any],
                  scopes: dict[int, trio.CancelScope], stats: StatsAccumulator,
                  plan: EnsemblePlan, task_status: trio.TaskStatus[None],
                  requests_nursery: list[trio.Nursery]) -> None:
    """Take the inbox's messages until every sender is gone; then wait for the requests in
    flight."""
    closing = False
    async with inbox, trio.open_nursery() as requests:
        requests_nursery.append(requests)
        task_status.started()
        async for message in inbox:
            if isinstance(message, InferWork):
                if closing:
                    _answer(message, Unavailable(f"model '{plan.name}' is unloading"))
                elif not message.abandoned():
                    await requests.start(serve, message)
            elif isinstance(message, CancelWork):
                scope = scopes.get(id(message.work))
                if scope is not None:
                    scope.cancel()
            elif isinstance(message, StatsQuery):
                # nothing waits in an ensemble: its requests are its steps' pending ones, as
                # Triton reports it (the ensemble's own pending count stays 0; L0_metrics)
                _answer(message, stats.snapshot(0))
            elif isinstance(message, CacheOutcome):
                # ``response_cache { enable: true }`` on the ensemble itself: the model
                # client asked the cache for the whole request (Triton caches an ensemble's
                # top-level answer and counts its hits and misses on the ensemble)
                stats.record_cache(message.hit, message.cache_ns, message.request_ns)
            elif isinstance(message, CloseIntake):
                closing = True


def _answer(work: Any, answer: Any) -> None:
    mailbox.answer(work.reply, answer)


def label_source(config: ModelConfig, resolve: Callable[[str, str, str | None], Any] | None,
                 ) -> Callable[[str], tuple[Path, TensorSpec] | None]:
    """Where the labels of an ensemble's output are, as Triton finds them for the
    classification extension: the ensemble's own ``label_filename`` for that output, else
    the labels of the output of the step model that produces it (through nested ensembles,
    each of which may name its own)."""

    def find(cfg: ModelConfig, name: str, depth: int) -> tuple[Path, TensorSpec] | None:
        spec = cfg.output_map.get(name)
        if spec is not None and spec.label_filename:
            return cfg.path, spec
        plan = cfg.ensemble
        if plan is None or resolve is None or depth > 16:
            return None
        for step in plan.steps:
            for model_output, tensor in step.output_map.items():
                if tensor == name:
                    try:
                        step_config = resolve(step.model_name, step.version_str,
                                              plan.namespace).config
                    except NurseryError:
                        return None
                    return find(step_config, model_output, depth + 1)
        return None

    return lambda name: find(config, name, 0)


def _classified(work: Any, answer: Any, config: ModelConfig | None,
                labels: Callable[[str], tuple[Path, TensorSpec] | None]) -> Any:
    """An ensemble's answer (or one part of a decoupled one) with the classes its request
    asks for, as Triton's frontends classify any model's answer."""
    if config is None or not any(o.classification for o in work.request.requested_outputs):
        return answer
    if isinstance(answer, Part):
        if answer.response is None:
            return answer
        classified = classify_response(work.request, answer.response, config, labels)
        if isinstance(classified, NurseryError):
            return Part(None, classified, answer.final)
        return Part(classified, answer.error, answer.final)
    return classify_response(work.request, answer, config, labels)
