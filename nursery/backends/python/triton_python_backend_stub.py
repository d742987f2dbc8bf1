"""The stub process of one Python model instance (``python -m
nursery.backends.python.triton_python_backend_stub <fd> <instance>``), as Triton runs each
Python-backend instance: the model's ``model.py`` runs here, apart from the server, so a model
that exits, crashes or leaks takes only this process down. The module is named after Triton's
stub executable, so the stub is found by its command line as Triton's is; the model sees
``sys.argv == ['']``, as in Triton's stub (an embedded interpreter given no arguments), so a
model that runs ``unittest.main("model", exit=False)`` runs its own tests.

The server sends ``init`` (the model folder, version, instance name and completed
configuration), then ``execute`` batches, ``warm`` samples and finally ``finalize``. Inside,
the model runs in a :class:`~nursery.backends.python.backend.PythonInstance`, exactly as it
runs on a server thread: its answers, the responses its senders send from any thread, its
BLS calls (through :class:`StubClient`) and its log lines go back over the channel.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import socket
import sys
import threading
from functools import partial
from pathlib import Path
from typing import Any

from nursery.backends.python import backend as python_backend
from nursery.backends.python.ipc import Channel, ChannelClosed
from nursery.config.json_form import config_from_json
from nursery.config.model import read_model_config
from nursery.errors import InternalError, NurseryError
from nursery.messages import Part
from nursery.runtime import thread_context
from nursery.types import InferenceRequest, InferenceResponse, tensor_of

PARTS_PER_MESSAGE = 256  # answers coalesced into one message at most (a packet stays small)


class _Direct:
    """Stands in for the trio token: a sender's answer goes out on the channel at once, and
    the answers of a ``coalesce_responses()`` block go out as one ``parts`` message (in the
    order sent), which the server hands to its trio thread in one wake."""

    @staticmethod
    def run_sync_soon(tell: Any, reply: _Reply, answer: Any) -> None:
        """A Route's answer: ``tell`` (``mailbox.tell``, which on the server puts it on the
        request's reply channel from the trio thread) is not needed here, the answer goes
        on the channel at once."""
        reply.send_nowait(answer)

    @staticmethod
    def tell_many(pairs: list[tuple[_Reply, Any]]) -> None:
        channels: dict[int, tuple[Channel, list[tuple[int, int, Any]]]] = {}
        for reply, answer in pairs:
            channels.setdefault(id(reply.channel), (reply.channel, []))[1].append(
                (reply.batch, reply.index, answer))
        for channel, parts in channels.values():
            for at in range(0, len(parts), PARTS_PER_MESSAGE):
                channel.send("parts", parts[at:at + PARTS_PER_MESSAGE])


class _Reply:
    """A request's reply channel as the model's response sender sees it."""

    def __init__(self, channel: Channel, batch: int, index: int) -> None:
        self.channel, self.batch, self.index = channel, batch, index

    def send_nowait(self, answer: Any) -> None:
        self.channel.send("part", self.batch, self.index, answer)


class _Work:
    __slots__ = ("request", "reply", "cancelled")

    def __init__(self, request: InferenceRequest, reply: _Reply,
                 cancelled: set[tuple[int, int]]) -> None:
        self.request, self.reply, self.cancelled = request, reply, cancelled

    def abandoned(self) -> bool:
        """``request.is_cancelled()``: the server said the requester stopped waiting."""
        return (self.reply.batch, self.reply.index) in self.cancelled


class StubClient:
    """How a model in a stub reaches other models: BLS calls go to the server, which runs
    them through the target's scheduler like any request."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.calls: dict[int, queue.SimpleQueue[Any]] = {}
        self._ids = itertools.count(1)

    def _open(self, kind: str, *args: Any) -> tuple[int, queue.SimpleQueue[Any]]:
        """Send a call to the server; its answers arrive on the queue (the reader routes
        them by call id)."""
        call = next(self._ids)
        answers: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.calls[call] = answers
        try:
            self.channel.send(kind, call, *args)
        except BaseException:
            self.calls.pop(call, None)
            raise
        return call, answers

    def _ask(self, kind: str, *args: Any) -> Any:
        """A call with one answer: that answer, or its error raised."""
        call, answers = self._open(kind, *args)
        try:
            answer = answers.get()
        finally:
            self.calls.pop(call, None)
        if isinstance(answer, NurseryError):
            raise answer
        return answer

    @property
    def custom_metrics(self) -> StubClient:
        """The server's custom metrics, reached over the channel (each call waits for the
        server's answer, so a refused operation raises in the model as in Triton)."""
        return self

    def family(self, name: str, description: str, kind: int) -> None:
        self._ask("metric", "family", name, description, kind)

    def metric(self, name: str, labels: Any, buckets: Any) -> None:
        self._ask("metric", "metric", name, labels, buckets)

    def update(self, name: str, labels: Any, op: str, value: float = 0.0) -> float:
        return float(self._ask("metric", "update", name, labels, op, value))

    def manage_from_thread(self, op: str, name: str, *args: Any) -> Any:
        """Model management (pb_utils.load_model, ...), done by the server."""
        return self._ask("manage", op, name, *args)

    def infer_from_thread(self, request: InferenceRequest) -> InferenceResponse:
        answer = self._ask("bls", request, False)
        assert isinstance(answer, InferenceResponse)
        return answer

    def stream_from_thread(self, request: InferenceRequest) -> _StubStream:
        return _StubStream(self, *self._open("bls", request, True))


class _StubStream:
    """A BLS stream seen from the stub: the parts the server relays, and ``cancel()``, which
    the server turns into the request's cancellation."""

    def __init__(self, client: StubClient, call: int, answers: queue.SimpleQueue[Any]) -> None:
        self._client, self._call, self._answers = client, call, answers
        self._done = False

    def __iter__(self) -> _StubStream:
        return self

    def __next__(self) -> Part:
        if self._done:
            raise StopIteration
        part = self._answers.get()
        if isinstance(part, NurseryError):
            part = Part(None, part, True)
        if part.final:
            self._done = True
            self._client.calls.pop(self._call, None)
        return part  # type: ignore[no-any-return]

    def cancel(self) -> None:
        if not self._done:
            try:
                self._client.channel.send("bls_cancel", self._call)
            except ChannelClosed:
                pass


class _ToServer(logging.Handler):
    """The model's log lines (pb_utils.Logger, logging) go to the server's log."""

    def __init__(self, channel: Channel) -> None:
        super().__init__()
        self.channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.channel.send("log", record.levelno, record.name, record.getMessage())
        except Exception:  # noqa: BLE001 - a log line must never fail the model
            pass


def serve(channel: Channel) -> int:
    client = StubClient(channel)
    inbox: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
    cancelled: set[tuple[int, int]] = set()  # (batch, index) whose requester went away
    served: list[Any] = []  # the model's instance, once initialized

    def read() -> None:
        try:
            while True:
                message = channel.receive()
                if message[0] == "cancel":
                    cancelled.add((message[1], message[2]))
                elif message[0] == "forget":
                    cancelled.discard((message[1], message[2]))
                elif message[0] == "is_ready":
                    threading.Thread(target=check_ready, args=(message[1],),
                                     name="stub-is-ready", daemon=True).start()
                elif message[0] in ("bls_answer", "bls_part", "metric_answer", "manage_answer"):
                    answers = client.calls.get(message[1])
                    if answers is not None:
                        answers.put(message[2])
                else:
                    inbox.put(message)
        except ChannelClosed:
            inbox.put(None)  # the server is gone: finalize and leave

    def check_ready(call: int) -> None:
        """The model's is_ready(), on a thread of its own (execute may be running)."""
        thread_context.bind_context(client)
        answer: Any
        try:
            answer = served[0].check_ready() if served else False
        except NurseryError as exc:
            answer = exc
        except Exception as exc:  # noqa: BLE001 - the readiness check reports it
            answer = InternalError(python_backend.describe(exc))
        try:
            channel.send("ready_answer", call, answer)
        except ChannelClosed:
            pass

    threading.Thread(target=read, name="stub-reader", daemon=True).start()
    root = logging.getLogger()
    root.handlers[:] = [_ToServer(channel)]
    os.register_at_fork(after_in_child=partial(_forked, client))
    root.setLevel(logging.DEBUG)
    thread_context.bind_process_context(client)  # BLS from any thread of the model's

    first = inbox.get()
    if first is None or first[0] != "init":
        return 1
    _, folder, name, version, instance, config_json, args, script = first
    try:
        python_backend.register_utils()
        proto = config_from_json(json.dumps(config_json))
        config, _ = read_model_config(Path(folder), name, backends=_any_backend,
                                      auto_complete=False, proto=proto)
        instance_ = python_backend.start_model(Path(script), config, args, version, instance,
                                               token=_Direct())
    except NurseryError as exc:
        channel.send("failed", exc.message)
        return 1
    except Exception as exc:  # noqa: BLE001 - the load fails with the reason
        channel.send("failed", python_backend.describe(exc))
        return 1
    served.append(instance_)
    channel.send("ready", instance_.has_ready_hook)
    while True:
        message = inbox.get()
        if message is None or message[0] == "finalize":
            try:
                instance_.close()
            finally:
                if message is not None:
                    channel.send("bye")
            return 0
        kind = message[0]
        if kind == "execute":
            _, batch, requests = message
            work = [_Work(r, _Reply(channel, batch, i), cancelled)
                    for i, r in enumerate(requests)]
            answers = instance_.execute_requests(work)  # type: ignore[arg-type]
            channel.send("result", batch, answers)
        elif kind == "warm":
            _, inputs, names = message
            try:
                outputs = instance_.execute({t.name: t.data for t in inputs.inputs.values()},
                                            names)
                channel.send("warmed", InferenceResponse(name, version, [
                    tensor_of(n, a) for n, a in outputs.items()]))
            except NurseryError as exc:
                channel.send("warmed", exc)


def _forked(client: StubClient) -> None:
    """In a process the model forked (``multiprocessing.Pool``, as Triton's qa bls model
    does): a channel of its own to the server, handed over on the stub's, so its BLS calls,
    metrics and log lines are answered to it; the stub's socket is closed here, so the
    server still sees the stub's death however long the child lives."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stub_channel = client.channel
    try:
        stub_channel.hand_over(theirs)
    except ChannelClosed:
        pass
    finally:
        theirs.close()
    stub_channel.sock.close()  # this process's copy only (no shutdown: the stub's goes on)
    channel = Channel(ours)
    client.channel = channel
    client.calls = {}
    for handler in logging.getLogger().handlers:
        if isinstance(handler, _ToServer):
            handler.channel = channel

    def read() -> None:
        try:
            while True:
                message = channel.receive()
                answers = client.calls.get(message[1]) if len(message) > 1 else None
                if answers is not None:
                    answers.put(message[2])
        except ChannelClosed:
            pass

    threading.Thread(target=read, name="forked-reader", daemon=True).start()


def _any_backend(backend: str, model_name: str) -> Any:
    """Every model a stub runs is a Python model (a Python-based backend's too)."""
    return python_backend.FACTORY


def auto_complete() -> int:
    """``auto-complete``: a request as JSON on stdin (the script, the model's name and
    folder, its configuration); the answer as one JSON line on stdout."""
    request = json.loads(sys.stdin.read())
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    try:
        done = python_backend.complete_config(Path(request["script"]), request["model"],
                                              request["model_dir"], request["config"])
        answer: dict[str, Any] = {"config": done}
    except NurseryError as exc:
        answer = {"error": exc.message}
    except Exception as exc:  # noqa: BLE001 - the load fails with the reason
        answer = {"error": f"model '{request['model']}': auto_complete_config failed: "
                           f"{python_backend.describe(exc)}"}
    sys.stdout.write("\n" + json.dumps(answer) + "\n")
    sys.stdout.flush()
    return 0


def main(argv: list[str]) -> int:
    """``<fd> [<instance>]`` or ``auto-complete [<model>]`` (the name only shows who the
    process serves, in ``ps``)."""
    sys.argv = [""]  # what model code sees, as in Triton's stub
    if argv[1:2] == ["auto-complete"]:
        return auto_complete()
    sock = socket.socket(fileno=int(argv[1]))
    return serve(Channel(sock))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
