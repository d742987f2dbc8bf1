"""The stub process wire (nursery/backends/python/ipc.py): every value a model's requests and
answers are made of crosses whole, tensors through shared memory and never the socket."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from nursery.backends.python.ipc import Channel, ChannelClosed
from nursery.errors import ErrorKind, NurseryError
from nursery.messages import Part
from nursery.observability.tracing import ChildOf, TraceLink, TraceManager, TraceSettings
from nursery.types import DataType, InferenceRequest, InferenceResponse, RequestedOutput, Tensor

NUMERIC = [DataType.FP32, DataType.FP16, DataType.INT64, DataType.UINT8, DataType.BOOL]


def _pair() -> tuple[Channel, Channel]:
    ours, theirs = Channel.pair()
    return ours, Channel(theirs)


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(NUMERIC), data=st.data())
def test_tensors_cross_whole(kind: DataType, data: st.DataObject) -> None:
    array = data.draw(hnp.arrays(kind.numpy_dtype, hnp.array_shapes(min_dims=0, max_dims=3,
                                                                    max_side=5)))
    words = data.draw(st.lists(st.binary(max_size=20), max_size=6))
    text = np.array(words, dtype=object)
    request = InferenceRequest("m", "1", {"A": Tensor("A", kind, array.shape, array),
                                          "S": Tensor("S", DataType.BYTES, text.shape, text)},
                               requested_outputs=(RequestedOutput("Y"),), id="r1",
                               parameters={"k": 1}, sequence_id=7, sequence_start=True)
    a, b = _pair()
    with a.sock, b.sock:
        a.send("execute", 3, [request])
        kind_, batch, (got,) = b.receive()
    assert (kind_, batch) == ("execute", 3)
    np.testing.assert_array_equal(got.inputs["A"].data, array)
    assert got.inputs["A"].data.dtype == array.dtype and got.inputs["A"].shape == array.shape
    assert list(got.inputs["S"].data) == words
    assert (got.id, got.parameters, got.sequence_id, got.sequence_start) == ("r1", {"k": 1}, 7,
                                                                             True)
    assert [o.name for o in got.requested_outputs] == ["Y"]


def test_answers_cross_whole() -> None:
    out = np.arange(6, dtype=np.float32).reshape(2, 3)
    response = InferenceResponse("m", "1", [Tensor("Y", DataType.FP32, out.shape, out)], id="x",
                                 parameters={"p": "v"})
    error = NurseryError("broken", ErrorKind.INVALID_ARG)
    a, b = _pair()
    with a.sock, b.sock:
        b.send("result", 1, [response, error, None, Part(response, None, False),
                             Part(None, error, True)])
        _, _, answers = a.receive()
    np.testing.assert_array_equal(answers[0].outputs[0].data, out)
    assert answers[0].parameters == {"p": "v"} and answers[0].id == "x"
    assert (answers[1].kind, answers[1].message) == (ErrorKind.INVALID_ARG, "broken")
    assert answers[2] is None
    assert not answers[3].final and answers[3].response.outputs[0].name == "Y"
    assert answers[4].final and answers[4].error.message == "broken"


def test_tensor_bytes_never_cross_the_socket() -> None:
    big = np.zeros(4 << 20, dtype=np.uint8)  # 4 MiB: far more than one packet could hold
    request = InferenceRequest("m", "1", {"A": Tensor("A", DataType.UINT8, big.shape, big)})
    a, b = _pair()
    with a.sock, b.sock:
        a.send("execute", 1, [request])
        (_, _, (got,)) = b.receive()
    assert got.inputs["A"].data.nbytes == big.nbytes


def test_a_closed_side_is_reported() -> None:
    a, b = _pair()
    b.close()
    with pytest.raises(ChannelClosed):
        a.receive()
    with pytest.raises(ChannelClosed):
        a.send("execute", 1, [])
    a.sock.close()


def test_a_huge_message_leaves_no_huge_ring_behind() -> None:
    """A message beyond the one-off size gets a ring of its own; the next message replaces it
    with an ordinary ring on both sides (the sender's and the receiver's mappings), so a
    single 1 GiB BLS tensor does not keep a 2 GiB ring alive for the stub's life."""
    from nursery.backends.python import ipc

    huge = np.ones(ipc._ONE_OFF + 4096, dtype=np.uint8)
    small = np.arange(16, dtype=np.float32)
    a, b = _pair()
    with a.sock, b.sock:
        a.send("execute", 1, [InferenceRequest(
            "m", "1", {"A": Tensor("A", DataType.UINT8, huge.shape, huge)})])
        (_, _, (got,)) = b.receive()
        assert got.inputs["A"].data.nbytes == huge.nbytes and int(got.inputs["A"].data[-1]) == 1
        assert a._ring is not None and a._ring.one_off and a._ring.size == huge.nbytes
        a.send("execute", 2, [InferenceRequest(
            "m", "1", {"A": Tensor("A", DataType.FP32, small.shape, small)})])
        (_, _, (got,)) = b.receive()
        np.testing.assert_array_equal(got.inputs["A"].data, small)
        assert not a._ring.one_off and a._ring.size <= ipc._RING_CAP
        assert [size for _, size in b._rings.maps.values()] == [a._ring.size]


def test_ordinary_rings_stop_growing_at_the_cap() -> None:
    from nursery.backends.python import ipc

    a, b = _pair()
    with a.sock, b.sock:
        for n in range(4):  # nothing read: each message finds the ring full and grows it
            block = np.zeros(ipc._ONE_OFF, dtype=np.uint8)
            a.send("execute", n, [InferenceRequest(
                "m", "1", {"A": Tensor("A", DataType.UINT8, block.shape, block)})])
            assert a._ring is not None and a._ring.size <= ipc._RING_CAP
        for _ in range(4):
            b.receive()


def test_traces_cross_as_links() -> None:
    """A served request's trace reaches the stub as its id and OpenTelemetry context; a BLS
    request's names the trace it is a child of; an untraced one arrives untraced."""
    manager = TraceManager(replace(TraceSettings(), trace_level=("TIMESTAMPS",), trace_rate=1))
    live = manager.start("m")
    assert live is not None
    served = InferenceRequest("m", "1", {}, trace=live)
    bls = InferenceRequest("n", "", {}, trace=ChildOf(TraceLink(live.id, None)))
    plain = InferenceRequest("n", "", {})
    a, b = _pair()
    with a.sock, b.sock:
        a.send("execute", 1, [served, bls, plain])
        _, _, (got_served, got_bls, got_plain) = b.receive()
    assert got_served.trace == TraceLink(live.id, None)
    assert got_bls.trace == ChildOf(TraceLink(live.id))
    assert got_plain.trace is False
