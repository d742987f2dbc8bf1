"""The engine's end of one frontend's link: requests decoded by the frontend go to the core's
model client (``ModelClient.dispatch_holding``), exactly where the in-process fast path
(``infer.infer_now``) puts them; the model's answer goes back as it is, and the frontend
encodes it. What the fast path would not take (tracing on, loading on demand, a decoupled
model, a model that cannot be resolved or refuses the request) is answered ``FALLBACK``: the
frontend then forwards the whole HTTP request to the engine's own HTTP server, which gives
the exact answer the in-process server gives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nursery.core import Core
from nursery.errors import NurseryError
from nursery.protocol.frontends.link import (
    ABANDON,
    ANSWER,
    FAILED,
    FALLBACK,
    INFER,
    Link,
    pack_response,
    unpack_request,
)
from nursery.protocol.http.infer import failed_response
from nursery.types import InferenceRequest


def _nothing() -> None:
    """No shared-memory region is held: the frontend forwards any request naming one."""


class EngineEnd:
    """Serves one frontend's link until it closes; then abandons what it still waits for
    (that frontend's clients are gone with it)."""

    def __init__(self, core: Core, link: Link) -> None:
        self.core = core
        self.link = link
        self.waiting: dict[int, Callable[[], None]] = {}

    async def run(self) -> None:
        try:
            while messages := await self.link.receive():
                for message in messages:
                    kind = message[0]
                    if kind == INFER:
                        self._infer(message[1], unpack_request(message[2]), message[3])
                    elif kind == ABANDON:
                        abandon = self.waiting.pop(message[1], None)
                        if abandon is not None:
                            abandon()
        finally:
            waiting, self.waiting = self.waiting, {}
            for abandon in waiting.values():
                abandon()

    def _infer(self, rid: int, request: InferenceRequest, encoding: bytes | None) -> None:
        core, link = self.core, self.link
        if core.demand is not None or core.tracer.active:
            link.send((FALLBACK, rid))
            return
        try:
            handle = core.resolve(request.model_name, request.model_version)
        except NurseryError:
            link.send((FALLBACK, rid))
            return
        if handle.config.decoupled:
            link.send((FALLBACK, rid))
            return
        waiting = self.waiting  # the request came unpacked with trace=False: not traced

        def answered(answer: Any) -> None:
            if waiting.pop(rid, None) is None:
                return  # abandoned meanwhile
            if isinstance(answer, NurseryError):
                link.send((FAILED, rid, failed_response(answer, request, encoding)))
            else:
                link.send((ANSWER, rid, pack_response(answer)))

        waiting[rid] = _nothing  # an answer given while queueing finds it here
        abandon = core.client.dispatch_holding(request, handle, answered, _nothing)
        if abandon is None:
            if waiting.pop(rid, None) is not None:
                link.send((FALLBACK, rid))  # refused: the engine's own server answers it
            return
        if rid in waiting:
            waiting[rid] = abandon
