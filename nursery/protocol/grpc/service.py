"""GRPCInferenceService: every RPC of Triton's gRPC API, each a few lines calling the core.

The handlers run on trio, called by nursery's lean HTTP/2 server (``lean.py``); the design
card's grpclib server runs them on a trio-asyncio loop through a subclass that crosses into
trio once per call (``grpclib_server.py``). Errors become gRPC statuses in one place
(:func:`_status`), with the codes of ``protocol/codecs/status.py``.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import betterproto
import grpclib
import grpclib.const
import grpclib.server
import trio

from nursery.actors.model_client import stream_decoupled
from nursery.config.json_form import ConfigJsonError, config_from_json
from nursery.core import Core
from nursery.errors import ErrorKind, InvalidArgument, NurseryError, Unavailable, Unsupported
from nursery.messages import Part
from nursery.protocol.access import NO_FORWARD, HeaderForward, ReservedHeader
from nursery.protocol.codecs import grpc_messages as grpc_codec
from nursery.protocol.codecs import stats as stats_codec
from nursery.protocol.codecs.grpc_wire import FINAL_RESPONSE, encode_stream_response
from nursery.protocol.codecs.status import GRPC_STATUS
from nursery.protocol.grpc.h2 import only_gone
from nursery.schema import inference as pb
from nursery.schema.grpc.health import v1 as health_pb
from nursery.schema.grpc.health.v1 import services as health_services
from nursery.schema.inference import services
from nursery.shm.system import ShmHold
from nursery.types import InferenceResponse

NOT_FINAL_RESPONSE = {"triton_final_response": pb.InferParameter(bool_param=False)}
INTERNAL_MESSAGE = "Internal Server Error"
# requests of one ModelStreamInfer stream in flight at once (as many as a connection's
# concurrent unary calls); beyond it the stream is not read until one is answered, so the
# client is held back by flow control instead of queueing without bound
MAX_STREAM_IN_FLIGHT = 4096

log = logging.getLogger("nursery.grpc")


def log_internal_error(where: str, exc: BaseException) -> None:
    """The default report of an unexpected exception: one line, the traceback at debug."""
    log.error("gRPC internal error in %s: %s: %s", where, type(exc).__name__, str(exc)[:160])
    log.debug("gRPC internal error in %s", where, exc_info=exc)


def _status(error: NurseryError) -> grpclib.GRPCError:
    return grpclib.GRPCError(grpclib.const.Status(GRPC_STATUS[error.kind]), error.message)


class _Ticket:
    """A non-decoupled request's place on its stream. Triton's stream writes the answers of
    non-decoupled requests in the order the stream carried the requests, refusals included
    (stream_infer_handler.cc queues each such request as it reads it and writes only the
    head of that queue); a decoupled model's responses are written as they come."""

    __slots__ = ("done", "message")

    def __init__(self) -> None:
        self.done = False  # its answer is encoded (or there is nothing to write)
        self.message: bytes | None = None


def _grpc_error_mode(stream: Any) -> bool:
    """Triton's ``triton_grpc_error`` stream header, exactly "true" (infer_handler.h)."""
    value = stream.metadata.get("triton_grpc_error") if stream.metadata else None
    return value == "true"


def _traceparent(stream: Any) -> str:
    """The W3C trace context a call carries in its metadata (grpclib's stream or the lean
    server's call), or ""."""
    value = stream.metadata.get("traceparent") if stream.metadata else None
    return value if isinstance(value, str) else ""


def _forwarded(forward: HeaderForward, stream: Any) -> dict[str, str] | NurseryError:
    """The call's metadata that --grpc-header-forward-pattern forwards as request parameters,
    or the error (a reserved name) each request of the call gets."""
    if forward.pattern is None or not stream.metadata:
        return {}
    try:
        return forward.parameters((str(k), str(v)) for k, v in dict(stream.metadata).items())
    except ReservedHeader as exc:
        return InvalidArgument(str(exc))


def _add_forwarded(request: Any, forwarded: dict[str, str] | NurseryError) -> None:
    if isinstance(forwarded, NurseryError):
        raise forwarded
    if forwarded:
        request.parameters.update(forwarded)


class Draining:
    """Counts RPCs in progress; once draining, new inference RPCs are refused."""

    def __init__(self) -> None:
        self.active = 0
        self.draining = False
        self.idle = trio.Event()
        self.idle.set()

    def enter(self) -> None:
        if self.draining:
            raise Unavailable("the server is shutting down")
        self.active += 1
        self.idle = trio.Event() if self.active == 1 else self.idle

    def leave(self) -> None:
        self.active -= 1
        if self.active == 0:
            self.idle.set()


class InferenceService(services.GrpcInferenceServiceBase):
    def __init__(self, core: Core, draining: Draining,
                 forward: HeaderForward = NO_FORWARD) -> None:
        self.core = core
        self.draining = draining
        self.forward = forward  # --grpc-header-forward-pattern
        # where an unexpected exception in one request of a stream is reported (the lean
        # server counts it in H2Server.internal_errors)
        self.on_internal_error: Callable[[str, BaseException], None] = log_internal_error

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run one of the core's functions; its errors become gRPC statuses."""
        try:
            return await fn(*args)
        except NurseryError as error:
            raise _status(error) from None

    def _sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except NurseryError as error:
            raise _status(error) from None

    # -- health and metadata ---------------------------------------------------------------

    async def server_live(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.core.server_live())

    async def server_ready(self, request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=await self.core.server_ready())

    async def model_ready(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=await self.core.model_ready(request.name,
                                                                    request.version))

    async def server_metadata(
        self, request: pb.ServerMetadataRequest
    ) -> pb.ServerMetadataResponse:
        meta = self.core.server_metadata()
        return pb.ServerMetadataResponse(name=meta["name"], version=meta["version"],
                                         extensions=list(meta["extensions"]))

    async def model_metadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        meta = self._sync(self.core.model_metadata, request.name, request.version)
        return grpc_codec.model_metadata(meta)

    async def model_config(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        handle = self._sync(self.core.resolve, request.name, request.version)
        return pb.ModelConfigResponse(config=handle.config.proto)

    # -- inference -------------------------------------------------------------------------

    async def _infer_rpc(self, stream: Any) -> None:
        """ModelInfer with the call's metadata at hand: its ``traceparent`` (OpenTelemetry
        mode) makes the request's trace a child of the caller's span, as in Triton."""
        message = await stream.recv_message()
        traceparent = _traceparent(stream) if self.core.tracer.active else ""
        forwarded = _forwarded(self.forward, stream)
        after: list[Any] = []  # a traced request's trace, ended once its answer is written
        try:
            await stream.send_message(
                await self._call(self._infer, message, traceparent, forwarded, after))
            for trace in after:  # written: Triton stamps it when its write has completed
                trace.stamp("GRPC_SEND_END")
        finally:
            for trace in after:
                trace.finish()

    async def _infer(self, message: Any, traceparent: str = "",
                     forwarded: dict[str, str] | NurseryError | None = None,
                     after: list[Any] | None = None) -> bytes:
        """The ModelInferResponse in wire form (the codec passes bytes through). A traced
        request's trace is finished here, or put in ``after`` for the caller to end once it
        has written the answer."""
        self.draining.enter()
        tracer = self.core.tracer
        trace = tracer.start(message.model_name, traceparent) if tracer.active else None
        if trace is not None:  # grpclib has read and parsed the message by now
            trace.stamp("GRPC_WAITREAD_START")
            trace.stamp("GRPC_WAITREAD_END")
        # the regions the request reads and writes, held until its outputs are written (a
        # region unregistered meanwhile goes then, as in Triton)
        shm = self.core.shm.hold()
        cancelled = False
        try:
            handle = await self.core.acquire(message.model_name, message.model_version)
            if handle.config.decoupled:
                raise Unsupported(
                    "ModelInfer RPC doesn't support models with decoupled transaction policy")
            request = grpc_codec.decode_request(message, shm)
            if forwarded:
                _add_forwarded(request, forwarded)
            shm_outputs = grpc_codec.decode_shm_outputs(message, shm)
            request.trace = trace or False  # False: sampled here, not traced
            response = await self.core.infer(request, handle)
            return grpc_codec.encode_response(response, None, shm_outputs, shm)
        except trio.Cancelled:  # the client left: nothing is sent
            cancelled = True
            raise
        finally:
            shm.release()
            self.draining.leave()
            if trace is not None:
                if not cancelled:
                    trace.stamp("GRPC_SEND_START")
                if cancelled or after is None:
                    trace.finish()
                else:
                    after.append(trace)

    def infer_now(self, message: Any,
                  reply: Callable[[Any], None]) -> Callable[[], None] | None:
        """ModelInfer without a task (the lean server's fast path, ``UnaryFastPath``): the
        request is checked and queued now, and ``reply`` gets the ModelInferResponse in wire
        form, or the error's status, when the model answers. Returns the function that
        abandons the request (the client left); None when the request is not taken here
        (tracing, header forwarding, on-demand loading, the response cache, a decoupled
        model, or any refusal): then ``_infer_rpc`` serves it, as every request before."""
        core = self.core
        if core.demand is not None or self.forward.pattern is not None or core.tracer.active:
            return None
        shm = core.shm.hold()  # the request's regions, held until its outputs are written
        try:
            handle = core.resolve(message.model_name, message.model_version)
            if handle.config.decoupled:
                return None
            request = grpc_codec.decode_request(message, shm)
            shm_outputs = grpc_codec.decode_shm_outputs(message, shm)
            request.trace = False  # sampled here, not traced
            self.draining.enter()
        except NurseryError:
            shm.release()  # _infer_rpc decodes it again, with a hold of its own
            return None
        draining = self.draining

        def answered(answer: Any) -> None:
            draining.leave()
            try:
                if isinstance(answer, NurseryError):
                    shm.release()
                    reply(_status(answer))
                    return
                try:
                    data = grpc_codec.encode_response(answer, None, shm_outputs, shm)
                except NurseryError as error:
                    reply(_status(error))
                    return
                finally:
                    shm.release()
                reply(data)
            except Exception as exc:  # noqa: BLE001 - this request's boundary
                self.on_internal_error("gRPC method ModelInfer", exc)
                with contextlib.suppress(Exception):
                    reply(grpclib.GRPCError(grpclib.const.Status.INTERNAL,
                                            "Internal Server Error"))

        def release() -> None:
            shm.release()
            draining.leave()  # a shutdown must not wait for a request never queued

        return core.client.dispatch_holding(request, handle, answered, release)

    async def _stream_rpc(
        self, stream: grpclib.server.Stream[pb.ModelInferRequest, pb.ModelStreamInferResponse]
    ) -> None:
        """ModelStreamInfer: requests are served as they arrive, concurrently; the answers
        (or errors, as ``error_message``) of non-decoupled requests are written in the order
        the stream carried the requests, as Triton's, a decoupled model's responses as they
        come. The stream stays open after a failed request; the client ending or cancelling
        it is honoured."""
        await self._stream_trio(stream)

    def _endpoints(self, stream: Any) -> tuple[Callable[[], Any], Callable[[Any], Any]]:
        """The stream's receive and send, as trio functions."""
        return stream.recv_message, stream.send_message

    async def _stream_trio(self, stream: Any) -> None:
        receive, send = self._endpoints(stream)
        lock = trio.Lock()
        # Triton's triton_grpc_error mode (the stream's metadata says "true"): the first
        # request that fails once issued (its response is an error: the model, the queue)
        # ends the whole stream with that error as gRPC status; requests refused when issued
        # (not found, invalid) are still answered in-band (stream_infer_handler.cc)
        grpc_error = _grpc_error_mode(stream)
        failure: list[NurseryError] = []
        closing = trio.CancelScope()

        def failed(error: NurseryError) -> bytes | None:
            """A failed request's in-band answer, or None once it has closed the stream."""
            if not grpc_error:
                return encode_stream_response(None, error.message)
            if not failure:
                failure.append(error)
            closing.cancel()
            return None

        async def reply(message: bytes) -> None:
            async with lock:
                await send(message)

        # the non-decoupled requests in the order the stream carried them: an answer is
        # written once it is encoded and every answer before it is written (Triton's order)
        order: deque[_Ticket] = deque()

        def new_ticket() -> _Ticket:
            ticket = _Ticket()
            order.append(ticket)
            return ticket

        async def answer(ticket: _Ticket, message: bytes | None) -> None:
            ticket.message = message
            ticket.done = True
            async with lock:
                while order and order[0].done:
                    head = order.popleft()
                    if head.message is not None:
                        await send(head.message)

        def unexpected(exc: Exception) -> bytes:
            """One request's boundary: an unexpected exception fails that request only."""
            self.on_internal_error("a ModelStreamInfer request", exc)
            return encode_stream_response(None, INTERNAL_MESSAGE)

        async def settled(pending: Awaitable[Any], outputs: Any, shm: ShmHold) -> bytes | None:
            """A request's answer in wire form, once ``pending`` gives it (a failure answered
            in its words); its regions and its place in the drain are let go either way."""
            try:
                response = await pending
                return encode_stream_response(
                    grpc_codec.encode_response(response, FINAL_RESPONSE, outputs, shm))
            except NurseryError as error:
                return failed(error)
            except Exception as exc:  # noqa: BLE001 - the request's boundary
                return unexpected(exc)
            finally:
                shm.release()
                self.draining.leave()

        async def finish(ticket: _Ticket, work: Any, answer_slot: Any, handle: Any,
                         outputs: Any, shm: ShmHold) -> None:
            await answer(ticket, await settled(
                self.core.client.wait(work, answer_slot, handle), outputs, shm))

        # a traceparent in the stream's metadata parents every request the stream carries
        tracer = self.core.tracer
        traceparent = _traceparent(stream) if tracer.active else ""

        async def infer(ticket: _Ticket, handle: Any, outputs: Any, shm: ShmHold, trace: Any,
                        pending: Awaitable[Any]) -> None:
            """The full path (cache, tracing): ``pending``, the request's answer, which the
            loop checked and queued (a refusal is raised there, a failure here, as
            ``triton_grpc_error`` mode tells them apart)."""
            try:
                message = await settled(pending, outputs, shm)
                if trace is not None:
                    trace.stamp("GRPC_SEND_START")
                await answer(ticket, message)
                if trace is not None:  # written (Triton: when its write has completed)
                    trace.stamp("GRPC_SEND_END")
            finally:
                if trace is not None:
                    trace.finish()

        async def decoupled(request: Any, handle: Any, shm: ShmHold) -> None:
            try:
                await self._stream_decoupled(request, handle, lock, send, failed)
            except NurseryError as error:
                message = failed(error)
                if message is not None:
                    await reply(message)
            except Exception as exc:  # noqa: BLE001 - the request's boundary
                if only_gone(exc):  # the client went away mid-stream
                    raise
                await reply(unexpected(exc))
            finally:
                shm.release()
                self.draining.leave()

        with closing:
            await self._serve_stream(receive, answer, unexpected, infer, decoupled, finish,
                                     traceparent, new_ticket, _forwarded(self.forward, stream))
        if failure:  # ends the stream: grpc-status and message, as Triton's Finish(status)
            raise _status(failure[0])

    async def _serve_stream(self, receive: Any, answer: Any, unexpected: Any, infer: Any,
                            decoupled: Any, finish: Any, traceparent: str,
                            new_ticket: Callable[[], _Ticket],
                            forwarded: dict[str, str] | NurseryError | None = None) -> None:
        """Read the stream's requests, check and queue each in order; a non-decoupled
        request's answer (or refusal) is written in the order the stream carried it
        (``new_ticket``: its place, ``answer``: writes what is due). Each request holds the
        shared-memory regions it uses until its answer is encoded (``infer``, ``finish``,
        ``decoupled`` let go of them)."""
        tracer = self.core.tracer
        in_flight = trio.Semaphore(MAX_STREAM_IN_FLIGHT)

        async def bounded(fn: Callable[..., Any], *args: Any) -> None:
            """One request's task: its place in ``in_flight`` is freed when it ends."""
            try:
                await fn(*args)
            finally:
                in_flight.release()

        async with trio.open_nursery() as nursery:
            while True:
                message = await receive()
                if message is None:
                    break
                try:
                    in_flight.acquire_nowait()
                except trio.WouldBlock:
                    await in_flight.acquire()
                # validated and queued here, in the order the stream carries them (the
                # requests of a sequence must reach the scheduler in order); answered as
                # they finish
                try:
                    self.draining.enter()
                except NurseryError as error:
                    nursery.start_soon(bounded, answer, new_ticket(),
                                       encode_stream_response(None, error.message))
                    continue
                ticket: _Ticket | None = None  # not for a decoupled model's request
                shm = self.core.shm.hold()
                try:
                    handle = await self.core.acquire(message.model_name, message.model_version)
                    request = grpc_codec.decode_request(message, shm)
                    if forwarded:
                        _add_forwarded(request, forwarded)
                    if handle.config.decoupled:  # responses as they come
                        nursery.start_soon(bounded, decoupled, request, handle, shm)
                        continue
                    ticket = new_ticket()
                    outputs = grpc_codec.decode_shm_outputs(message, shm)
                    if handle.config.sequence is None:  # the full path (cache, tracing),
                        # queued here after the checks, in order
                        trace = None
                        if tracer.active:  # sampled here, as the unary call's
                            trace = tracer.start(handle.name, traceparent)
                            request.trace = trace or False
                            if trace is not None:  # the message has been read and parsed
                                trace.stamp("GRPC_WAITREAD_START")
                                trace.stamp("GRPC_WAITREAD_END")
                        try:
                            work, slot = self.core.client.submit(request, handle, queue=False)
                            # queued here, in the order the stream carries them (Triton's)
                            pending = self.core.client.start(work, slot, handle)
                        except BaseException:
                            if trace is not None:
                                trace.finish()
                            raise
                        nursery.start_soon(bounded, infer, ticket, handle, outputs, shm, trace,
                                           pending)
                        continue
                    work, slot = self.core.client.submit(request, handle)
                except NurseryError as error:
                    shm.release()
                    self.draining.leave()
                    nursery.start_soon(bounded, answer, ticket or new_ticket(),
                                       encode_stream_response(None, error.message))
                    continue
                except Exception as exc:  # noqa: BLE001 - the request's boundary
                    shm.release()
                    self.draining.leave()
                    nursery.start_soon(bounded, answer, ticket or new_ticket(), unexpected(exc))
                    continue
                except BaseException:  # cancelled before a task took the request over
                    shm.release()
                    raise
                nursery.start_soon(bounded, finish, ticket, work, slot, handle, outputs, shm)

    async def _stream_decoupled(self, request: Any, handle: Any, lock: trio.Lock,
                                send: Any,
                                failed: Callable[[NurseryError], bytes | None]) -> None:
        """A decoupled model's responses, each written as it comes, flagged
        ``triton_final_response``; a bare final flag becomes an empty final response only
        when the request asked for it (``triton_enable_empty_final_response``), as in Triton."""
        empty_final = bool(request.parameters.get("triton_enable_empty_final_response"))

        async def emit(part: Part) -> None:
            if part.error is not None:
                answer = failed(part.error)
                if answer is None:  # triton_grpc_error: the stream is closing
                    return
                reply = answer
            elif part.response is not None:
                reply = encode_stream_response(grpc_codec.encode_response(
                    part.response, FINAL_RESPONSE if part.final else NOT_FINAL_RESPONSE))
            elif empty_final:
                empty = InferenceResponse(handle.name, "", [], id=request.id)  # as Triton: no version
                reply = encode_stream_response(grpc_codec.encode_response(empty, FINAL_RESPONSE))
            else:
                return
            async with lock:
                await send(reply)

        await stream_decoupled(request, handle, emit)

    # -- extensions that land later --------------------------------------------------------

    async def model_statistics(
        self, request: pb.ModelStatisticsRequest
    ) -> pb.ModelStatisticsResponse:
        entries = await self._call(self.core.model_statistics, request.name, request.version)
        return stats_codec.to_proto(entries)

    async def repository_index(
        self, request: pb.RepositoryIndexRequest
    ) -> pb.RepositoryIndexResponse:
        entries = await self._call(self.core.repository_index, request.ready)
        return pb.RepositoryIndexResponse(models=[
            pb.RepositoryIndexResponseModelIndex(
                name=e.name, version="" if e.version is None else str(e.version),
                state=e.state or "", reason=e.reason)
            for e in entries
        ])

    async def repository_model_load(
        self, request: pb.RepositoryModelLoadRequest
    ) -> pb.RepositoryModelLoadResponse:
        if request.repository_name:
            raise _status(Unsupported("'repository_name' specification is not supported"))
        config = None
        files: dict[str, bytes] = {}
        for key, param in request.parameters.items():
            which, value = betterproto.which_one_of(param, "parameter_choice")
            if key == "config" and which == "string_param" and isinstance(value, str):
                try:
                    config = config_from_json(value)
                except ConfigJsonError as exc:
                    raise _status(InvalidArgument(
                        f"failed to parse the 'config' override: {exc}")) from None
            elif key.startswith("file:") and which == "bytes_param" and isinstance(value, bytes):
                files[key[len("file:"):]] = value
            else:
                raise _status(InvalidArgument(f"unrecognized load parameter '{key}' ({which})"))
        await self._call(self.core.load_model, request.model_name, config, files or None)
        return pb.RepositoryModelLoadResponse()

    async def repository_model_unload(
        self, request: pb.RepositoryModelUnloadRequest
    ) -> pb.RepositoryModelUnloadResponse:
        if request.repository_name:
            raise _status(Unsupported("'repository_name' specification is not supported"))
        dependents = False
        param = request.parameters.get("unload_dependents")
        if param is not None:
            which, value = betterproto.which_one_of(param, "parameter_choice")
            if which != "bool_param":  # Triton's check and message
                raise _status(InvalidArgument("invalid value type for 'unload_dependents' "
                                              "parameter, expected bool_param."))
            dependents = bool(value)
        await self._call(self.core.unload_model, request.model_name, dependents)
        return pb.RepositoryModelUnloadResponse()

    async def system_shared_memory_status(
        self, request: pb.SystemSharedMemoryStatusRequest
    ) -> pb.SystemSharedMemoryStatusResponse:
        regions = self._sync(self.core.shm.status, request.name, "system")
        return pb.SystemSharedMemoryStatusResponse(regions={
            r["name"]: pb.SystemSharedMemoryStatusResponseRegionStatus(**r) for r in regions})

    async def system_shared_memory_register(
        self, request: pb.SystemSharedMemoryRegisterRequest
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self._sync(self.core.shm.register_system, request.name, request.key, request.offset,
                   request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    async def system_shared_memory_unregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self._sync(self.core.shm.unregister, request.name, "system")  # no name: every region
        return pb.SystemSharedMemoryUnregisterResponse()

    async def cuda_shared_memory_status(
        self, request: pb.CudaSharedMemoryStatusRequest
    ) -> pb.CudaSharedMemoryStatusResponse:
        regions = self._sync(self.core.shm.status, request.name, "cuda")
        return pb.CudaSharedMemoryStatusResponse(regions={
            r["name"]: pb.CudaSharedMemoryStatusResponseRegionStatus(**r) for r in regions})

    async def cuda_shared_memory_register(
        self, request: pb.CudaSharedMemoryRegisterRequest
    ) -> pb.CudaSharedMemoryRegisterResponse:
        self._sync(self.core.shm.register_cuda, request.name, request.raw_handle,
                   request.device_id, request.byte_size)
        return pb.CudaSharedMemoryRegisterResponse()

    async def cuda_shared_memory_unregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        self._sync(self.core.shm.unregister, request.name, "cuda")  # no name: every region
        return pb.CudaSharedMemoryUnregisterResponse()

    async def trace_setting(self, request: pb.TraceSettingRequest) -> pb.TraceSettingResponse:
        model = request.model_name
        if model:
            await self._call(self.core.check_trace_model, model)
        tracer = self.core.tracer
        if request.settings:
            changes: dict[str, Any] = {}
            for key, value in request.settings.items():
                values = list(value.value)
                # an empty list clears the setting; one string is a value; trace_level a list
                changes[key] = None if not values else (
                    values if key == "trace_level" else values[0] if len(values) == 1
                    else values)
            settings = self._sync(tracer.update, model, changes)
        else:  # no settings: a read (tritonclient's get_trace_settings)
            settings = tracer.settings(model)
        out = {}
        for key, value in settings.to_json().items():
            out[key] = pb.TraceSettingResponseSettingValue(
                value=value if isinstance(value, list) else [value])
        return pb.TraceSettingResponse(settings=out)

    async def log_settings(self, request: pb.LogSettingsRequest) -> pb.LogSettingsResponse:
        manager = self.core.log_manager
        if manager is None:
            raise _status(Unavailable("the server does not support dynamic logging"))
        if request.settings:
            changes: dict[str, Any] = {}
            for key, param in request.settings.items():
                which, value = betterproto.which_one_of(param, "parameter_choice")
                changes[key] = value if which else None
            self._sync(manager.update, changes)
        s = manager.settings
        return pb.LogSettingsResponse(settings={
            "log_file": pb.LogSettingsResponseSettingValue(string_param=s.log_file),
            "log_info": pb.LogSettingsResponseSettingValue(bool_param=s.log_info),
            "log_warning": pb.LogSettingsResponseSettingValue(bool_param=s.log_warning),
            "log_error": pb.LogSettingsResponseSettingValue(bool_param=s.log_error),
            "log_verbose_level": pb.LogSettingsResponseSettingValue(
                uint32_param=s.log_verbose_level),
            "log_format": pb.LogSettingsResponseSettingValue(string_param=s.log_format),
        })

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        mapping = super().__mapping__()
        name = "/inference.GRPCInferenceService/ModelInfer"
        mapping[name] = grpclib.const.Handler(
            self._infer_rpc, grpclib.const.Cardinality.UNARY_UNARY,
            pb.ModelInferRequest, pb.ModelInferResponse,
        )
        name = "/inference.GRPCInferenceService/ModelStreamInfer"
        mapping[name] = grpclib.const.Handler(
            self._stream_rpc, grpclib.const.Cardinality.STREAM_STREAM,
            pb.ModelInferRequest, pb.ModelStreamInferResponse,
        )
        return mapping


class HealthService(health_services.HealthBase):
    """grpc.health.v1.Health: SERVING while the server is ready, as Triton answers."""

    def __init__(self, core: Core) -> None:
        self.core = core

    async def check(self, request: health_pb.HealthCheckRequest) -> health_pb.HealthCheckResponse:
        serving = await self.core.server_ready()
        status = (health_pb.HealthCheckResponseServingStatus.SERVING if serving
                  else health_pb.HealthCheckResponseServingStatus.NOT_SERVING)
        return health_pb.HealthCheckResponse(status=status)  # type: ignore[arg-type]  # betterproto types enum members as int


__all__ = ["InferenceService", "HealthService", "Draining", "ErrorKind"]
