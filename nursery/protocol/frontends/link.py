"""The link between one frontend process and the engine: messages over a Unix stream socket.

A message is a tuple, pickled (protocol 5) and framed by its length (4 bytes, little-endian).
Both ends are nursery's own processes, joined by a ``socketpair`` made by the engine before
the frontend starts: nothing else can reach the socket, so pickle's trust rule holds (a
client's bytes are inside the messages as data, never as pickles).

A message leaves at once when nothing is queued before it (one non-blocking ``send``: the
other process can start on it while this one goes on); otherwise, or when the socket is
full, it is queued, and the writer task sends everything queued in one write. Measured on
the 2-core machine, sending at once beat gathering per turn: the other end waited for the
sender's whole turn (a batch's worth of parsing) before it saw the first request. Reads take
every whole message a ``recv`` brought.

The kinds (the first item of each tuple):

- frontend to engine: ``(INFER, id, request, encoding)``: an ``InferenceRequest`` decoded by
  the frontend (as :func:`pack_request` writes it), and its Content-Encoding (for the error
  answer's headers);
  ``(ABANDON, id)``: its client left.
- engine to frontend: ``(ANSWER, id, response)`` (as :func:`pack_response` writes it);
  ``(FAILED, id, (status, headers, body))``: the error answer, written by the engine;
  ``(FALLBACK, id)``: not taken on this path (tracing, loading on demand, a decoupled model,
  a model not ready...): the frontend forwards the whole HTTP request to the engine's own
  HTTP server instead; ``(CLOSE,)``: shut down.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

import numpy as np
import trio

from nursery.types import DataType, InferenceRequest, InferenceResponse, RequestedOutput, Tensor

INFER, ABANDON, ANSWER, FAILED, FALLBACK, CLOSE = range(6)

_LENGTH = struct.Struct("<I")
MAX_MESSAGE = 1 << 31  # the frame's limit: a tensor past it is not handed over this way
_READ = 1 << 20


# Requests and responses travel as tuples of plain values, which pickle packs in C: the
# dataclasses and arrays themselves cost about 20 us each way through pickle's generic path.
# A tensor is (name, datatype, shape, bytes) with its elements in the datatype's own layout;
# BYTES elements as a tuple of bytes.
_PackedTensor = tuple[str, str, tuple[int, ...], Any]


def _pack_tensor(tensor: Tensor) -> _PackedTensor:
    data = tensor.data
    if data.dtype == object:
        return tensor.name, tensor.datatype.value, tensor.shape, tuple(data.ravel().tolist())
    return tensor.name, tensor.datatype.value, tensor.shape, data.tobytes()


def _unpack_tensor(packed: _PackedTensor) -> Tensor:
    name, datatype, shape, raw = packed
    kind = DataType(datatype)
    if isinstance(raw, tuple):
        data = np.empty(len(raw), dtype=object)
        data[:] = raw
        data = data.reshape(shape)
    else:
        data = np.frombuffer(raw, dtype=kind.numpy_dtype).reshape(shape)
    return Tensor(name, kind, shape, data)


def pack_request(request: InferenceRequest) -> tuple[Any, ...]:
    return (request.model_name, request.model_version, request.id, request.parameters,
            request.priority, request.timeout_us, request.sequence_id, request.sequence_start,
            request.sequence_end, request.model_namespace,
            tuple([(o.name, o.classification) for o in request.requested_outputs]),
            tuple([_pack_tensor(t) for t in request.inputs.values()]))


def unpack_request(packed: tuple[Any, ...]) -> InferenceRequest:
    (model, version, rid, parameters, priority, timeout_us, sequence_id, start, end,
     namespace, outputs, inputs) = packed
    tensors = {}
    for item in inputs:
        tensor = _unpack_tensor(item)
        tensors[tensor.name] = tensor
    return InferenceRequest(
        model, version, tensors, tuple([RequestedOutput(n, c) for n, c in outputs]), rid,
        parameters, priority, timeout_us, False, sequence_id, start, end, namespace)


def pack_response(response: InferenceResponse) -> tuple[Any, ...]:
    return (response.model_name, response.model_version, response.id, response.parameters,
            tuple([_pack_tensor(t) for t in response.outputs]))


def unpack_response(packed: tuple[Any, ...]) -> InferenceResponse:
    model, version, rid, parameters, outputs = packed
    return InferenceResponse(model, version, [_unpack_tensor(t) for t in outputs], rid,
                             parameters)


class Link:
    """One end of a frontend's link. ``send`` never blocks; ``run_writer`` (a task) sends."""

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self.stream = trio.SocketStream(sock)
        self._raw = sock._sock  # type: ignore[attr-defined]  # the stdlib socket, non-blocking
        self._sending = False
        self._buf = bytearray()  # what was read of a message not yet whole
        self._queued: list[bytes] = []
        self._wake = trio.Event()
        self.closed = False

    def send(self, message: tuple[Any, ...]) -> None:
        """Send ``message`` now if nothing is queued before it and the socket takes it whole;
        otherwise queue it (the rest of it) for the writer. After the link closed, dropped
        (the other end can no longer take it)."""
        if self.closed:
            return
        data = pickle.dumps(message, protocol=5)
        if len(data) >= MAX_MESSAGE:
            raise ValueError(f"a message of {len(data)} bytes does not fit the link")
        frame = _LENGTH.pack(len(data)) + data
        if not self._queued and not self._sending:  # nothing before it: out now
            try:
                sent = self._raw.send(frame)
            except BlockingIOError:
                sent = 0
            except OSError:
                self.closed = True
                return
            if sent == len(frame):
                return
            frame = frame[sent:]
        self._queued.append(frame)
        self._wake.set()

    async def run_writer(self) -> None:
        """Send what is queued, gathered per turn, until the link breaks (then returns)."""
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                queued, self._queued = self._queued, []
                self._sending = True
                await self.stream.send_all(b"".join(queued))
                self._sending = False
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.closed = True

    async def receive(self) -> list[tuple[Any, ...]]:
        """The next messages from the other end, in order (every whole one that the next read
        brought); an empty list once it has closed."""
        buf = self._buf
        while True:
            try:
                data = await self.stream.receive_some(_READ)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                self.closed = True
                return []
            buf += data
            out = []
            start, end = 0, len(buf)
            while end - start >= 4:
                (size,) = _LENGTH.unpack_from(buf, start)
                if end - start - 4 < size:
                    break
                out.append(pickle.loads(buf[start + 4:start + 4 + size]))
                start += 4 + size
            del buf[:start]
            if out:
                return out

    async def aclose(self) -> None:
        self.closed = True
        with trio.CancelScope(shield=True):
            await self.stream.aclose()
