"""The gRPC server's header memo (``h2.HeaderDecoder``) answers exactly what decoding every
block would: for any sequence of header lists a real HPACK encoder sends on one connection
(repeats, changes, table size updates), the memo's answers equal a plain decoder's."""

from __future__ import annotations

import hpack
from hypothesis import given, settings
from hypothesis import strategies as st

from nursery.protocol.grpc.h2 import HeaderDecoder, indexed_only

_names = st.sampled_from([":path", ":method", "content-type", "te", "grpc-timeout",
                          "user-agent", "x-request", "authorization"])
_values = st.sampled_from(["/inference.GRPCInferenceService/ModelInfer", "POST",
                           "application/grpc", "trailers", "1S", "grpc-c++/1.6", "a", "b" * 40])
_header_lists = st.lists(st.tuples(_names, _values), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), _header_lists), min_size=1, max_size=30),
       st.sampled_from([0, 64, 4096]))
def test_the_memo_answers_what_decoding_would(script: list[tuple[int, list[tuple[str, str]]]],
                                              table: int) -> None:
    encoder = hpack.Encoder()
    if table != 4096:
        encoder.header_table_size = table  # a table size update rides in the next block
    plain = hpack.Decoder()
    memo = HeaderDecoder(1 << 20)
    previous: list[tuple[str, str]] | None = None
    for repeat, headers in script:
        # repeats of the last list: what a client sending the same request again sends
        for current in [headers] + ([previous] * repeat if previous else []):
            block = encoder.encode(current)
            want = [(str(n), str(v)) for n, v in plain.decode(block)]
            assert memo.decode(block) == want
        previous = headers


def test_indexed_only_reads_rfc_7541_representations() -> None:
    assert indexed_only(bytes([0x82, 0x86, 0x84]))  # three static-table indexes
    assert indexed_only(bytes([0xFF, 0x80, 0x01]))  # an index in continuation bytes
    assert not indexed_only(bytes([0x82, 0x40, 0x01, 0x61, 0x01, 0x62]))  # a literal
    assert not indexed_only(bytes([0x3F, 0xE1, 0x1F]))  # a table size update
    assert indexed_only(b"")
