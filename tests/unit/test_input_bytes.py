"""A request's BYTES input read as Triton's request checks read it (ValidateBytesInputs): the
element count against the shape, in Triton's words, and nothing allocated on a count the data
cannot hold."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from nursery.errors import InvalidArgument
from nursery.types import input_bytes_tensor

PREFIX = "[request id: r1] "
WHERE = "for inference input 'IN' for model 'm'"


def _wire(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


def _read(data: bytes, shape: tuple[int, ...]) -> np.ndarray:
    return input_bytes_tensor(data, shape, "IN", "m", PREFIX)


def test_exact_count_reads_the_elements() -> None:
    out = _read(_wire(b"a", b"", b"ccc", b"dd"), (2, 2))
    assert out.shape == (2, 2) and out.tolist() == [[b"a", b""], [b"ccc", b"dd"]]
    assert _read(b"", (1, 0)).shape == (1, 0)


def test_too_few_elements() -> None:
    with pytest.raises(InvalidArgument) as err:
        _read(_wire(*[b"x"] * 14), (1, 16))
    assert err.value.message == f"{PREFIX}expected 16 string elements {WHERE}, got 14"
    # a count the data cannot hold (4 bytes per element at least): no array is made for it
    with pytest.raises(InvalidArgument) as err:
        _read(_wire(b""), (1, 2**25))
    assert err.value.message == f"{PREFIX}expected 33554432 string elements {WHERE}, got 1"


def test_more_elements_than_the_shape_holds() -> None:
    with pytest.raises(InvalidArgument) as err:
        _read(_wire(*[b"7"] * 18), (1, 16))
    assert err.value.message == (f"{PREFIX}unexpected number of string elements 17 {WHERE}, "
                                 "expecting 16")


def test_a_cut_length_indicator() -> None:
    with pytest.raises(InvalidArgument) as err:
        _read(_wire(b"ab") + b"\x01\x00", (2,))
    assert err.value.message == (
        f"{PREFIX}incomplete string length indicator {WHERE}, expecting 4 bytes but only 2 "
        "bytes available. Please make sure the string length indicator is in one buffer.")


def test_an_element_longer_than_the_data() -> None:
    with pytest.raises(InvalidArgument, match="element 1 of inference input 'IN' for model 'm' "
                                              "declares 9 bytes but only 2 remain"):
        _read(_wire(b"ab") + struct.pack("<I", 9) + b"xy", (2,))


@pytest.mark.parametrize(("given", "message"), [
    (3, "expected 4 string elements for inference input 'IN' for model 'm', got 3"),
    (6, "unexpected number of string elements 5 for inference input 'IN' for model 'm', "
        "expecting 4"),
])
def test_grpc_typed_bytes_contents_are_counted_so_too(given: int, message: str) -> None:
    """`bytes_contents` are serialized and checked as the raw form is (Triton's gRPC
    frontend serializes them before its request checks)."""
    from nursery.protocol.codecs import grpc_messages as grpc_codec
    from nursery.schema import inference as pb

    request = pb.ModelInferRequest(model_name="m", id="r1", inputs=[
        pb.ModelInferRequestInferInputTensor(
            name="IN", datatype="BYTES", shape=[1, 4],
            contents=pb.InferTensorContents(bytes_contents=[b"x"] * given))])
    with pytest.raises(InvalidArgument) as err:
        grpc_codec.decode_request(request)
    assert err.value.message == f"[request id: r1] {message}"
