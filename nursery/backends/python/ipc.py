"""The wire between the server and a Python model's stub process.

A ``SOCK_SEQPACKET`` Unix socket pair carries small control messages (a pickled tuple: what
the message is, names, shapes, ids, errors), one per packet, so message boundaries need no
framing. Tensor bytes never go through the socket: a message's tensors are written into one
anonymous shared-memory file (``memfd``), whose descriptor travels with the packet
(``SCM_RIGHTS``); the receiver maps it, copies each tensor out and closes it. Each side owns
what it received the moment it returns from :meth:`Channel.receive`, so neither side has to
wait for the other before reusing memory.
"""

from __future__ import annotations

import mmap
import os
import pickle
import socket
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from nursery.errors import ErrorKind, NurseryError
from nursery.messages import Part
from nursery.types import DataType, InferenceRequest, InferenceResponse, RequestedOutput, Tensor

MAX_PACKET = 1 << 20  # one control message; tensors travel apart, so this is ample


class ChannelClosed(Exception):
    """The other side is gone (its process ended, or it closed the socket)."""


@dataclass(frozen=True, slots=True)
class _Slot:
    """Where one tensor's bytes sit in a message's shared-memory file."""

    offset: int
    nbytes: int


def _tensor_bytes(tensor: Tensor) -> bytes | memoryview:
    data = tensor.data
    if tensor.datatype is DataType.BYTES:
        out = bytearray()
        for item in np.asarray(data, dtype=object).reshape(-1):
            raw = item if isinstance(item, bytes) else str(item).encode()
            out += len(raw).to_bytes(4, "little") + raw
        return bytes(out)
    array = np.ascontiguousarray(data)
    return array.data.cast("B")


def _tensor_from(buffer: memoryview, datatype: DataType, shape: tuple[int, ...]) -> Any:
    if datatype is DataType.BYTES:
        items: list[bytes] = []
        at = 0
        while at < len(buffer):
            size = int.from_bytes(buffer[at:at + 4], "little")
            items.append(bytes(buffer[at + 4:at + 4 + size]))
            at += 4 + size
        return np.array(items, dtype=object).reshape(shape)
    return np.frombuffer(bytes(buffer), dtype=datatype.numpy_dtype).reshape(shape)


class _Writer:
    """Collects the tensors of one message, then writes them into one memfd."""

    def __init__(self) -> None:
        self.parts: list[bytes | memoryview] = []
        self.size = 0

    def add(self, tensor: Tensor) -> tuple[str, str, tuple[int, ...], _Slot]:
        data = _tensor_bytes(tensor)
        slot = _Slot(self.size, len(data))
        self.parts.append(data)
        self.size += len(data)
        return tensor.name, tensor.datatype.value, tuple(tensor.shape), slot

    def file(self) -> int | None:
        if not self.size:
            return None
        fd = os.memfd_create("nursery-tensors", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, self.size)
            with mmap.mmap(fd, self.size) as view:
                at = 0
                for part in self.parts:
                    view[at:at + len(part)] = part
                    at += len(part)
        except BaseException:
            os.close(fd)
            raise
        return fd


class _Reader:
    def __init__(self, fd: int | None) -> None:
        self.view: mmap.mmap | None = None
        if fd is not None:
            try:
                size = os.fstat(fd).st_size
                self.view = mmap.mmap(fd, size, prot=mmap.PROT_READ) if size else None
            finally:
                os.close(fd)

    def tensor(self, described: tuple[str, str, tuple[int, ...], _Slot]) -> Tensor:
        name, datatype, shape, slot = described
        kind = DataType(datatype)
        if self.view is None:
            buffer = memoryview(b"")
        else:
            buffer = memoryview(self.view)[slot.offset:slot.offset + slot.nbytes]
        try:
            data = _tensor_from(buffer, kind, shape)
        finally:
            buffer.release()
        return Tensor(name, kind, shape, data)

    def close(self) -> None:
        if self.view is not None:
            self.view.close()


# -- the values that cross: requests, responses, errors, parts -----------------------------


def _put_request(w: _Writer, request: InferenceRequest) -> tuple[Any, ...]:
    return (request.model_name, request.model_version,
            [w.add(t) for t in request.inputs.values()],
            [o.name for o in request.requested_outputs], request.id, dict(request.parameters),
            request.sequence_id, request.sequence_start, request.sequence_end,
            request.priority, request.timeout_us)


def _get_request(r: _Reader, value: tuple[Any, ...]) -> InferenceRequest:
    (model, version, inputs, outputs, rid, params, seq, start, end, priority, timeout) = value
    tensors = {t.name: t for t in (r.tensor(d) for d in inputs)}
    return InferenceRequest(model, version, tensors,
                            requested_outputs=tuple(RequestedOutput(n) for n in outputs),
                            id=rid, parameters=params, sequence_id=seq, sequence_start=start,
                            sequence_end=end, priority=priority, timeout_us=timeout)


def _put(w: _Writer, value: Any) -> Any:
    """A value made of requests, responses, errors, parts, tuples, lists and plain data."""
    if isinstance(value, InferenceRequest):
        return ("request", _put_request(w, value))
    if isinstance(value, InferenceResponse):
        return ("response", (value.model_name, value.model_version,
                             [w.add(t) for t in value.outputs], value.id,
                             dict(value.parameters)))
    if isinstance(value, NurseryError):
        return ("error", (value.kind.value, value.message))
    if isinstance(value, Part):
        return ("part", (_put(w, value.response), _put(w, value.error), value.final))
    if isinstance(value, tuple | list):
        return ("seq", [_put(w, v) for v in value])
    return ("plain", value)


def _get(r: _Reader, value: Any) -> Any:
    kind, body = value
    if kind == "request":
        return _get_request(r, body)
    if kind == "response":
        model, version, outputs, rid, params = body
        return InferenceResponse(model, version, [r.tensor(d) for d in outputs], id=rid,
                                 parameters=params)
    if kind == "error":
        return NurseryError(body[1], ErrorKind(body[0]))
    if kind == "part":
        return Part(_get(r, body[0]), _get(r, body[1]), body[2])
    if kind == "seq":
        return [_get(r, v) for v in body]
    return body


class Channel:
    """One end of the socket pair. ``send`` is safe from any thread; one thread receives."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()

    @classmethod
    def pair(cls) -> tuple[Channel, socket.socket]:
        """This side's channel and the other side's socket (to hand to the child)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        return cls(ours), theirs

    def send(self, *message: Any) -> None:
        """Send a tuple whose items may hold requests, responses, errors and parts."""
        writer = _Writer()
        payload = pickle.dumps(_put(writer, message), protocol=5)
        fd = writer.file()
        try:
            with self._send_lock:
                socket.send_fds(self.sock, [payload], [fd] if fd is not None else [])
        except OSError as exc:
            raise ChannelClosed(str(exc)) from None
        finally:
            if fd is not None:
                os.close(fd)

    def receive(self) -> tuple[Any, ...]:
        try:
            payload, fds, _flags, _addr = socket.recv_fds(self.sock, MAX_PACKET, 1)
        except OSError as exc:
            raise ChannelClosed(str(exc)) from None
        if not payload:
            for fd in fds:
                os.close(fd)
            raise ChannelClosed("the other side closed the channel")
        reader = _Reader(fds[0] if fds else None)
        try:
            message = _get(reader, pickle.loads(payload))
        finally:
            reader.close()
        return tuple(message)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
