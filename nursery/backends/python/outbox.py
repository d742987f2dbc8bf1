"""How a response sender's answers leave a Python model, and how several travel together.

Each request's way back is a :class:`Route`: on the server, the trio token and the request's
reply channel (``token.run_sync_soon(mailbox.tell, reply, answer)``: one wake of the trio
thread per answer); in a stub process, the channel to the server stands in for the token
(one socket message per answer, sent at once: the stand-in's ``run_sync_soon`` hands the
answer to the channel itself, so a stub process never loads ``mailbox``, nor trio).

``coalesce_responses()`` (nursery's addition to ``triton_python_backend_utils``) gathers what
the senders of one thread send inside the block and delivers it when the block ends, all at
once: on the server, one wake of the trio thread for the lot; in a stub, one message to the
server (the server's reader then hands the lot to the trio thread in one wake). A decode loop
that answers many requests per step (``nursery.llm``) sends each step's responses in one
block. Each request's answers keep their order, so its final flag still comes last; a block
inside a block is part of the outer one; sends from other threads are not held.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_held = threading.local()


def _first_tell(reply: Any, answer: Any) -> bool:
    """``mailbox.tell``, imported at the server's first answer (on the trio thread, where trio
    runs already) rather than at the top: a stub process imports this module too and never
    needs it. Later answers call ``mailbox.tell`` itself (:data:`_tell`)."""
    global _tell
    from nursery.actors import mailbox

    _tell = mailbox.tell
    return _tell(reply, answer)


_tell: Callable[[Any, Any], bool] = _first_tell  # mailbox.tell, once an answer has needed it


class Route:
    """One request's way back, called with each answer its sender sends."""

    __slots__ = ("token", "reply")

    def __init__(self, token: Any, reply: Any) -> None:
        self.token, self.reply = token, reply

    def __call__(self, answer: Any) -> None:
        pending: list[tuple[Route, Any]] | None = getattr(_held, "pending", None)
        if pending is not None:
            pending.append((self, answer))
            return
        self.token.run_sync_soon(_tell, self.reply, answer)


@contextmanager
def coalesce_responses() -> Iterator[None]:
    """Responses sent on this thread inside the block go out together when it ends."""
    if getattr(_held, "pending", None) is not None:
        yield  # inside another block: that one sends
        return
    pending: list[tuple[Route, Any]] = []
    _held.pending = pending
    try:
        yield
    finally:
        _held.pending = None
        if pending:
            deliver_together(pending)


def deliver_together(pending: list[tuple[Route, Any]]) -> None:
    """Answers of several requests, in the order sent: one hand-over per way back (a token
    that can take a list, ``tell_many``, gets it; the trio token gets one callback)."""
    groups: dict[int, tuple[Any, list[tuple[Any, Any]]]] = {}
    for route, answer in pending:
        groups.setdefault(id(route.token), (route.token, []))[1].append((route.reply, answer))
    for token, pairs in groups.values():
        many = getattr(token, "tell_many", None)
        if many is not None:
            many(pairs)
        else:
            token.run_sync_soon(tell_all, pairs)


def tell_all(pairs: list[tuple[Any, Any]]) -> None:
    """On the trio thread: each answer onto its request's reply channel, in order."""
    for reply, answer in pairs:
        _tell(reply, answer)
