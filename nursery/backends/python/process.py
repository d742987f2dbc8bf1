"""A Python model instance in a stub process of its own, seen from the server.

:class:`ProcessInstance` is what the instance worker holds: ``execute_requests`` runs on the
worker's thread, sends the batch to the stub and waits for its answers; a reader thread takes
everything else the stub sends (the responses a model's senders send at any time, BLS calls,
log lines) and routes it. A stub that dies (exit, segfault, OOM kill) fails what it held with
Triton's words for a dead stub, and the next batch starts a fresh stub (the model's
``initialize`` runs again); :meth:`kill` ends a stub that does not return, which is what an
unload or the shutdown does past their deadline.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import trio

from nursery.actors import mailbox
from nursery.backends.python.environment import (
    BOOTSTRAP,
    STUB_MODULE,
    environment_path,
    fallback_path,
    interpreter,
)
from nursery.backends.python.ipc import Channel, ChannelClosed
from nursery.backends.python.outbox import tell_all
from nursery.config.model import ModelConfig
from nursery.errors import ConfigError, InternalError, NurseryError, Unavailable
from nursery.messages import InferWork, Part
from nursery.runtime.thread_context import current_context, current_token
from nursery.types import InferenceRequest, tensor_of

log = logging.getLogger("nursery.backends.python")
FINALIZE_TIMEOUT = 30.0  # seconds a stub may take to finalize before it is killed
EXIT_WAIT = 30.0  # seconds a stub that closed its end may take to exit (a core dump on a
# loaded machine is slow) before it is killed, so its exit code or signal can be reported
CANCEL_POLL = 0.05  # seconds between looks for requesters that stopped waiting
MEMORY_POLL_TICKS = 4  # a look at the stub's memory every 4 of those (0.2 s)
MEMORY_LIMIT_KEY = "nursery_memory_limit"  # the model's parameter
MEMORY_LIMIT_SETTING = "nursery-memory-limit"  # --backend-config=python,<this>=<size>
MIB = 1 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def resident_bytes(pid: int) -> int | None:
    """A process's resident memory (RSS), or None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def parse_size(text: str, where: str) -> int:
    """``512M``, ``2G``, ``512MiB``, ``1GB`` (binary multiples) or bytes."""
    raw = text.strip().upper().removesuffix("IB").removesuffix("B")
    number, unit = (raw[:-1], raw[-1]) if raw and raw[-1] in "KMGT" else (raw, "")
    try:
        size = int(float(number) * _UNITS[unit])
    except ValueError:
        raise ConfigError(f"{where}: expected a size such as 512M or 2G, got '{text}'") from None
    if size <= 0:
        raise ConfigError(f"{where}: expected a size above 0, got '{text}'")
    return size
READY_WAIT = 10.0  # seconds an is_ready() answer is waited for at most
# what Triton's Python backend refuses in a stub's name (the instance's; the model's for the
# stub that completes a configuration), as characters a shell would read
INVALID_STUB_CHARACTERS = frozenset(";|&$`<>()[]{}\\\"'*?~#!")


def valid_stub_name(name: str) -> bool:
    return bool(name) and INVALID_STUB_CHARACTERS.isdisjoint(name)


def check_stub_name(name: str) -> None:
    """Refuse a stub name as Triton's Python backend does (before any process starts)."""
    if not valid_stub_name(name):
        raise ConfigError("Invalid stub name: contains invalid characters")


def _stub_environment(own_site: bool = True) -> dict[str, str]:
    """The server's environment, with this nursery first on the stub's import path (and,
    under an EXECUTION_ENV_PATH interpreter, the server's packages after the environment's)."""
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parents[3])
    if own_site:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
    else:
        env["PYTHONPATH"] = here
        env["NURSERY_STUB_FALLBACK"] = fallback_path()
        env.pop("PYTHONHOME", None)
    return env


AUTO_COMPLETE_TIMEOUT = 300.0  # seconds a stub may take to import model.py and complete


def complete_in_stub(script: Path, model_name: str, model_dir: str, given: dict[str, Any],
                     python: Path | None = None) -> dict[str, Any] | None:
    """``auto_complete_config`` run in a stub process of its own (under the model's own
    interpreter when it has an EXECUTION_ENV_PATH), so the server never imports the model's
    ``model.py``: the completed configuration, None without the method, or a ConfigError."""
    command = ([sys.executable, "-m", STUB_MODULE, "auto-complete", model_name]
               if python is None else [str(python), "-c", BOOTSTRAP, "auto-complete", model_name])
    request = json.dumps({"script": str(script), "model": model_name, "model_dir": model_dir,
                          "config": given})
    try:
        done = subprocess.run(command, input=request.encode(), capture_output=True,
                              timeout=AUTO_COMPLETE_TIMEOUT, check=False, close_fds=True,
                              env=_stub_environment(own_site=python is None))
    except subprocess.TimeoutExpired:
        raise ConfigError(f"model '{model_name}': auto_complete_config did not finish within "
                          f"{AUTO_COMPLETE_TIMEOUT:.0f} s") from None
    try:
        answer = json.loads(done.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        how = (f"exit code {done.returncode}" if done.returncode >= 0
               else f"killed by signal {-done.returncode}")
        tail = done.stderr.decode(errors="replace").strip()[-2000:]
        raise ConfigError(f"model '{model_name}': the stub process completing its "
                          f"configuration failed ({how}){': ' + tail if tail else ''}") from None
    if "error" in answer:
        raise ConfigError(answer["error"])
    return answer.get("config")  # type: ignore[no-any-return]


_COPY_ON_THREAD = 1 << 20  # a message with more tensor bytes is copied out on a worker thread


def _answer_call(channel: Channel, kind: str, call: int, answer: Any) -> None:
    """A call's one answer to the model (nobody to tell when its channel has closed)."""
    try:
        channel.send(kind, call, answer)
    except ChannelClosed:
        pass


def _close_watched(channel: Channel) -> None:
    trio.lowlevel.notify_closing(channel.sock)
    channel.close()


class _Dead(Exception):
    """The stub process is gone."""


class ProcessInstance:
    """One ``TritonPythonModel`` in its stub process (:data:`STUB_MODULE`)."""

    def __init__(self, config: ModelConfig, version: str, name: str,
                 args: Mapping[str, str], script: Path | None = None,
                 memory_limit: int | None = None) -> None:
        check_stub_name(config.name)  # Triton's stub that completes the configuration
        check_stub_name(name)  # and the instance's
        self.config = config
        self.memory_limit = memory_limit  # bytes of RSS the stub may hold (None: no limit)
        self._kill_reason = ""
        # the model's file (a Python-based backend's model.py lives in the backend directory)
        self.script = script if script is not None else (
            config.path / version / (config.default_model_filename or "model.py"))
        self.version = version
        self.model_name = config.name
        self.instance_name = name
        self.decoupled = config.decoupled
        self._args = dict(args)
        env = environment_path(config)  # EXECUTION_ENV_PATH: the stub under that interpreter
        try:
            self._python = interpreter(config, env) if env is not None else None
        except NurseryError as exc:
            raise InternalError(exc.message) from None
        self._token = current_token()
        self._trio_thread = -1  # the trio thread's ident, once a reader task has run there
        self._client = current_context()  # the server's ModelClient: BLS calls go through it
        self._bls = ThreadPoolExecutor(max_workers=16, thread_name_prefix=f"{name}-bls")
        self._batches = itertools.count(1)
        self._lock = threading.Lock()
        self._open: dict[tuple[int, int], InferWork] = {}  # requests a sender may still answer
        # batches sent to the stub, by id: their size and where their answers go (a waiting
        # thread's queue, or the trio thread for a batch start_requests sent)
        self._started: dict[int, tuple[int, Callable[[list[Any]], None]]] = {}
        self._control: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._ready_calls: dict[int, queue.SimpleQueue[Any]] = {}
        # BLS streams in flight, by (the channel, its call id): the stub's and its forks'
        self._streams: dict[tuple[int, int], Any] = {}
        self._ready_ids = itertools.count(1)
        self.has_ready_hook = False  # the model defines is_ready() (the stub says)
        self.restarts = 0
        self._life = threading.Lock()  # one start at a time (batches of several threads)
        self._closing = False
        self._opened = threading.Event()  # set when a batch opens requests (wakes _watch)
        self._starting = False
        self._start()
        threading.Thread(target=self._watch, name=f"{name}-cancel-watch", daemon=True).start()

    @property
    def healthy(self) -> bool:
        """The stub is up (False from its death until the next batch starts it again; the
        process is asked too, as Triton asks, so a stub killed a moment ago reads dead before
        its reader has seen the socket close)."""
        return not self.dead and not self._starting and not self._exited()

    def _exited(self) -> bool:
        """The stub process has ended (looked at without reaping it, so no lock is shared
        with the thread that reaps it after its death, which may be waiting for it now)."""
        if self.process.returncode is not None:
            return True
        try:
            return os.waitid(os.P_PID, self.process.pid,
                             os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:  # reaped meanwhile
            return True

    @property
    def unhealthy_reason(self) -> str:
        """Why the instance is not ready while its stub is down (Triton's words)."""
        return f"Stub process '{self.instance_name}' is not healthy."

    # -- the stub's life ---------------------------------------------------------------------

    def _start(self) -> None:
        self._starting = True
        try:
            self._spawn()
        finally:
            self._starting = False

    def _spawn(self) -> None:
        channel, theirs = Channel.pair()
        self.channel = channel
        self._kill_reason = ""
        self.dead = True  # until the stub says it is ready: a batch waits for the start
        # this stub's control messages: a queue of its own, so a late word from the stub before
        # (its reader reporting its death) never lands where this start waits for "ready"
        control: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._control = control
        try:
            fd = str(theirs.fileno())
            command = ([sys.executable, "-m", STUB_MODULE, fd, self.instance_name]
                       if self._python is None
                       else [str(self._python), "-c", BOOTSTRAP, fd, self.instance_name])
            self.process = subprocess.Popen(
                command, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, close_fds=True,
                env=_stub_environment(own_site=self._python is None))
        finally:
            theirs.close()
        # the stub's messages are read by a task on the trio thread: an answer reaches its
        # requester with one wake of trio (the socket's), not a reader thread's wake and then
        # trio's
        try:
            self._token.run_sync_soon(self._start_reader, channel, control)
        except RuntimeError:  # the trio run is over (a shutdown): a thread reads instead
            threading.Thread(target=self._read, args=(channel, control),
                             name=f"{self.instance_name}-stub-reader", daemon=True).start()
        config = self.config
        try:
            channel.send("init", str(config.path), config.name, self.version,
                         self.instance_name, dict(config.json), self._args, str(self.script))
        except ChannelClosed:
            pass  # the reader reports the death
        answer = control.get()
        if answer[0] == "ready":
            self.has_ready_hook = bool(answer[1]) if len(answer) > 1 else False
            self.dead = False
            log.info("model '%s': instance %s runs in stub process %d", config.name,
                     self.instance_name, self.process.pid)
            return
        self._terminate()
        if answer[0] == "failed":
            raise InternalError(answer[1])
        raise InternalError(self._death())

    def _death(self) -> str:
        code = self.process.poll()
        how = f" (exit code {code})" if code is not None and code >= 0 else (
            f" (killed by signal {-code})" if code is not None else "")
        why = f": {self._kill_reason}" if self._kill_reason else ""
        return f"Stub process '{self.instance_name}' is not healthy{how}{why}."

    def _start_reader(self, channel: Channel,
                      control: queue.SimpleQueue[tuple[Any, ...]]) -> None:
        self._trio_thread = threading.get_ident()
        trio.lowlevel.spawn_system_task(self._read_in_trio, channel, control,
                                        name=f"{self.instance_name}-stub-reader")

    async def _read_in_trio(self, channel: Channel,
                            control: queue.SimpleQueue[tuple[Any, ...]]) -> None:
        """The stub's messages, on the trio thread. A message with many tensor bytes is copied
        out of the ring on a worker thread (the loop is not held by a large copy); the next
        waits for it, so the order holds. A system task: nothing but Cancelled leaves it."""
        try:
            while True:
                try:
                    packet, fds = channel.receive_packet(wait=False)
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(channel.sock)
                    continue
                if Channel.tensor_bytes(packet) > _COPY_ON_THREAD:
                    message = await trio.to_thread.run_sync(channel.decode, packet, fds)
                else:
                    message = channel.decode(packet, fds)
                self._dispatch(channel, control, message)
        except (ChannelClosed, trio.ClosedResourceError):  # closed: by the stub or by us
            pass
        except trio.Cancelled:  # the server's run is ending: nobody waits for the stub
            raise
        except Exception:  # noqa: BLE001 - a garbled message: the stub is not trusted further
            self._unreadable()
        # the death's bookkeeping waits for the process: on a thread of its own
        threading.Thread(target=self._died, args=(channel, control),
                         name=f"{self.instance_name}-stub-died", daemon=True).start()

    def _read(self, channel: Channel, control: queue.SimpleQueue[tuple[Any, ...]]) -> None:
        """The stub's messages on a thread (when there is no trio run to read them on)."""
        try:
            while True:
                self._dispatch(channel, control, channel.receive())
        except ChannelClosed:
            pass
        except Exception:  # noqa: BLE001 - a garbled message: the stub is not trusted further
            self._unreadable()
        self._died(channel, control)

    def _unreadable(self) -> None:
        """The stub sent what cannot be read (called in the handler): it is ended."""
        log.exception("model '%s': instance %s sent what cannot be read", self.model_name,
                      self.instance_name)
        self._terminate()

    def _dispatch(self, channel: Channel, control: queue.SimpleQueue[tuple[Any, ...]],
                  message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "result":
            self._finish(message[1], message[2])
        elif kind == "part":  # one response a model's sender sent
            self._parts([message[1:4]])
        elif kind == "parts":  # a coalesce_responses() block: one wake for the lot
            self._parts(message[1])
        elif kind == "ready_answer":
            answers = self._ready_calls.get(message[1])
            if answers is not None:
                answers.put(message[2])
        elif not self._serve_model(channel, message):  # ready, failed, warmed, bye
            control.put(message)

    def _serve_model(self, channel: Channel, message: tuple[Any, ...]) -> bool:
        """What the model asks of the server from its stub, or from a process it forked
        (its own channel): BLS calls, custom metrics, log lines. False: not such a message."""
        kind = message[0]
        if kind == "bls":
            self._bls.submit(self._call, channel, *message[1:])
        elif kind == "bls_cancel":  # the model cancelled a BLS stream
            stream = self._streams.get((id(channel), message[1]))
            if stream is not None:
                self._bls.submit(stream.cancel)  # it waits for the trio thread
        elif kind == "metric":
            self._metric(channel, *message[1:])
        elif kind == "manage":  # pb_utils.load_model / unload_model / is_model_ready
            self._bls.submit(self._manage, channel, *message[1:])
        elif kind == "log":
            logging.getLogger(message[2] or "nursery.python_model").log(
                message[1], "%s", message[3])
        elif kind == "attach":  # the model forked (multiprocessing): the child's own channel
            side = Channel(socket.socket(fileno=message[1]))
            threading.Thread(target=self._serve_forked, args=(side,),
                             name=f"{self.instance_name}-forked", daemon=True).start()
        else:
            return False
        return True

    def _serve_forked(self, side: Channel) -> None:
        """A process the model forked from its stub: its BLS calls, metrics and log lines,
        until it exits (its end closing is no death of the stub)."""
        try:
            while True:
                message = side.receive()
                if not self._serve_model(side, message):
                    log.error("model '%s': a process forked by instance %s sent '%s', which "
                              "only the stub may send", self.model_name, self.instance_name,
                              message[0])
        except ChannelClosed:
            pass
        except Exception:  # noqa: BLE001 - a garbled message: that process is not trusted
            log.exception("model '%s': a process forked by instance %s sent what cannot be "
                          "read", self.model_name, self.instance_name)
        finally:
            side.close()

    def _soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn`` on the trio thread: at once when called there, else soon."""
        if threading.get_ident() == self._trio_thread:
            fn(*args)
        else:
            self._token.run_sync_soon(fn, *args)

    def _died(self, channel: Channel, control: queue.SimpleQueue[tuple[Any, ...]]) -> None:
        if channel is not self.channel:
            return
        try:
            self.process.wait(timeout=EXIT_WAIT)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.dead = True
        error = InternalError(self._death())
        with self._lock:
            open_requests = list(self._open.values())
            self._open.clear()
        for batch in list(self._started):
            self._finish(batch, _Dead(error.message))
        for answers in list(self._ready_calls.values()):
            answers.put(False)  # a readiness check in flight: not ready
        for work in open_requests:  # requests a sender was still answering (decoupled)
            answer = Part(None, error, True) if self.decoupled else error
            self._token.run_sync_soon(mailbox.tell, work.reply, answer)
        control.put(("dead",))
        if not self._closing and not self._starting:  # a failed start is its caller's
            # as in Triton, the instance stays not ready; the next batch starts a new stub
            log.error("model '%s': %s It is started again for the next request.",
                      self.model_name, error.message)

    def _watch(self) -> None:
        """Tell the stub when a requester stops waiting (``request.is_cancelled()`` there):
        the reply channel's receive end closes, which only the server can see."""
        told: set[tuple[int, int]] = set()
        for tick in itertools.count():
            if self._closing:
                return
            if self.memory_limit is None and not told:
                # nothing open and nothing to look at: sleep until a batch opens requests
                # (an idle server with hundreds of stub models does not poll them all)
                self._opened.clear()
                with self._lock:
                    idle = not self._open
                if idle:
                    self._opened.wait()
                    continue
            time.sleep(CANCEL_POLL)
            if self.memory_limit is not None and tick % MEMORY_POLL_TICKS == 0:
                self._check_memory()
            with self._lock:
                open_now = list(self._open.items())
            keys = {key for key, _ in open_now}
            for key in told - keys:  # answered since: the stub may forget it
                told.discard(key)
                self._tell("forget", *key)
            for key, work in open_now:
                if key not in told and work.abandoned():
                    told.add(key)
                    self._tell("cancel", *key)

    def _check_memory(self) -> None:
        """Kill a stub whose resident memory passed the model's limit (it is then started
        again, as after any death, and its requests fail with the reason)."""
        process = self.process
        if self.dead or process.poll() is not None:
            return
        rss = resident_bytes(process.pid)
        if rss is None or self.memory_limit is None or rss <= self.memory_limit:
            return
        self._kill_reason = (
            f"its resident memory ({rss / MIB:.0f} MiB) passed the limit of "
            f"{self.memory_limit / MIB:.0f} MiB ({MEMORY_LIMIT_KEY}); it was killed")
        log.error("model '%s': instance %s: %s", self.model_name, self.instance_name,
                  self._kill_reason)
        process.kill()

    def _tell(self, *message: Any) -> None:
        if not self.dead:
            try:
                self.channel.send(*message)
            except ChannelClosed:
                pass

    def _parts(self, parts: list[tuple[int, int, Any]]) -> None:
        """Responses the model's senders sent together: on to their requesters, in order, in
        one call on the trio thread."""
        routed = []
        with self._lock:
            for batch, index, answer in parts:
                final = not isinstance(answer, Part) or answer.final
                work = self._open.pop((batch, index), None) if final else self._open.get(
                    (batch, index))
                if work is not None:
                    routed.append((work.reply, answer))
        if routed:
            self._soon(tell_all, routed)

    def _metric(self, channel: Channel, call: int, op: str, *args: Any) -> None:
        """A custom-metric operation from the model, on the server's registry."""
        answer: Any
        try:
            if self._client is None:
                raise Unavailable("custom metrics are not available here")
            metrics = self._client.custom_metrics
            if op == "family":
                answer = metrics.family(*args)
            elif op == "metric":
                labels, buckets = args[1], args[2]
                answer = metrics.metric(args[0], tuple(map(tuple, labels)),
                                        None if buckets is None else tuple(buckets))
            else:
                answer = metrics.update(args[0], tuple(map(tuple, args[1])), *args[2:])
        except NurseryError as error:
            answer = error
        _answer_call(channel, "metric_answer", call, answer)

    def _manage(self, channel: Channel, call: int, op: str, *args: Any) -> None:
        """A model-management call from the model (it waits on a BLS thread: a load takes
        its time)."""
        answer: Any
        try:
            if self._client is None:
                raise Unavailable("model management is not available here")
            answer = self._client.manage_from_thread(op, *args)
        except NurseryError as error:
            answer = error
        _answer_call(channel, "manage_answer", call, answer)

    def _call(self, channel: Channel, call: int, request: InferenceRequest,
              decoupled: bool) -> None:
        """A BLS call from the model, through the server's model client."""
        client = self._client
        try:
            if client is None:
                raise Unavailable("models cannot call other models here: no model client")
            if decoupled:
                stream = client.stream_from_thread(request)
                key = (id(channel), call)  # a forked process counts its calls apart
                self._streams[key] = stream  # the model may cancel it
                try:
                    for part in stream:
                        channel.send("bls_part", call, part)
                finally:
                    self._streams.pop(key, None)
                return
            channel.send("bls_answer", call, client.infer_from_thread(request))
        except NurseryError as error:
            try:
                channel.send("bls_part" if decoupled else "bls_answer", call, error)
            except ChannelClosed:
                pass
        except ChannelClosed:
            pass

    def check_ready(self) -> bool:
        """The model's ``is_ready()``, run in the stub (the instance worker bounds the wait;
        this one is bounded too, so an abandoned call does not stay forever)."""
        if self.dead:
            return False
        call = next(self._ready_ids)
        answers: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._ready_calls[call] = answers
        try:
            self.channel.send("is_ready", call)
            answer = answers.get(timeout=READY_WAIT)
        except (ChannelClosed, queue.Empty):
            return False
        finally:
            self._ready_calls.pop(call, None)
        if isinstance(answer, NurseryError):
            raise answer
        return bool(answer)

    # -- the backend contract ------------------------------------------------------------------

    def execute_requests(self, work: Sequence[InferWork]) -> list[Any]:
        """Run ``execute`` in the stub on these requests; one answer per request, ``None``
        where the model's sender answers (or will)."""
        if self.dead:
            with self._life:  # another batch may be starting it right now
                if self.dead:
                    self.restarts += 1
                    try:
                        self._start()
                    except NurseryError as exc:
                        return [exc] * len(work)
        results: queue.SimpleQueue[list[Any]] = queue.SimpleQueue()
        batch = self._begin(work, results.put)
        try:
            self.channel.send("execute", batch, [item.request for item in work])
        except ChannelClosed:
            pass  # the reader reports the death, which finishes the batch
        return results.get()

    def start_requests(self, work: Sequence[InferWork],
                       done: Callable[[list[Any]], None]) -> bool:
        """:meth:`execute_requests` without a thread waiting for it: called on the trio
        thread, it sends the batch to the stub without blocking and returns True; ``done``
        later runs on the trio thread with the answers (the reader thread hands them over),
        so a request crosses to the stub and back with no instance thread in between.
        False (nothing sent): the stub is not up or the socket is full; the caller then runs
        the batch the blocking way, which starts a dead stub again."""
        if self.dead or self._closing:
            return False
        batch = self._begin(work, partial(self._to_trio, done))
        try:
            self.channel.send("execute", batch, [item.request for item in work], wait=False)
        except BlockingIOError:
            with self._lock:
                del self._started[batch]
                for index in range(len(work)):
                    self._open.pop((batch, index), None)
            return False
        except ChannelClosed:
            pass  # the reader reports the death, which finishes the batch
        return True

    def _begin(self, work: Sequence[InferWork], deliver: Callable[[list[Any]], None]) -> int:
        """A new batch's id, its requests open to the model's senders, its answers bound
        for ``deliver``."""
        batch = next(self._batches)
        with self._lock:
            self._started[batch] = (len(work), deliver)
            for index, item in enumerate(work):
                self._open[(batch, index)] = item
        self._opened.set()
        return batch

    def _finish(self, batch: int, answers: list[Any] | _Dead) -> None:
        """A batch's answers (from the stub's reader), or its stub's death: one answer per
        request, ``None`` where the model's sender answers (or will), to where they go."""
        with self._lock:
            started = self._started.pop(batch, None)
            if started is None:
                return
            count, deliver = started
            if isinstance(answers, _Dead):
                answers = [InternalError(str(answers))] * count
            for index, answer in enumerate(answers):
                if answer is not None:  # answered in the result: no sender will
                    self._open.pop((batch, index), None)
        deliver(list(answers))

    def _to_trio(self, done: Callable[[list[Any]], None], answers: list[Any]) -> None:
        try:
            self._soon(done, answers)
        except RuntimeError:  # the trio run is over: nobody waits for it
            pass

    def execute(self, inputs: Mapping[str, np.ndarray],
                output_names: Sequence[str]) -> dict[str, np.ndarray]:
        """One warm-up sample; the outputs, or the error raised."""
        request = InferenceRequest(self.model_name, self.version, {
            n: tensor_of(n, a) for n, a in inputs.items()})
        self.channel.send("warm", request, list(output_names))
        answer = self._control.get()
        if answer[0] != "warmed":
            raise InternalError(self._death())
        if isinstance(answer[1], NurseryError):
            raise answer[1]
        return {t.name: t.data for t in answer[1].outputs}

    def close(self) -> None:
        """``finalize`` in the stub, then its exit; a stub that takes longer than
        ``FINALIZE_TIMEOUT`` is killed."""
        self._closing = True
        self._opened.set()
        try:
            if not self.dead:
                self.channel.send("finalize")
                try:
                    self.process.wait(timeout=FINALIZE_TIMEOUT)
                except subprocess.TimeoutExpired:
                    log.error("model '%s': instance %s did not finalize in %.0f s; killed",
                              self.model_name, self.instance_name, FINALIZE_TIMEOUT)
        except ChannelClosed:
            pass
        finally:
            self._terminate()
            self._bls.shutdown(wait=False, cancel_futures=True)

    def kill(self) -> None:
        """End the stub now, for good (a hung model at unload or shutdown)."""
        self._closing = True
        self._opened.set()
        self._terminate()

    def _terminate(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._close_channel(self.channel)

    def _close_channel(self, channel: Channel) -> None:
        """Close a channel whose socket a reader task on the trio thread may be waiting on:
        trio is told first (``notify_closing``), on its own thread, so that the descriptor's
        number, once reused by the next stub's socket, is not still taken for this one's."""
        if self._trio_thread == -1:
            channel.close()
            return
        try:
            self._soon(_close_watched, channel)
        except RuntimeError:  # the trio run is over: nothing waits on the socket any more
            channel.close()

