"""The wire between the server and a Python model's stub process.

A ``SOCK_SEQPACKET`` Unix socket pair carries small control messages (a pickled tuple: what
the message is, names, shapes, ids, errors), one per packet, so message boundaries need no
framing. Tensor bytes never go through the socket: a message's tensors are written into the
sender's shared-memory ring (one
anonymous file, ``memfd``, mapped by both sides and reused message after message; its
descriptor travels once, with the first message that uses it, as ``SCM_RIGHTS``). The
receiver copies each tensor out and moves the ring's read position, so each side owns what it
received the moment :meth:`Channel.receive` returns.
"""

from __future__ import annotations

import array
import mmap
import os
import pickle
import socket
import threading
from typing import Any

import numpy as np

from nursery.errors import AnsweredError, ErrorKind, NurseryError
from nursery.messages import Part
from nursery.observability.tracing import ChildOf, TraceLink, link
from nursery.types import (
    DataType,
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    Tensor,
    tensor_from_bytes,
    tensor_to_bytes,
)

MAX_PACKET = 1 << 20  # one control message; tensors travel apart, so this is ample


class ChannelClosed(Exception):
    """The other side is gone (its process ended, or it closed the socket)."""


_Slot = tuple[int, int]  # where one tensor's bytes sit in its message: (offset, size)


class _Writer:
    """Collects the tensors of one message (their bytes are written when it is sent)."""

    def __init__(self) -> None:
        self.parts: list[bytes | memoryview] = []
        self.size = 0

    def add(self, tensor: Tensor) -> tuple[str, str, tuple[int, ...], _Slot]:
        array = (np.asarray(tensor.data, dtype=object) if tensor.datatype is DataType.BYTES
                 else tensor.data)
        data = tensor_to_bytes(array, tensor.datatype)  # the wire form: BYTES length-prefixed
        slot = (self.size, len(data))
        self.parts.append(data)
        self.size += len(data)
        return tensor.name, tensor.datatype.value, tuple(tensor.shape), slot


_HEADER = 64  # the ring's first bytes: [0:8] how far the receiver has read (little endian)
_FIRST_RING = 1 << 20
_ONE_OFF = 64 << 20  # a message with more tensor bytes gets a ring of its own (see _placed)
_RING_CAP = 2 * _ONE_OFF  # an ordinary ring grows no larger


class _Ring:
    """The sender's shared-memory ring: one memfd, mapped by both sides, reused message after
    message. The sender writes each message's tensors at its head; the receiver, once it has
    copied them out, moves the read position in the ring's header. A message that does not fit
    makes a ring twice as large, up to ``_RING_CAP`` (its descriptor goes with that message);
    a huge one gets a ring of its own (``Channel._placed``); an old ring is left to the
    receiver, which drops it when the first message of the next one arrives."""

    def __init__(self, size: int, generation: int, one_off: bool = False) -> None:
        self.size = size
        self.generation = generation
        self.one_off = one_off  # one huge message's: replaced by the next message
        self.fd = os.memfd_create("nursery-ring", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, size + _HEADER)
        self.map = mmap.mmap(self.fd, size + _HEADER)
        self.head = 0  # bytes ever written (positions only grow; offset = position % size)
        self.sent_fd = False

    def read_position(self) -> int:
        return int.from_bytes(self.map[0:8], "little")

    def place(self, size: int) -> int | None:
        """Where a message of ``size`` bytes starts (a position), or None if it does not fit
        now. A message never wraps: it starts again at the ring's beginning if it must."""
        start = self.head
        if start % self.size + size > self.size:
            start += self.size - start % self.size  # skip to the beginning
        if start + size - self.read_position() > self.size:
            return None
        self.head = start + size
        return start

    def write(self, start: int, parts: list[bytes | memoryview]) -> None:
        at = _HEADER + start % self.size
        for part in parts:
            self.map[at:at + len(part)] = part
            at += len(part)

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


class _Rings:
    """The receiver's view of the other side's rings, by generation."""

    def __init__(self) -> None:
        self.maps: dict[int, tuple[mmap.mmap, int]] = {}

    def adopt(self, generation: int, fd: int) -> None:
        try:
            size = os.fstat(fd).st_size
            self.maps[generation] = (mmap.mmap(fd, size), size - _HEADER)
        finally:
            os.close(fd)
        for old in [g for g in self.maps if g < generation]:  # every message in it was read
            self.maps.pop(old)[0].close()

    def close(self) -> None:
        for view, _ in self.maps.values():
            view.close()
        self.maps.clear()


class _Reader:
    def __init__(self, rings: _Rings, where: tuple[int, int, int] | None) -> None:
        self.rings = rings
        self.where = where  # (generation, start position, size) of the message's tensors
        self.view: memoryview | None = None
        if where is not None:
            generation, start, size = where
            view, ring = rings.maps[generation]
            at = _HEADER + start % ring
            self.view = memoryview(view)[at:at + size]

    def tensor(self, described: tuple[str, str, tuple[int, ...], _Slot]) -> Tensor:
        name, datatype, shape, slot = described
        kind = DataType(datatype)
        if self.view is None:
            buffer = memoryview(b"")
        else:
            offset, nbytes = slot
            buffer = self.view[offset:offset + nbytes]
        try:  # checked against shape and datatype: a stub's message is not trusted
            data = tensor_from_bytes(buffer, kind, shape, f"tensor '{name}'")
            if kind is not DataType.BYTES:
                data = data.copy()  # out of the ring, which is reused
        finally:
            buffer.release()
        return Tensor(name, kind, shape, data)

    def close(self) -> None:
        if self.view is not None:
            self.view.release()
        if self.where is not None:  # read: the sender may reuse that part of its ring
            generation, start, size = self.where
            view, _ = self.rings.maps[generation]
            view[0:8] = (start + size).to_bytes(8, "little")


# -- the values that cross: requests, responses, errors, parts -----------------------------


def _put_trace(trace: Any) -> Any:
    """A request's trace as it crosses: a served request's as its link (id, OpenTelemetry
    context), a BLS request's as the id of the trace it is a child of; None: not traced."""
    if isinstance(trace, ChildOf):
        parent = link(trace.parent)
        return ("child", parent.id) if parent is not None else None
    found = link(trace)
    return ("link", found.id, found.context) if found is not None else None


def _get_trace(value: Any) -> Any:
    if value is None:
        return False  # not traced (a BLS request without a trace is never sampled)
    if value[0] == "child":
        return ChildOf(TraceLink(value[1]))
    return TraceLink(value[1], value[2])


def _put_request(w: _Writer, request: InferenceRequest) -> tuple[Any, ...]:
    return (request.model_name, request.model_version,
            [w.add(t) for t in request.inputs.values()],
            [(o.name, o.classification) for o in request.requested_outputs], request.id,
            dict(request.parameters),
            request.sequence_id, request.sequence_start, request.sequence_end,
            request.priority, request.timeout_us, _put_trace(request.trace))


def _get_request(r: _Reader, value: tuple[Any, ...]) -> InferenceRequest:
    (model, version, inputs, outputs, rid, params, seq, start, end, priority, timeout,
     trace) = value
    tensors = {t.name: t for t in [r.tensor(d) for d in inputs]}
    return InferenceRequest(model, version, tensors,
                            requested_outputs=tuple([RequestedOutput(n, k) for n, k in outputs]),
                            id=rid, parameters=params, sequence_id=seq, sequence_start=start,
                            sequence_end=end, priority=priority, timeout_us=timeout,
                            trace=_get_trace(trace))


def _put(w: _Writer, value: Any) -> Any:
    """A value made of requests, responses, errors, parts, tuples, lists and plain data."""
    if isinstance(value, InferenceRequest):
        return ("request", _put_request(w, value))
    if isinstance(value, InferenceResponse):
        return ("response", (value.model_name, value.model_version,
                             [w.add(t) for t in value.outputs], value.id,
                             dict(value.parameters)))
    if isinstance(value, NurseryError):
        return ("error", (value.kind.value, value.message, isinstance(value, AnsweredError)))
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
        return (AnsweredError if body[2] else NurseryError)(body[1], ErrorKind(body[0]))
    if kind == "part":
        return Part(_get(r, body[0]), _get(r, body[1]), body[2])
    if kind == "seq":
        return [_get(r, v) for v in body]
    return body


_FD_SPACE = socket.CMSG_LEN(array.array("i").itemsize)  # room for one descriptor


def _recv_fds(sock: socket.socket, flags: int) -> tuple[bytes, list[int]]:
    """One packet and the descriptor it may carry (``socket.recv_fds`` before Python 3.12
    ignores its ``flags``, so ``MSG_DONTWAIT`` needs this)."""
    payload, ancillary, _flags, _addr = sock.recvmsg(MAX_PACKET, _FD_SPACE, flags)
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return payload, list(fds)


class Channel:
    """One end of the socket pair. ``send`` is safe from any thread; one thread receives."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()
        self._ring: _Ring | None = None
        self._rings = _Rings()

    @classmethod
    def pair(cls) -> tuple[Channel, socket.socket]:
        """This side's channel and the other side's socket (to hand to the child)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        return cls(ours), theirs

    def _placed(self, size: int) -> tuple[_Ring, int]:
        """Where a message's ``size`` tensor bytes go. The ring grows (doubling, up to
        ``_RING_CAP``) while messages do not fit; a message of more than ``_ONE_OFF`` bytes gets
        a ring of its own, exactly its size, which the next message replaces with an ordinary
        one, so a single huge tensor (a BLS call with 1 GiB) does not leave a ring twice its
        size mapped for the channel's life."""
        ring = self._ring
        if ring is not None and not ring.one_off and size <= _ONE_OFF:
            start = ring.place(size)
            if start is not None:
                return ring, start
        generation = ring.generation + 1 if ring else 1
        if size > _ONE_OFF:
            grown = _Ring(size, generation, one_off=True)
        else:
            before = ring.size if ring is not None and not ring.one_off else 0
            grown = _Ring(min(max(_FIRST_RING, 2 * before, 2 * size), _RING_CAP), generation)
        if ring is not None:
            ring.close()  # the receiver keeps its own mapping until it has read it all
        self._ring = grown
        start = grown.place(size)
        assert start is not None
        return grown, start

    def send(self, *message: Any, wait: bool = True) -> None:
        """Send a tuple whose items may hold requests, responses, errors and parts. With
        ``wait=False`` a full socket (or a send under way on another thread) raises
        :class:`BlockingIOError` at once and nothing is sent: for the trio thread, which
        must never block."""
        writer = _Writer()
        body = _put(writer, message)
        if not self._send_lock.acquire(blocking=wait):
            raise BlockingIOError("a send is under way")
        try:
            try:
                fds: list[int] = []
                where = None
                if writer.size:
                    ring, start = self._placed(writer.size)
                    ring.write(start, writer.parts)
                    where = (ring.generation, start, writer.size)
                    if not ring.sent_fd:
                        fds = [ring.fd]
                        ring.sent_fd = True
                payload = pickle.dumps((where, body), protocol=5)
                socket.send_fds(self.sock, [payload], fds,
                                0 if wait else socket.MSG_DONTWAIT)
            except BlockingIOError:
                if where is not None:  # the ring space is given back: nothing was sent
                    self._ring.head = where[1]  # type: ignore[union-attr]
                    if fds:
                        self._ring.sent_fd = False  # type: ignore[union-attr]
                raise
            except OSError as exc:
                raise ChannelClosed(str(exc)) from None
        finally:
            self._send_lock.release()

    def hand_over(self, other: socket.socket) -> None:
        """Send ``other`` (one end of a new socket pair) to the other side, which receives
        ``("attach", <fd>)``: a forked child's channel of its own. It takes no lock (the fork
        may have copied one held) and no ring: one packet, atomic beside the parent's."""
        payload = pickle.dumps((None, ("seq", [("plain", "attach")])), protocol=5)
        try:
            socket.send_fds(self.sock, [payload], [other.fileno()])
        except OSError as exc:
            raise ChannelClosed(str(exc)) from None

    def receive(self) -> tuple[Any, ...]:
        """The next message, waiting for it; a descriptor handed over with it
        (:meth:`hand_over`) comes last, as an int the caller owns."""
        return self.decode(*self.receive_packet())

    def receive_packet(self, wait: bool = True) -> tuple[Any, list[int]]:
        """The next message as it came (:meth:`decode` reads it). With ``wait=False`` an empty
        socket raises :class:`BlockingIOError` at once: for a reader on the trio thread."""
        try:
            payload, fds = _recv_fds(self.sock, 0 if wait else socket.MSG_DONTWAIT)
        except BlockingIOError:
            raise
        except OSError as exc:
            raise ChannelClosed(str(exc)) from None
        if not payload:
            for fd in fds:
                os.close(fd)
            raise ChannelClosed("the other side closed the channel")
        return pickle.loads(payload), fds

    @staticmethod
    def tensor_bytes(packet: Any) -> int:
        """How many tensor bytes a message holds in the ring (what :meth:`decode` copies)."""
        where = packet[0]
        return 0 if where is None else where[2]

    def decode(self, packet: Any, fds: list[int]) -> tuple[Any, ...]:
        """A received message, its tensors copied out of the ring (the ring's space given
        back). Messages must be decoded in the order they came. A descriptor handed over
        with it (:meth:`hand_over`) comes last, as an int the caller owns."""
        where, body = packet
        if fds and where is None:  # a socket handed over, not a ring
            return (*_get(_Reader(self._rings, None), body), fds[0])
        if fds:
            self._rings.adopt(where[0], fds[0])
        reader = _Reader(self._rings, where)
        try:
            message = _get(reader, body)
        finally:
            reader.close()
        return tuple(message)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        with self._send_lock:
            if self._ring is not None:
                self._ring.close()
                self._ring = None
        self._rings.close()
