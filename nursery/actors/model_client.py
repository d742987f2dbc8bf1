"""How a model reaches other models: BLS calls from Python models and ensemble steps.

A :class:`Gateway` wraps the server's :class:`~nursery.core.Core`, so a call from a model goes
through the target model's scheduler exactly like a client request (validation, batching,
statistics). The server installs one when it starts (:func:`install`); Python models call it
from their instance thread (``*_from_thread``, through the trio token), ensemble schedulers
from the trio thread.
"""

from __future__ import annotations

import math
import queue
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from nursery.errors import InvalidArgument, NurseryError, Unavailable
from nursery.messages import DecoupledResponse, InferWork

if TYPE_CHECKING:
    from nursery.actors.directory import Directory, ModelHandle
    from nursery.core import Core
    from nursery.types import InferenceRequest, InferenceResponse


@dataclass(frozen=True, slots=True)
class Part:
    """One answer of a streamed request: a response or an error, and whether it is the last."""

    response: InferenceResponse | None
    error: NurseryError | None
    final: bool


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


class Gateway:
    def __init__(self, core: Core, token: trio.lowlevel.TrioToken) -> None:
        self.core = core
        self.token = token

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        """One response from a non-decoupled model (errors raise)."""
        handle = self.core.resolve(request.model_name, request.model_version)
        if handle.config.decoupled:
            raise InvalidArgument(
                f"model '{handle.name}' uses the decoupled transaction policy; it must be "
                "called with decoupled=True (a stream of responses)")
        return await self.core.infer(request, handle)

    async def stream(self, request: InferenceRequest, on_part: OnPart) -> None:
        """Every answer of one request, in order, ending with a final one. Never raises a
        request's error: it arrives as a final :class:`Part`."""
        try:
            handle = self.core.resolve(request.model_name, request.model_version)
            if not handle.config.decoupled:
                response = await self.core.infer(request, handle)
            else:
                await stream_decoupled(request, handle, on_part)
                return
        except NurseryError as error:
            await on_part(Part(None, error, True))
            return
        await on_part(Part(response, None, True))

    # -- from a model's own thread (BLS) ---------------------------------------------------

    def infer_from_thread(self, request: InferenceRequest) -> InferenceResponse:
        return trio.from_thread.run(self.infer, request, trio_token=self.token)

    def stream_from_thread(self, request: InferenceRequest) -> Iterator[Part]:
        """The answers of one request, yielded on the calling thread as the target model
        sends them (a decoupled model's stream arrives while it is still running)."""
        reply = ThreadReply()

        def submit() -> InferWork | None:
            handle = self.core.resolve(request.model_name, request.model_version)
            if not handle.config.decoupled:
                return None
            work = make_work(request, handle, reply)  # type: ignore[arg-type]
            reply.meter = ResponseMeter(handle, work.enqueued_ns)
            handle.submit(work)
            return work

        try:
            work = trio.from_thread.run_sync(submit, trio_token=self.token)
            if work is None:  # not decoupled: its one response is the final part
                yield Part(self.infer_from_thread(request), None, True)
                return
        except NurseryError as error:
            yield Part(None, error, True)
            return
        try:
            while True:
                item = reply.queue.get()
                if isinstance(item, NurseryError):
                    yield Part(None, item, True)
                    return
                yield item
                if item.final:
                    return
        finally:
            reply.open_receive_channels = 0  # the caller stopped listening


class ThreadReply:
    """A reply channel whose receiver is a plain thread (a BLS call from a model's thread):
    what the scheduler and workers call on a reply channel, over a thread-safe queue."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.open_receive_channels = 1
        self.meter: ResponseMeter | None = None

    def send_nowait(self, item: Any) -> None:  # on the trio thread
        if self.meter is not None:
            self.meter.seen(item)
        self.queue.put(item)

    def statistics(self) -> ThreadReply:
        return self


def make_work(request: InferenceRequest, handle: ModelHandle,
              reply: trio.MemorySendChannel[Any]) -> InferWork:
    """Validate ``request`` for ``handle``'s model and wrap it for its scheduler."""
    from nursery.core import make_work as core_make_work

    return core_make_work(request, handle.config, reply)


async def stream_decoupled(request: InferenceRequest, handle: ModelHandle,
                           on_part: OnPart) -> None:
    """Run one request on a decoupled model: its reply channel is unbounded and carries
    :class:`Part` messages (or a bare error, which is final) until the final one."""
    send, receive = trio.open_memory_channel[Any](math.inf)
    work = make_work(request, handle, send)
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


_current: Gateway | None = None


def install(core: Core) -> Gateway:
    """Make ``core`` the way models reach other models (call from the trio thread)."""
    global _current
    _current = Gateway(core, trio.lowlevel.current_trio_token())
    return _current


def current() -> Gateway:
    if _current is None:
        raise Unavailable("models cannot call other models: the server is not running")
    return _current


def current_or_new(directory: Directory) -> Gateway:
    """The installed gateway, or one over ``directory`` (actor tests without a server)."""
    if _current is not None and _current.core.directory is directory:
        return _current
    from nursery.core import Core

    return Gateway(Core(directory), trio.lowlevel.current_trio_token())
