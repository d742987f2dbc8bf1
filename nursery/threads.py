"""A dedicated OS thread that an actor owns for its whole life.

``trio.to_thread.run_sync`` picks any idle thread from a shared cache, so it cannot promise
"this instance always runs on this thread", which device state (CUDA streams, TensorRT
contexts, thread-affine libraries) needs. :class:`DedicatedThread` runs every call on one
thread, fed through a queue; the awaiting trio task is woken through the trio token.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

T = TypeVar("T")

_STOP = object()


class DedicatedThread:
    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._token = trio.lowlevel.current_trio_token()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def _main(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            fn, args, task = job
            result = outcome.capture(fn, *args)
            try:
                self._token.run_sync_soon(trio.lowlevel.reschedule, task, result)
            except trio.RunFinishedError:  # the trio run ended while we computed
                return

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the thread. Not cancellable once started: a computation
        in progress cannot be interrupted, so cancellation takes effect after it returns."""
        await trio.lowlevel.checkpoint_if_cancelled()
        self._jobs.put((fn, args, trio.lowlevel.current_task()))

        def abort(_: Any) -> trio.lowlevel.Abort:
            return trio.lowlevel.Abort.FAILED

        result: T = await trio.lowlevel.wait_task_rescheduled(abort)
        return result

    def stop(self) -> None:
        """Let the thread finish after any queued call."""
        self._jobs.put(_STOP)
