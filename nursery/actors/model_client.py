"""The model client: how a request reaches a model, for the frontends (through the core),
ensemble steps and BLS calls from Python models alike.

A call goes through the target model's scheduler exactly like a client request: resolve the
version once, check the request once (:func:`~nursery.execution.admission.make_work`), ask the
response cache when the model uses it, queue the work, wait for the answer. The server builds
one :class:`ModelClient` and hands it to whoever needs it (the core, the model manager for its
ensembles, each Python instance's thread for BLS): there is no process-wide client. Python
models call it from their instance thread (``*_from_thread``, through the trio token),
everything else from the trio thread.
"""

from __future__ import annotations

import math
import queue
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import trio

from nursery.actors import mailbox
from nursery.actors.directory import Directory, ModelHandle
from nursery.actors.mailbox import CallbackShot, OneShot
from nursery.config.json_form import ConfigJsonError, config_from_json
from nursery.errors import InternalError, InvalidArgument, NurseryError, Unavailable
from nursery.execution.admission import make_work
from nursery.messages import (
    CacheInsert,
    CacheLookup,
    CacheOutcome,
    DecoupledResponse,
    InferWork,
    Part,
)
from nursery.observability.arrival_log import ArrivalLog
from nursery.observability.custom_metrics import CustomMetrics
from nursery.observability.tracing import ChildOf, TraceManager, TraceSettings
from nursery.scheduling.cache_store import frozen_copy, request_key
from nursery.types import InferenceRequest, InferenceResponse

OnPart = Callable[[Part], Awaitable[None]]


class ResponseMeter:
    """Reports each response of a decoupled request to its version's scheduler (statistics:
    ``response_stats``, the first-response histogram). Trio thread only."""

    __slots__ = ("handle", "start_ns", "last_ns", "index")

    def __init__(self, handle: ModelHandle, start_ns: int) -> None:
        self.handle = handle
        self.start_ns = start_ns
        self.last_ns = start_ns
        self.index = 0

    def seen(self, item: Any) -> None:
        now = time.monotonic_ns()
        if isinstance(item, NurseryError) or getattr(item, "error", None) is not None:
            kind = "fail"
        elif item.response is None:
            kind = "empty_response"  # a bare final flag
        else:
            kind = "success"
        self.handle.report(DecoupledResponse(
            self.index, kind, now - self.last_ns, now - self.start_ns if self.index == 0 else 0,
            self.handle.config.first_response_buckets))
        self.last_ns = now
        self.index += 1


class ModelClient:
    """Sends requests to models. Built once by the server; trio thread unless named
    ``*_from_thread``."""

    def __init__(self, directory: Directory, *, tracer: TraceManager | None = None,
                 cache: trio.MemorySendChannel[Any] | None = None,
                 arrival_log: ArrivalLog | None = None,
                 custom_metrics: CustomMetrics | None = None) -> None:
        self.directory = directory
        # the families models define (pb_utils.MetricFamily), served on the metrics port
        self.custom_metrics = custom_metrics if custom_metrics is not None else CustomMetrics()
        self.token = trio.lowlevel.current_trio_token()
        self.tracer = tracer if tracer is not None else TraceManager(TraceSettings())
        self.cache = cache  # the ResponseCache's inbox (None: no --cache-config)
        self.arrival_log = arrival_log
        # the server's Core (set by it): model management from a model's own thread
        self.core: Any = None
        # requests waiting for an answer, by model: a busy model is never unloaded for
        # --model-load-budget (actors/demand.py)
        self.in_flight: dict[str, int] = {}

    def resolve(self, name: str, version: str = "", namespace: str | None = None
                ) -> ModelHandle:
        """The version a request goes to (``namespace``: the one to look in first, with
        --model-namespacing: an ensemble step's)."""
        return self.directory.resolve(name, version, namespace)

    # -- one request, one answer -------------------------------------------------------------

    async def infer(self, request: InferenceRequest,
                    handle: ModelHandle | None = None) -> InferenceResponse:
        """Check and run one request; its answer, or its error raised. ``handle`` is the
        version the caller already resolved (a frontend resolves once, to decode)."""
        if handle is None:
            handle = self.directory.resolve(request.model_name, request.model_version,
                                                request.model_namespace)
        work, receive = self.submit(request, handle, queue=False)
        return await self.run(work, receive, handle)

    async def run(self, work: InferWork, receive: OneShot,
                  handle: ModelHandle) -> InferenceResponse:
        """The rest of :meth:`infer` for a request checked by ``submit(..., queue=False)``:
        the cache, tracing, the queue and the answer. A caller that must tell a request's
        refusal (raised by ``submit``) from its failure (raised here) splits the two, as a
        gRPC stream in ``triton_grpc_error`` mode does."""
        return await self.start(work, receive, handle)

    def start(self, work: InferWork, receive: OneShot,
              handle: ModelHandle) -> Awaitable[InferenceResponse]:
        """:meth:`run` split where the request is queued: a request that need not ask the
        response cache first is queued now, in the caller's order (a stream queues its
        requests in the order they came, as Triton does), and the awaitable returned waits
        for its answer; one that asks the cache first is queued by that awaitable."""
        if self.cache is not None and handle.config.uses_response_cache:
            return self._cached(work, receive, handle, self.cache)
        return self._queue_now(work, receive, handle)

    def submit(self, request: InferenceRequest, handle: ModelHandle | None = None, *,
               queue: bool = True, slot: OneShot | None = None) -> tuple[InferWork, OneShot]:
        """Check a request and queue it without waiting (a stream queues its requests in the
        order they came, which a sequence needs); :meth:`wait` gets the answer. ``slot``: the
        reply slot to use (default: a new OneShot)."""
        if handle is None:
            handle = self.directory.resolve(request.model_name, request.model_version,
                                                request.model_namespace)
        if slot is None:
            slot = OneShot()
        work = make_work(request, handle.config, slot)
        if queue:
            self._queue(work, handle)
        return work, slot

    def dispatch(self, request: InferenceRequest, handle: ModelHandle,
                 on_answer: Callable[[Any], None]) -> Callable[[], None] | None:
        """Check and queue a request whose answer (an InferenceResponse or a NurseryError)
        goes to ``on_answer`` on the trio thread when the model answers: no task waits for it
        (a frontend's fast path). Returns the function that abandons the request (its client
        went away), or None when it cannot be sent so: it needs the response cache or
        tracing, which :meth:`infer` serves. A refusal raises, nothing queued."""
        if (self.cache is not None and handle.config.uses_response_cache) \
                or request.trace or self.tracer.active:
            return None
        name = handle.name
        pending = [True]

        def answered(value: Any) -> None:
            if pending[0]:
                pending[0] = False
                self._left(name)
            on_answer(value)

        slot = CallbackShot(answered, InternalError(
            f"model '{name}' stopped without answering a request"))
        work = make_work(request, handle.config, slot)
        self._queue(work, handle)
        self.in_flight[name] = self.in_flight.get(name, 0) + 1

        def abandon() -> None:
            if pending[0]:
                pending[0] = False
                self._left(name)
                slot.close_receiver()
                handle.cancel(work)  # drop it from the queue now rather than at dispatch

        return abandon

    def dispatch_holding(self, request: InferenceRequest, handle: ModelHandle,
                         on_answer: Callable[[Any], None],
                         release: Callable[[], None]) -> Callable[[], None] | None:
        """:meth:`dispatch` for a frontend that holds something for the request (its
        shared-memory regions, a drain count): ``release`` runs when the request is not
        queued (refused, or not taken here: None) or is abandoned. Once answered,
        ``on_answer`` releases it itself."""
        try:
            abandon = self.dispatch(request, handle, on_answer)
        except NurseryError:
            abandon = None
        except BaseException:
            release()
            raise
        if abandon is None:
            release()
            return None
        queued = abandon

        def abandoned() -> None:
            queued()
            release()

        return abandoned

    def _left(self, name: str) -> None:
        left = self.in_flight[name] - 1
        if left:
            self.in_flight[name] = left
        else:
            del self.in_flight[name]

    def _queue(self, work: InferWork, handle: ModelHandle) -> None:
        trace = work.request.trace
        if trace:
            trace.stamp("QUEUE_START", work.enqueued_ns)
        if self.arrival_log is not None:
            self.arrival_log.record(handle.name, handle.version, work)
        handle.submit(work)

    async def wait(self, work: InferWork, receive: OneShot,
                   handle: ModelHandle) -> InferenceResponse:
        name = handle.name
        self.in_flight[name] = self.in_flight.get(name, 0) + 1
        try:
            with receive:  # leaving (also by cancellation) tells the scheduler nobody waits
                answer = await receive.receive()
        except trio.Cancelled:
            handle.cancel(work)  # drop it from the queue now rather than at dispatch
            raise
        finally:
            self._left(name)
        if isinstance(answer, NurseryError):
            raise answer
        return answer  # type: ignore[no-any-return]

    async def _queued(self, work: InferWork, receive: OneShot,
                      handle: ModelHandle) -> InferenceResponse:
        return await self._queue_now(work, receive, handle)

    def _queue_now(self, work: InferWork, receive: OneShot,
                   handle: ModelHandle) -> Awaitable[InferenceResponse]:
        """Queue the request now (traced when sampled); the wait for its answer."""
        request = work.request
        trace = request.trace  # None: not sampled yet; False: sampled, not traced
        if trace is None and self.tracer.active:
            trace = request.trace = self.tracer.start(handle.name)
            if trace:
                return self._traced(work, receive, handle, trace)
        elif isinstance(trace, ChildOf):  # an ensemble step's or a BLS call's: a child trace
            trace = request.trace = self.tracer.spawn(trace, handle.name)
            if trace:
                return self._traced(work, receive, handle, trace, top=False)
        elif trace:
            return self._traced(work, receive, handle, trace, own=False)
        self._queue(work, handle)
        return self.wait(work, receive, handle)

    def _traced(self, work: InferWork, receive: OneShot, handle: ModelHandle, trace: Any,
                own: bool = True, top: bool = True) -> Awaitable[InferenceResponse]:
        request = work.request
        trace.model_version = handle.version
        trace.request_id = request.id
        trace.stamp("REQUEST_START", work.enqueued_ns)
        for name, tensor in request.inputs.items():
            trace.tensor("TENSOR_QUEUE_INPUT", name, tensor.datatype.value, tensor.data)
        try:
            self._queue(work, handle)
        except BaseException:
            trace.stamp("REQUEST_END")
            if own:
                trace.finish()
            raise
        return self._traced_wait(work, receive, handle, trace, own, top)

    async def _traced_wait(self, work: InferWork, receive: OneShot, handle: ModelHandle,
                           trace: Any, own: bool, top: bool) -> InferenceResponse:
        try:
            answered = True
            try:
                response = await self.wait(work, receive, handle)
            except trio.Cancelled:  # its client left: no answer came (Triton's trace of a
                answered = False    # cancelled call has none)
                raise
            finally:
                # the answer reached the frontend (Triton's frontends stamp it in their
                # response-complete callback, error or not; a step's or a BLS call's answer
                # goes back to its parent, which is not a frontend)
                if top and answered:
                    trace.stamp("INFER_RESPONSE_COMPLETE")
            for out in response.outputs:
                trace.tensor("TENSOR_BACKEND_OUTPUT", out.name, out.datatype.value, out.data)
            return response
        finally:
            trace.stamp("REQUEST_END")
            if own:
                trace.finish()

    async def _cached(self, work: InferWork, receive: OneShot,
                      handle: ModelHandle,
                      cache: trio.MemorySendChannel[Any]) -> InferenceResponse:
        """Ask the ResponseCache first; on a miss run the model and give it the answer."""
        request = work.request
        t0 = time.monotonic_ns()
        key = request_key(handle.name, handle.version, request)
        try:
            found: InferenceResponse | None = await mailbox.ask(cache, lambda reply: CacheLookup(key, reply),
                                      gone="the response cache has stopped")
        except NurseryError:  # shutting down: no cache
            return await self._queued(work, receive, handle)
        t1 = time.monotonic_ns()
        if found is not None:
            receive.close_receiver()
            handle.report(CacheOutcome(True, t1 - t0, t1 - t0))
            return InferenceResponse(found.model_name, found.model_version, found.outputs,
                                     request.id, dict(found.parameters))
        response = await self._queued(work, receive, handle)
        t2 = time.monotonic_ns()
        mailbox.tell(cache, CacheInsert(key, frozen_copy(response)))
        handle.report(CacheOutcome(False, (t1 - t0) + (time.monotonic_ns() - t2)))
        return response

    # -- ensemble steps and BLS --------------------------------------------------------------

    async def infer_one(self, request: InferenceRequest) -> InferenceResponse:
        """One response from a non-decoupled model (errors raise)."""
        handle = self.resolve(request.model_name, request.model_version,
                                                request.model_namespace)
        if handle.config.decoupled:
            raise InvalidArgument(
                f"model '{handle.name}' uses the decoupled transaction policy; it must be "
                "called with decoupled=True (a stream of responses)")
        return await self.infer(request, handle)

    async def stream(self, request: InferenceRequest, on_part: OnPart) -> None:
        """Every answer of one request, in order, ending with a final one. Never raises a
        request's error: it arrives as a final :class:`Part`."""
        try:
            handle = self.resolve(request.model_name, request.model_version,
                                                request.model_namespace)
            if not handle.config.decoupled:
                response = await self.infer(request, handle)
            else:
                await stream_decoupled(request, handle, on_part)
                return
        except NurseryError as error:
            await on_part(Part(None, error, True))
            return
        await on_part(Part(response, None, True))

    # -- from a model's own thread (BLS) ---------------------------------------------------

    def infer_from_thread(self, request: InferenceRequest) -> InferenceResponse:
        return trio.from_thread.run(self.infer_one, request, trio_token=self.token)

    def manage_from_thread(self, op: str, name: str, *args: Any) -> Any:
        """Model management from a model's own thread, as Triton's Python backend offers it
        (``pb_utils.load_model`` / ``unload_model`` / ``is_model_ready``), through the
        server's Core with a client's rights (load and unload need explicit mode)."""
        if self.core is None:
            raise Unavailable("model management is not available here")
        return trio.from_thread.run(_manage, self.core, op, name, *args, trio_token=self.token)

    def stream_from_thread(self, request: InferenceRequest) -> ThreadStream:
        """The answers of one request, yielded on the calling thread as the target model
        sends them (a decoupled model's stream arrives while it is still running); the
        request is sent at once, and ``cancel()`` cancels it."""
        return ThreadStream(self, request)


async def _manage(core: Any, op: str, name: str, *args: Any) -> Any:
    """One model-management call of :meth:`ModelClient.manage_from_thread`: "load" (a
    configuration override as Triton's JSON, and ``file:<path>`` contents, as the repository
    extension's load takes them), "unload", or "ready" (a version)."""
    if op == "load":
        config_json, files = args
        config = None
        if config_json:
            try:
                config = config_from_json(config_json)
            except ConfigJsonError as exc:
                raise InvalidArgument(f"failed to parse the 'config' override: {exc}") from None
        contents: dict[str, bytes] = {}
        for key, data in (files or {}).items():
            if not isinstance(key, str) or not key.startswith("file:"):
                raise InvalidArgument(f"unrecognized load parameter '{key}'")
            contents[key[len("file:"):]] = bytes(data)
        await core.load_model(name, config, contents or None)
        return None
    if op == "unload":
        await core.unload_model(name, bool(args[0]) if args else False)
        return None
    if op == "ready":
        return await core.model_ready(name, args[0] if args else "")
    raise InvalidArgument(f"unknown model management call '{op}'")


class ThreadStream:
    """The parts of one request for a caller on a plain thread (a BLS stream). ``cancel()``
    is Triton's ``TRITONSERVER_InferenceRequestCancel``: the target model's
    ``request.is_cancelled()`` turns true, a request still queued is dropped (answered
    CANCELLED), and what the model sends afterwards still arrives; once the stream has
    ended it does nothing."""

    def __init__(self, client: ModelClient, request: InferenceRequest) -> None:
        self._client = client
        self._reply = ThreadReply()
        self._handle: ModelHandle | None = None
        self._work: InferWork | None = None
        self._finished = False
        self._parts = self._run(self._submit(request))  # the request is sent now

    def __iter__(self) -> ThreadStream:
        return self

    def __next__(self) -> Part:
        return next(self._parts)

    def cancel(self) -> None:
        self._reply.cancelled = True
        handle, work = self._handle, self._work
        if handle is not None and work is not None and not self._finished:
            try:
                trio.from_thread.run_sync(handle.cancel, work, trio_token=self._client.token)
            except trio.RunFinishedError:
                pass

    def _submit(self, request: InferenceRequest) -> Part | None:
        reply = self._reply

        def submit() -> InferWork | None:
            handle = self._client.resolve(request.model_name, request.model_version,
                                                request.model_namespace)
            if not handle.config.decoupled:
                return None
            _untraced(request)
            work = make_work(request, handle.config, reply)  # type: ignore[arg-type]
            reply.meter = ResponseMeter(handle, work.enqueued_ns)
            self._handle = handle
            handle.submit(work)
            return work

        try:
            self._work = trio.from_thread.run_sync(submit, trio_token=self._client.token)
        except NurseryError as error:
            return Part(None, error, True)
        if self._work is None:  # not decoupled: its one response is the final part
            try:
                return Part(self._client.infer_from_thread(request), None, True)
            except NurseryError as error:
                return Part(None, error, True)
        return None

    def _run(self, only: Part | None) -> Iterator[Part]:
        try:
            if only is not None:
                yield only
                return
            while True:
                item = self._reply.queue.get()
                if isinstance(item, NurseryError):
                    yield Part(None, item, True)
                    return
                yield item
                if item.final:
                    return
        finally:
            self._finished = True
            self._reply.closed = True  # the caller stopped listening


class ThreadReply:
    """A reply channel whose receiver is a plain thread (a BLS call from a model's thread):
    what the scheduler and workers call on a reply channel, over a thread-safe queue."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.closed = False  # the caller stopped listening
        self.cancelled = False  # the caller cancelled the request
        self.meter: ResponseMeter | None = None

    @property
    def open_receive_channels(self) -> int:
        """0 once the requester is gone or cancelled: ``InferWork.abandoned()`` reads it."""
        return 0 if self.closed or self.cancelled else 1

    def send_nowait(self, item: Any) -> None:  # on the trio thread
        if self.meter is not None:
            self.meter.seen(item)
        self.queue.put(item)

    def statistics(self) -> ThreadReply:
        return self


async def stream_decoupled(request: InferenceRequest, handle: ModelHandle,
                           on_part: OnPart) -> None:
    """Run one request on a decoupled model: its reply channel is unbounded and carries
    :class:`Part` messages (or a bare error, which is final) until the final one."""
    send, receive = trio.open_memory_channel[Any](math.inf)
    _untraced(request)
    work = make_work(request, handle.config, send)
    handle.submit(work)
    meter = ResponseMeter(handle, work.enqueued_ns)
    try:
        with receive:
            while True:
                item = await receive.receive()
                meter.seen(item)
                if isinstance(item, NurseryError):
                    await on_part(Part(None, item, True))
                    return
                await on_part(item)
                if item.final:
                    return
    except trio.Cancelled:
        handle.cancel(work)
        raise


def _untraced(request: InferenceRequest) -> None:
    """A request to a decoupled model made for a traced request's work (a BLS stream, a
    decoupled ensemble step) is not traced: streams of responses are not traced here yet."""
    if isinstance(request.trace, ChildOf):
        request.trace = False
