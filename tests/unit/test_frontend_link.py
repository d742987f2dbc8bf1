"""The frontend link's codec and framing (``nursery/protocol/frontends/link.py``): requests and
responses travel as plain tuples and come back equal, every datatype included; messages
written on one end arrive whole and in order on the other, however the bytes are split."""

from __future__ import annotations

import pickle
import socket

import numpy as np
import pytest
import trio

from nursery.protocol.frontends.link import (
    ANSWER,
    FAILED,
    INFER,
    Link,
    pack_request,
    pack_response,
    unpack_request,
    unpack_response,
)
from nursery.settings import settings_from_args
from nursery.types import DataType, InferenceRequest, InferenceResponse, RequestedOutput, Tensor


def _tensor(name: str, kind: DataType, shape: tuple[int, ...]) -> Tensor:
    if kind is DataType.BYTES:
        data = np.array([b"a", b"", b"\xff\x00"] * (int(np.prod(shape)) // 3), dtype=object)
        return Tensor(name, kind, shape, data.reshape(shape))
    raw = np.arange(int(np.prod(shape)) * kind.numpy_dtype.itemsize, dtype=np.uint8)
    return Tensor(name, kind, shape, np.frombuffer(raw.tobytes(), kind.numpy_dtype).reshape(shape))


@pytest.mark.parametrize("kind", list(DataType))
def test_a_request_comes_back_equal(kind: DataType) -> None:
    shape = (2, 3)
    request = InferenceRequest(
        "m", "3", {"X": _tensor("X", kind, shape)}, (RequestedOutput("Y", 2),), "id-1",
        {"p": 1, "q": "s", "r": [1.5, True]}, 4, 1000, trace=False, sequence_id="corr",
        sequence_start=True, sequence_end=False, model_namespace="ns")
    back = unpack_request(pickle.loads(pickle.dumps(pack_request(request), protocol=5)))
    x, y = request.inputs["X"], back.inputs["X"]
    assert (y.name, y.datatype, y.shape) == (x.name, x.datatype, x.shape)
    assert y.data.dtype == x.data.dtype and y.data.shape == x.data.shape
    assert y.data.tolist() == x.data.tolist()
    for field in ("model_name", "model_version", "requested_outputs", "id", "parameters",
                  "priority", "timeout_us", "sequence_id", "sequence_start", "sequence_end",
                  "model_namespace"):
        assert getattr(back, field) == getattr(request, field), field
    assert back.trace is False


def test_a_response_comes_back_equal_from_a_strided_view() -> None:
    batch = np.arange(64, dtype=np.float32).reshape(8, 8)
    view = batch[:, 2:3]  # a row of a batch's output: not contiguous
    response = InferenceResponse("m", "1", [Tensor("Y", DataType.FP32, view.shape, view),
                                            _tensor("S", DataType.BYTES, (3,))], "i", {"k": "v"})
    back = unpack_response(pickle.loads(pickle.dumps(pack_response(response), protocol=5)))
    assert back.outputs[0].data.tolist() == view.tolist()
    assert back.outputs[1].data.tolist() == [b"a", b"", b"\xff\x00"]
    assert (back.model_name, back.model_version, back.id, back.parameters) == ("m", "1", "i", {"k": "v"})


def test_settings_travel_to_a_frontend() -> None:
    settings = settings_from_args(["--model-repository", "/tmp", "--http-frontend-processes", "3",
                                   "--http-restricted-api", "model-repository:k=v",
                                   "--http-header-forward-pattern", "x-.*"])
    assert settings.http_frontend_processes == 3
    assert pickle.loads(pickle.dumps(settings)) == settings


async def test_messages_arrive_whole_and_in_order() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a = Link(trio.socket.from_stdlib_socket(left))
    b = Link(trio.socket.from_stdlib_socket(right))
    big = b"x" * (3 << 20)  # past one read and one socket buffer: queued, then the writer's
    got = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(a.run_writer)
        for i in range(200):
            a.send((INFER, i, big if i == 7 else b"small"))
        a.send((ANSWER, -1))

        async def read() -> None:
            while messages := await b.receive():
                got.extend(messages)
                if got[-1][1] == -1:
                    return

        with trio.fail_after(10):
            await read()
        nursery.cancel_scope.cancel()
    assert [m[1] for m in got] == [*range(200), -1]
    assert got[7][2] == big
    await a.aclose()
    await b.aclose()


async def test_a_message_the_frontend_cannot_take_costs_only_its_request() -> None:
    """A malformed answer from the engine: that request is answered 500 and counted; the
    frontend goes on with the next message."""
    from nursery.protocol.access import OPEN
    from nursery.protocol.frontends.process import FrontendServer, _Waiting
    from nursery.protocol.frontends.upstream import Upstream

    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    link = Link(trio.socket.from_stdlib_socket(left))
    server = FrontendServer(link, Upstream("127.0.0.1", 9), OPEN, max_input_size=1 << 20)
    answers: list[tuple[int, object, bytes]] = []
    for rid in (1, 2):
        server._waiting[rid] = _Waiting(None, b"", None, None, None, answers.append)  # type: ignore[arg-type]
    server.delivered((ANSWER, 1, ("not", "a", "response")))
    assert [a[0] for a in answers] == [500] and server.internal_errors == 1
    server.delivered((FAILED, 2, (404, [], b'{"error":"gone"}')))
    assert [a[0] for a in answers] == [500, 404]
    await link.aclose()
    right.close()
