"""The one place that decides what a closed or broken channel between actors means.

Every actor talks over trio memory channels. Three things happen on them, and each has one
meaning when the other side is gone:

- :func:`answer` replies to a request on the reply channel the request carried. The requester
  may have stopped waiting (client gone, deadline passed, cancelled): its receive end is closed
  and the send raises ``BrokenResourceError``; a reply channel someone already closed raises
  ``ClosedResourceError``; a one-shot reply channel that already holds an answer raises
  ``WouldBlock``. All three mean "nobody needs this answer any more": it is dropped and
  ``False`` says so.
- :func:`tell` sends a notice that needs no answer to an actor's inbox. An actor that has
  stopped (its inbox closed) no longer needs the notice: ``False``.
- :func:`ask` sends a request with a fresh one-shot reply channel and waits for the answer. An
  actor that has stopped cannot answer: :class:`~nursery.errors.Unavailable` with the caller's
  words.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import trio

from nursery.errors import Unavailable

T = TypeVar("T")

GONE = (trio.BrokenResourceError, trio.ClosedResourceError)
_NOT_TAKEN = (*GONE, trio.WouldBlock)


def answer(reply: Any, value: Any, *, close: bool = False) -> bool:
    """Reply on a request's reply channel; ``False`` when nobody waits for the answer any more.
    ``close`` closes the reply channel afterwards (a one-shot answer)."""
    try:
        reply.send_nowait(value)
    except _NOT_TAKEN:
        return False
    finally:
        if close:
            reply.close()
    return True


def tell(inbox: trio.MemorySendChannel[Any], message: Any) -> bool:
    """A notice to an actor (no answer); ``False`` when the actor has stopped or, for a bounded
    inbox, is full (callers that must not lose a notice use unbounded inboxes)."""
    try:
        inbox.send_nowait(message)
    except _NOT_TAKEN:
        return False
    return True


async def ask(inbox: trio.MemorySendChannel[Any], make: Callable[[trio.MemorySendChannel[T]], Any],
              *, gone: str) -> T:
    """Send ``make(reply)`` to the actor and wait for its answer on ``reply``. Raises
    ``Unavailable(gone)`` when the actor has stopped. Leaving early (cancellation) closes the
    reply channel's receive end, which tells the actor nobody waits."""
    send, receive = trio.open_memory_channel[T](1)
    try:
        await inbox.send(make(send))
    except GONE:
        raise Unavailable(gone) from None
    with receive:
        try:
            return await receive.receive()
        except trio.EndOfChannel:  # the actor closed the reply without answering (it stopped)
            raise Unavailable(gone) from None
