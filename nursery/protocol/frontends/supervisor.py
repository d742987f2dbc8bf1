"""The engine's side of ``--http-frontend-processes N``: N frontend processes on the HTTP port,
each kept running.

The engine opens the HTTP port's listening sockets itself (so a port in use still stops the
start-up with Triton's line) and hands them to every frontend process it starts; it serves
no public connection itself. Each frontend gets a link of its own (a ``socketpair``), served
by an :class:`~nursery.protocol.frontends.engine_end.EngineEnd`.

Supervision: a frontend that exits or crashes is started again (0.5 s after, doubling to
10 s while it keeps failing within 30 s of its start), with one error line naming its exit;
its clients' connections were its own and end with it, every other frontend goes on, and
what the engine still had queued for it is abandoned (withdrawn from the models' queues).
At shutdown each frontend is told ``CLOSE``: it stops accepting and drains its requests (the
engine still answers them), then exits; the caller's cancel scope bounds the wait, and a
frontend still there is killed. The listening sockets close once no frontend needs them.
"""

from __future__ import annotations

import base64
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence

import trio

from nursery.core import Core
from nursery.protocol.frontends.engine_end import EngineEnd
from nursery.protocol.frontends.link import CLOSE, Link
from nursery.protocol.frontends.process import SETTINGS_ENV
from nursery.runtime.supervision import Boundary
from nursery.settings import Settings

log = logging.getLogger("nursery.http")

_FIRST_DELAY = 0.5
_MAX_DELAY = 10.0
_STEADY = 30.0  # a frontend that ran this long before exiting restarts after the first delay


def _exit_words(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


class FrontendProcesses:
    """The frontend processes of the HTTP port (each restart counts one failure of unit
    ``http-frontend`` in the server's fault counter)."""

    def __init__(self, core: Core, settings: Settings, listeners: Sequence[trio.SocketListener],
                 engine_port: int, count: int) -> None:
        self.core = core
        self.listeners = list(listeners)
        self.engine_port = engine_port
        self.count = count
        self._environ = {**os.environ,
                         SETTINGS_ENV: base64.b64encode(pickle.dumps(settings)).decode()}
        # each process's share of --http-max-connections
        self._cap = max(1, settings.http_max_connections // count)

    async def run(self, shutdown: trio.Event, gone: trio.Event,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep ``count`` frontends running until ``shutdown``; ``gone`` is set once they have
        all exited (the engine's own HTTP server may close then)."""
        try:
            async with trio.open_nursery() as nursery:
                for index in range(self.count):
                    nursery.start_soon(self._keep, index, shutdown)
                task_status.started()
        finally:
            for listener in self.listeners:
                listener.socket.close()
            gone.set()

    async def _keep(self, index: int, shutdown: trio.Event) -> None:
        delay = _FIRST_DELAY
        while not shutdown.is_set():
            started = trio.current_time()
            code: int | None = None
            # the engine's side of the link is this boundary's unit: a failure in it ends
            # (kills) that frontend, which starts again like one that exited
            boundary = Boundary(self.core.faults, "http-frontend", log,
                                f"the link of HTTP frontend process {index}")
            with boundary:
                code = await self._run_one(index, shutdown)
            if shutdown.is_set():
                return
            if boundary.failure is None:
                self.core.faults.count("http-frontend")
            if trio.current_time() - started >= _STEADY:
                delay = _FIRST_DELAY
            log.error("HTTP frontend process %d exited (%s); starting it again in %.1f s",
                      index, _exit_words(code), delay)
            with trio.move_on_after(delay):
                await shutdown.wait()
            delay = min(delay * 2, _MAX_DELAY)

    async def _run_one(self, index: int, shutdown: trio.Event) -> int | None:
        """One frontend process, from its start to its exit: its exit status."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fds = [listener.socket.fileno() for listener in self.listeners]
        argv = [sys.executable, "-m", "nursery.protocol.frontends.process",
                "--link-fd", str(theirs.fileno()),
                "--listen-fds", ",".join(map(str, fds)),
                "--engine-port", str(self.engine_port),
                "--connections", str(self._cap)]
        try:
            process = await trio.lowlevel.open_process(
                argv, pass_fds=[theirs.fileno(), *fds], stdin=subprocess.DEVNULL,
                env=self._environ)
        finally:
            theirs.close()
        link = Link(trio.socket.from_stdlib_socket(mine))
        end = EngineEnd(self.core, link)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(link.run_writer)
                nursery.start_soon(_close_on, shutdown, link)
                await end.run()  # until the link closes: the process exits (or crashed)
                await process.wait()
                nursery.cancel_scope.cancel()
        finally:
            if process.returncode is None:
                process.kill()
                with trio.CancelScope(shield=True):
                    await process.wait()
            await link.aclose()
        return process.returncode


async def _close_on(shutdown: trio.Event, link: Link) -> None:
    await shutdown.wait()
    link.send((CLOSE,))
