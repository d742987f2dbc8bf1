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

A one-shot reply is a :class:`OneShot`: both ends of a capacity-1 memory channel in one small
object (a request's reply costs one allocation and one wake-up instead of a channel's state,
two ends and their statistics), with the channel's meanings kept exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

from nursery.errors import Unavailable

T = TypeVar("T")

GONE = (trio.BrokenResourceError, trio.ClosedResourceError)
_NOT_TAKEN = (*GONE, trio.WouldBlock)

_EMPTY = object()


class OneShot:
    """A reply slot for exactly one answer, with a capacity-1 memory channel's interface and
    meanings for both ends: the sender's ``send_nowait`` (``WouldBlock`` once it holds an
    answer, ``BrokenResourceError`` once the receiver has gone, ``ClosedResourceError`` after
    the sender's ``close``) and ``statistics().open_receive_channels``; the receiver's
    ``await receive()`` (``EndOfChannel`` when the sender closed without answering) and
    ``with slot:`` / ``close_receiver()``, which tell the sender nobody waits. Trio thread
    only."""

    __slots__ = ("_value", "_task", "_send_closed", "open_receive_channels")

    def __init__(self) -> None:
        self._value: Any = _EMPTY
        self._task: Any = None
        self._send_closed = False
        self.open_receive_channels = 1

    # -- the sender's end ---------------------------------------------------------------------

    def send_nowait(self, value: Any) -> None:
        if self._send_closed:
            raise trio.ClosedResourceError
        if not self.open_receive_channels:
            raise trio.BrokenResourceError
        if self._value is not _EMPTY:
            raise trio.WouldBlock
        task, self._task = self._task, None
        if task is not None:
            trio.lowlevel.reschedule(task, outcome.Value(value))
        else:
            self._value = value

    def close(self) -> None:
        """The sender's close: a receiver still waiting with no answer gets ``EndOfChannel``."""
        self._send_closed = True
        task, self._task = self._task, None
        if task is not None:
            trio.lowlevel.reschedule(task, outcome.Error(trio.EndOfChannel()))

    def statistics(self) -> OneShot:
        return self

    # -- the receiver's end -------------------------------------------------------------------

    async def receive(self) -> Any:
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._value is not _EMPTY:
            value, self._value = self._value, _EMPTY
            await trio.lowlevel.cancel_shielded_checkpoint()
            return value
        if self._send_closed:
            await trio.lowlevel.cancel_shielded_checkpoint()
            raise trio.EndOfChannel
        self._task = trio.lowlevel.current_task()

        def abort(_: Any) -> trio.lowlevel.Abort:
            self._task = None
            return trio.lowlevel.Abort.SUCCEEDED

        return await trio.lowlevel.wait_task_rescheduled(abort)

    def close_receiver(self) -> None:
        self.open_receive_channels = 0
        self._value = _EMPTY

    def __enter__(self) -> OneShot:
        return self

    def __exit__(self, *_: object) -> None:
        self.close_receiver()


class CallbackShot(OneShot):
    """A reply slot whose answer is handed to ``on_answer`` at once, on the trio thread, by
    whoever answers (no task waits for it): the sender's side and meanings are OneShot's. A
    sender that closes without answering hands ``on_answer`` the ``closed`` value instead.
    ``on_answer`` must not raise: the answering actor is running it."""

    __slots__ = ("_on_answer", "_closed")

    def __init__(self, on_answer: Callable[[Any], None], closed: Any) -> None:
        super().__init__()
        self._on_answer = on_answer
        self._closed = closed

    def send_nowait(self, value: Any) -> None:
        if self._send_closed:
            raise trio.ClosedResourceError
        if not self.open_receive_channels:
            raise trio.BrokenResourceError
        self.open_receive_channels = 0  # answered: nothing more is taken
        self._on_answer(value)

    def close(self) -> None:
        if self._send_closed:
            return
        self._send_closed = True
        if self.open_receive_channels:
            self.open_receive_channels = 0
            self._on_answer(self._closed)


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
    slot = OneShot()
    try:
        await inbox.send(make(slot))  # type: ignore[arg-type]
    except GONE:
        raise Unavailable(gone) from None
    with slot:
        try:
            return await slot.receive()  # type: ignore[no-any-return]
        except trio.EndOfChannel:  # the actor closed the reply without answering (it stopped)
            raise Unavailable(gone) from None
