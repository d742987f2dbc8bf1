"""A dedicated OS thread that an actor owns for its whole life.

``trio.to_thread.run_sync`` picks any idle thread from a shared cache, so it cannot promise
"this instance always runs on this thread", which device state (CUDA streams, TensorRT
contexts, thread-affine libraries) needs. :class:`DedicatedThread` runs every job on one
thread, in submission order, fed through a queue. Results come back on the trio thread:
``call`` wakes the awaiting task; ``submit`` runs a callback (no task switch at all), which
lets an actor queue its next job while the current one computes. The thread's owner and context
are bound for ``current_token()`` and ``current_context()`` (``runtime/thread_context.py``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

from nursery.runtime.thread_context import local

T = TypeVar("T")

_STOP = object()


class DedicatedThread:
    def __init__(self, name: str, context: Any = None) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._token = trio.lowlevel.current_trio_token()
        self._context = context
        self.abandoned = False  # a job outlived its caller's patience (see ``call``)
        self.caught_up = trio.Event()  # set when such a job has come back after all
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def _main(self) -> None:
        run_sync_soon = self._token.run_sync_soon
        local.token = self._token  # what current_token() and current_context() read
        local.context = self._context
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            fn, args, done = job
            result = outcome.capture(fn, *args)
            try:
                run_sync_soon(done, result)
            except trio.RunFinishedError:  # the trio run ended while we computed
                return

    def submit(self, fn: Callable[..., T], args: tuple[Any, ...],
               done: Callable[[outcome.Outcome[T]], None]) -> None:
        """Queue ``fn(*args)``; ``done(outcome)`` then runs on the trio thread."""
        self._jobs.put((fn, args, done))

    async def call(self, fn: Callable[..., T], *args: Any, abandon_on_cancel: bool = False) -> T:
        """Run ``fn(*args)`` on the thread and return its result.

        A computation cannot be interrupted, so by default cancellation waits for it. With
        ``abandon_on_cancel`` a cancellation returns at once instead: the job runs on, its
        result is dropped when it comes, and the thread is marked :attr:`abandoned` (it may
        never come back: a model that hangs). The owner then stops using the thread."""
        await trio.lowlevel.checkpoint_if_cancelled()
        task = trio.lowlevel.current_task()
        waiting = [True]

        def done(result: outcome.Outcome[T]) -> None:
            if waiting[0]:
                trio.lowlevel.reschedule(task, result)
            else:  # the job its caller gave up on came back after all
                self.abandoned = False
                self.caught_up.set()

        self.submit(fn, args, done)

        def abort(_: Any) -> trio.lowlevel.Abort:
            if not abandon_on_cancel:
                return trio.lowlevel.Abort.FAILED
            waiting[0] = False
            self.abandoned = True
            self.caught_up = trio.Event()
            return trio.lowlevel.Abort.SUCCEEDED

        value: T = await trio.lowlevel.wait_task_rescheduled(abort)
        return value

    def stop(self) -> None:
        """Let the thread finish after the jobs already queued."""
        self._jobs.put(_STOP)
