"""Fuzzing every decoder a client's tensor bytes (or a model's configuration) go through.

Each entry of :data:`TARGETS` feeds raw bytes to one decoder; it must return normally or raise
only the decoder's documented error types (``NurseryError`` and its subclasses, plus the
parser's own type where it has one: ``grpclib.GRPCError`` from the strict protobuf codec).
Anything else -- a ``ValueError`` from ``int()``, ``MemoryError``, ``OverflowError``,
``IndexError``, a hang -- is a bug: the unit of failure is one request, never the process.
:data:`SEEDS` holds valid inputs per target, which the hypothesis tests below (seconds each)
and the long campaign (``python -m bench.fuzz``) mutate.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpclib
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nursery.backends.base import get_factory
from nursery.config import model as model_config
from nursery.errors import NurseryError
from nursery.protocol.codecs import binary_tensor, grpc_wire
from nursery.protocol.codecs import grpc_messages as grpc_codec
from nursery.protocol.codecs import json_tensors as json_codec
from nursery.protocol.http import infer as http_infer
from nursery.protocol.http import routes as http_app
from nursery.schema import inference as pb
from nursery.shm.system import SharedMemoryRegistry

MAX_BYTES = 1 << 20  # the targets' --http-max-input-size
REGION = "r"
REGION_SIZE = 4096

# -- one real shared-memory region the decoders may read and write -----------------------
# Temporary things are named ``nursery_fuzz_<pid>_...`` (in /dev/shm and the temp folder):
# a campaign child that is killed, or that libFuzzer ends, never runs atexit handlers, and
# bench/fuzz.py removes what such a child left by that name.

_SHM_KEY = f"nursery_fuzz_{os.getpid()}_{os.urandom(4).hex()}"
with open(f"/dev/shm/{_SHM_KEY}", "wb") as _f:
    _f.write(bytes(range(256)) * (REGION_SIZE // 256))
    _f.seek(1024)
    _f.write(b"\2\0\0\0ab\2\0\0\0cd")  # two BYTES elements at offset 1024
SHM = SharedMemoryRegistry()
SHM.register_system(REGION, "/" + _SHM_KEY, 0, REGION_SIZE)


@atexit.register
def _remove_temporaries() -> None:
    SHM.close()
    try:
        os.unlink(f"/dev/shm/{_SHM_KEY}")
    except FileNotFoundError:
        pass
    shutil.rmtree(_MODEL_DIR.parent, ignore_errors=True)


# a model folder with one version, for config validation (no model file: no auto-complete)
_MODEL_DIR = Path(tempfile.mkdtemp(prefix=f"nursery_fuzz_{os.getpid()}_model_")) / "m"
(_MODEL_DIR / "1").mkdir(parents=True)
(_MODEL_DIR / "initial_state").mkdir()
(_MODEL_DIR / "initial_state" / "empty").write_bytes(b"")  # for sequence states' data_file


# -- the targets ----------------------------------------------------------------------------


def json_infer(data: bytes) -> None:
    """An HTTP inference body of JSON only (no binary blocks)."""
    try:
        parsed = json_codec.parse_json(data)
        request, fmt = json_codec.decode_request(parsed, "m", "", binary_tensor.BlockReader(None, "m"),
                                                 MAX_BYTES, SHM)
    except NurseryError:
        return
    _encode_back(request, fmt)


def _encode_back(request: Any, fmt: json_codec.OutputFormat) -> None:
    """What a decoded request's tensors become in a response, through the same formats (an
    identity model's answer): the encoder must cope with whatever the decoder accepted."""
    from nursery.types import InferenceResponse

    response = InferenceResponse("m", "1", list(request.inputs.values()))
    fmt.shm = {}  # outputs are not the request's inputs: no region writes here
    try:
        json_codec.encode_response(response, fmt)
    except NurseryError:
        pass


def binary_infer(data: bytes) -> None:
    """An HTTP inference body with the binary tensor extension. The input is the
    ``Inference-Header-Content-Length`` value, a newline, then the body; no newline: no
    header (a JSON-only body)."""
    header: bytes | None
    if b"\n" in data:
        header, body = data.split(b"\n", 1)
    else:
        header, body = None, data
    try:
        json_part, blocks = binary_tensor.split_body(body, header)
        if blocks is not None and len(json_part) == 0:
            return  # a raw binary request: decoded against the model's config (needs a model)
        parsed = json_codec.parse_json(json_part)
        request, fmt = json_codec.decode_request(parsed, "m", "", binary_tensor.BlockReader(blocks, "m"),
                                                 MAX_BYTES, SHM)
    except NurseryError:
        return
    _encode_back(request, fmt)


def http_body_encoding(data: bytes) -> None:
    """The inference route's compressed bodies: the first byte picks gzip or deflate."""
    encoding = b"gzip" if not data or data[0] % 2 == 0 else b"deflate"
    try:
        out = http_infer._decompress(data[1:], encoding, MAX_BYTES)
    except NurseryError:
        return
    assert len(out) <= MAX_BYTES


_CODEC = grpc_wire.StrictProtoCodec()


def grpc_infer(data: bytes) -> None:
    """A ModelInferRequest message through the hot path's decoder and the codec."""
    try:
        message = _CODEC.decode(data, pb.ModelInferRequest)
    except grpclib.GRPCError:
        return
    try:
        request = grpc_codec.decode_request(message, SHM)
        grpc_codec.decode_shm_outputs(message, SHM)
    except NurseryError:
        return
    from nursery.types import InferenceResponse

    grpc_codec.encode_response(InferenceResponse("m", "1", list(request.inputs.values())))


def grpc_infer_betterproto(data: bytes) -> None:
    """The same message through the strict check and betterproto (the grpclib server's
    path, and every other gRPC message's)."""
    try:
        message = grpc_wire.parse_message(data, pb.ModelInferRequest)
    except (grpc_wire.WireError, UnicodeDecodeError):
        return  # the codec answers these INTERNAL "Unable to parse request"
    try:
        grpc_codec.decode_request(message, SHM)
        grpc_codec.decode_shm_outputs(message, SHM)
    except NurseryError:
        return


def config_pbtxt(data: bytes) -> None:
    """``config.pbtxt`` text through the text-format parser and the whole validation."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return  # read_config_proto answers a ConfigError for it
    try:
        proto = model_config.parse_config_text(text, "m")
        model_config.read_model_config(_MODEL_DIR, "m", backends=get_factory, auto_complete=False,
                                       proto=proto)
    except NurseryError:
        return


def repository_load(data: bytes) -> None:
    """A repository load request's JSON body (``config`` override, ``file:`` contents)."""
    try:
        config, _files = http_app._load_parameters(data)
    except NurseryError:
        return
    if config is not None:
        try:
            model_config.read_model_config(_MODEL_DIR, "m", backends=get_factory,
                                           auto_complete=False, proto=config)
        except NurseryError:
            return


TARGETS: dict[str, Callable[[bytes], None]] = {
    "json_infer": json_infer,
    "binary_infer": binary_infer,
    "http_body_encoding": http_body_encoding,
    "grpc_infer": grpc_infer,
    "grpc_infer_betterproto": grpc_infer_betterproto,
    "config_pbtxt": config_pbtxt,
    "repository_load": repository_load,
}


# -- seeds: valid inputs to mutate ----------------------------------------------------------


def _j(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def _binary(inputs: list[tuple[str, list[int], str, bytes]], extra: dict[str, Any] | None = None) -> bytes:
    head = _j({"inputs": [{"name": n, "shape": s, "datatype": d,
                           "parameters": {"binary_data_size": len(b)}} for n, s, d, b in inputs],
               **(extra or {})})
    return str(len(head)).encode() + b"\n" + head + b"".join(b for *_, b in inputs)


def _strings(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(x)) + x for x in items)


_JSON_SEEDS = [
    _j({"id": "a", "inputs": [{"name": "A", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                              {"name": "B", "shape": [2, 2], "datatype": "INT64",
                               "data": [[1, 2], [3, 4]]}],
        "outputs": [{"name": "A", "parameters": {"binary_data": True}}, {"name": "B"}]}),
    _j({"inputs": [{"name": "S", "shape": [2], "datatype": "BYTES", "data": ["ab", "c"]},
                   {"name": "T", "shape": [1], "datatype": "BOOL", "data": [True]}],
        "parameters": {"sequence_id": 7, "sequence_start": True, "priority": 1, "x": "y"}}),
    _j({"inputs": [{"name": "Z", "shape": [0, 3], "datatype": "UINT8", "data": []},
                   {"name": "M", "shape": [4], "datatype": "FP32",
                    "parameters": {"shared_memory_region": REGION, "shared_memory_byte_size": 16,
                                   "shared_memory_offset": 8}}],
        "outputs": [{"name": "M", "parameters": {"shared_memory_region": REGION,
                                                 "shared_memory_byte_size": 64}},
                    {"name": "Z", "parameters": {"classification": 2}}]}),
    _j({"inputs": [{"name": "Q", "shape": [2], "datatype": "BYTES",
                    "parameters": {"shared_memory_region": REGION, "shared_memory_offset": 1024,
                                   "shared_memory_byte_size": 12}}]}),
]
_BINARY_SEEDS = [
    _binary([("A", [1, 4], "FP32", struct.pack("<4f", 1, 2, 3, 4)),
             ("S", [3], "BYTES", _strings(b"x", b"", b"yz"))]),
    _binary([("H", [2], "FP16", b"\0<\0<"), ("U", [1, 2], "UINT64", struct.pack("<2Q", 1, 2**64 - 1))],
            {"outputs": [{"name": "H", "parameters": {"binary_data": True}}],
             "parameters": {"binary_data_output": True}}),
    _binary([("S", [2], "BYTES", _strings(b"a", b"b"))]),
    *(b"\n" + s for s in _JSON_SEEDS[:1]),
    *_JSON_SEEDS[:2],
]


def _grpc_seed(inputs: list[tuple[str, list[int], str]], raw: list[bytes],
               contents: pb.InferTensorContents | None = None,
               params: dict[str, pb.InferParameter] | None = None) -> bytes:
    message = pb.ModelInferRequest(
        model_name="m", id="q",
        inputs=[pb.ModelInferRequestInferInputTensor(name=n, datatype=d, shape=s,
                                                     parameters=params or {}) for n, s, d in inputs],
        outputs=[pb.ModelInferRequestInferRequestedOutputTensor(name="O")],
        raw_input_contents=raw,
        parameters={"sequence_id": pb.InferParameter(int64_param=3)})
    if contents is not None:
        message.inputs[0].contents = contents
    return bytes(message)


_GRPC_SEEDS = [
    _grpc_seed([("A", [1, 4], "FP32"), ("S", [2], "BYTES")],
               [struct.pack("<4f", 1, 2, 3, 4), _strings(b"ab", b"c")]),
    _grpc_seed([("I", [3], "INT32")], [], pb.InferTensorContents(int_contents=[1, -2, 3])),
    _grpc_seed([("S", [2], "BYTES")], [], pb.InferTensorContents(bytes_contents=[b"a", b"bc"])),
    _grpc_seed([("M", [4], "FP32")], [], None,
               {"shared_memory_region": pb.InferParameter(string_param=REGION),
                "shared_memory_byte_size": pb.InferParameter(int64_param=16)}),
]
_CONFIG_SEEDS = [
    b'name: "m"\nbackend: "python"\nmax_batch_size: 8\n'
    b'input [{ name: "IN" data_type: TYPE_FP32 dims: [ -1, 4 ] }]\n'
    b'output [{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }]\n'
    b'dynamic_batching { max_queue_delay_microseconds: 100 preferred_batch_size: [ 4, 8 ] }\n'
    b'instance_group [{ count: 2 kind: KIND_CPU }]\n',
    # (an empty reshape needs a batching model: Triton refuses scalar tensors otherwise)
    b'backend: "python"\nmax_batch_size: 2\ninput { name: "S" data_type: TYPE_STRING dims: [ 1 ] }\n'
    b'output { name: "O" data_type: TYPE_STRING dims: [ 1 ] reshape { shape: [ ] } }\n'
    b'sequence_batching { max_sequence_idle_microseconds: 5000000 control_input [{ name: "START"'
    b' control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }] }] }\n'
    b'parameters { key: "k" value { string_value: "v\\n\\x41" } }\n',
    b'platform: "ensemble"\nmax_batch_size: 4\ninput [{ name: "I" data_type: TYPE_INT8 dims: [2] }]\n'
    b'output [{ name: "O" data_type: TYPE_INT8 dims: [2] }]\nensemble_scheduling { step [{ '
    b'model_name: "x" model_version: -1 input_map { key: "IN" value: "I" } output_map { key: "OUT"'
    b' value: "O" } }] }\n',
]
_LOAD_SEEDS = [
    _j({"parameters": {"config": json.dumps({"backend": "python", "max_batch_size": 2,
                                             "input": [{"name": "I", "data_type": "TYPE_FP32",
                                                        "dims": [3]}],
                                             "output": [{"name": "O", "dataType": "TYPE_FP32",
                                                         "dims": ["3"]}]})}}),
    _j({"parameters": {"config": "{}", "file:1/model.py": base64.b64encode(b"print(1)").decode()}}),
    _j({"parameters": {}}),
]

SEEDS: dict[str, list[bytes]] = {
    "json_infer": _JSON_SEEDS,
    "binary_infer": _BINARY_SEEDS,
    "http_body_encoding": [b"\0" + __import__("gzip").compress(s) for s in _JSON_SEEDS[:2]]
    + [b"\1" + __import__("zlib").compress(b"x" * 5000)],
    "grpc_infer": _GRPC_SEEDS,
    "grpc_infer_betterproto": _GRPC_SEEDS,
    "config_pbtxt": _CONFIG_SEEDS,
    "repository_load": _LOAD_SEEDS,
}


# -- hypothesis: random bytes, mutated seeds, and hostile shapes ---------------------------

_INTERESTING = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


def _apply(seed: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    data = bytearray(seed)
    for kind, pos, value in edits:
        at = pos % (len(data) + 1)
        if kind == 0 and data:  # flip a bit
            data[at % len(data)] ^= 1 << (value % 8)
        elif kind == 1:  # insert a byte
            data.insert(at, value % 256)
        elif kind == 2 and data:  # delete a run
            del data[at : at + 1 + value % 8]
        elif kind == 3:  # an interesting integer, as text (JSON / pbtxt) or a varint
            number = _INTERESTING[value % len(_INTERESTING)]
            data[at:at] = str(number).encode() if value % 2 else _varint(number)
    return bytes(data)


def _varint(value: int) -> bytes:
    out = bytearray()
    grpc_wire._put_varint(out, value)
    return bytes(out)


def mutated(name: str) -> st.SearchStrategy[bytes]:
    edits = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1 << 16), st.integers(0, 1 << 16)),
                     max_size=6)
    return st.builds(_apply, st.sampled_from(SEEDS[name]), edits)


_FAST = settings(max_examples=800, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("name", sorted(TARGETS))
@_FAST
@given(data=st.data())
def test_target_survives_random_and_mutated_bytes(name: str, data: st.DataObject) -> None:
    target = TARGETS[name]
    blob = data.draw(st.one_of(st.binary(max_size=512), mutated(name)))
    target(blob)


def test_seeds_are_accepted() -> None:
    """The seeds are valid inputs (a fuzzer starting from refused inputs explores little)."""
    for blob in _JSON_SEEDS:
        json_codec.decode_request(json_codec.parse_json(blob), "m", "",
                                  binary_tensor.BlockReader(None, "m"), MAX_BYTES, SHM)
    for blob in _GRPC_SEEDS:
        grpc_codec.decode_request(_CODEC.decode(blob, pb.ModelInferRequest), SHM)
    for blob in _CONFIG_SEEDS[:2]:
        model_config.read_model_config(_MODEL_DIR, "m", backends=get_factory, auto_complete=False,
                                       proto=model_config.parse_config_text(blob.decode(), "m"))
    assert http_app._load_parameters(_LOAD_SEEDS[0])[0] is not None


_dims = st.lists(st.one_of(st.integers(0, 4), st.sampled_from([*_INTERESTING, 2**20, 2**25]),
                           st.integers(-3, -1)), max_size=6)
_datatypes = st.sampled_from(["FP32", "BYTES", "INT8", "UINT64", "BOOL", "FP16", "BF16", "x"])


@_FAST
@given(shape=_dims, datatype=_datatypes, count=st.integers(0, 6),
       how=st.sampled_from(["data", "binary", "shm"]))
def test_hostile_shapes_http(shape: list[int], datatype: str, count: int, how: str) -> None:
    """Declared shapes of every size against a few elements present, on every input path."""
    binary_infer(_http_body(shape, datatype, count, how))


def _http_body(shape: list[int], datatype: str, count: int, how: str) -> bytes:
    """A one-input HTTP request (the ``binary_infer`` target's framing) declaring ``shape``
    with ``count`` elements present: in ``data``, in a binary block, or in shared memory."""
    item: dict[str, Any] = {"name": "X", "shape": shape, "datatype": datatype}
    block = b""
    if how == "data":
        item["data"] = ["a"] * count if datatype == "BYTES" else [1] * count
    elif how == "binary":
        block = _strings(*[b"a"] * count) if datatype == "BYTES" else b"\1" * count * 4
        item["parameters"] = {"binary_data_size": len(block)}
    else:
        item["parameters"] = {"shared_memory_region": REGION, "shared_memory_byte_size": count * 4}
    head = _j({"inputs": [item]})
    return str(len(head)).encode() + b"\n" + head + block


@_FAST
@given(shape=_dims, datatype=_datatypes, count=st.integers(0, 6), typed=st.booleans())
def test_hostile_shapes_grpc(shape: list[int], datatype: str, count: int, typed: bool) -> None:
    shape = [d if d < 2**63 else -1 for d in shape]  # int64 on the wire
    if typed:
        contents = (pb.InferTensorContents(bytes_contents=[b"a"] * count) if datatype == "BYTES"
                    else pb.InferTensorContents(fp32_contents=[1.0] * count))
        blob = _grpc_seed([("X", shape, datatype)], [], contents)
    else:
        raw = _strings(*[b"a"] * count) if datatype == "BYTES" else b"\1" * count * 4
        blob = _grpc_seed([("X", shape, datatype)], [raw])
    grpc_infer(blob)
    grpc_infer_betterproto(blob)


_PY_MODEL = (b'backend: "python"\ninput [{ name: "I" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
             b'output [{ name: "O" data_type: TYPE_FP32 dims: [ 1 ] }]\n')
_STATE = (b'sequence_batching { state [{ input_name: "S" output_name: "T" data_type: TYPE_FP32 '
          b'dims: [ %s ] %s }] }\n')


@pytest.mark.parametrize(("name", "blob"), [
    # each once raised something else than the documented errors
    ("config_pbtxt", b"max_batch_size: 0129"),  # octal digits 8 and 9: ValueError from int()
    ("config_pbtxt", b"max_batch_size: " + b"9" * 5000),  # int() refuses over 4300 digits
    ("config_pbtxt", _PY_MODEL + b"sequence_batching { }"),  # no strategy: AttributeError
    ("config_pbtxt", _PY_MODEL + _STATE % (b"4611686018427387904", b"")),  # np.zeros: ValueError
    ("config_pbtxt", _PY_MODEL + _STATE % (b"4294967296, 4294967296", b"initial_state [{ "
                                           b"data_type: TYPE_FP32 dims: [ 4294967296, 4294967296 ] "
                                           b'data_file: "empty" }]')),  # np.prod wrapped to 0
    ("repository_load", b"[" * 100_000),  # RecursionError in json.loads
    ("repository_load", _j({"parameters": {"config": "[" * 100_000}})),
    ("grpc_infer", bytes(pb.ModelInferRequest(inputs=[pb.ModelInferRequestInferInputTensor(
        name="X", datatype="BYTES", shape=[1])]))),  # no contents at all: AttributeError
    ("grpc_infer", b"\x2a\x05\x2a\x03\x08\x01\x10"),  # contents with a mistyped field: RuntimeError
    ("grpc_infer_betterproto", b"\x0a\x01\x41\x10\x01"),  # model_name then a varint field 2
    ("binary_infer", b"9" * 5000 + b"\n{}"),  # a header length of 5000 digits
    ("binary_infer", b"1_0\n{}"),  # int() takes underscores
], ids=lambda v: v if isinstance(v, str) else f"{len(v)}B")
def test_inputs_fuzzing_found(name: str, blob: bytes) -> None:
    TARGETS[name](blob)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(shape=_dims, datatype=_datatypes, count=st.integers(0, 6),
       how=st.sampled_from(["data", "binary", "shm", "grpc_raw", "grpc_typed"]))
def test_memory_follows_the_bytes_present_not_the_shape(shape: list[int], datatype: str, count: int,
                                                        how: str) -> None:
    """Whatever a request declares, decoding it allocates in proportion to the bytes it
    carries (and the region it names), never to its shape: peak traced memory stays under
    a small constant plus a multiple of the input's size."""
    import tracemalloc

    if how.startswith("grpc"):
        shape = [d if d < 2**63 else -1 for d in shape]
        if how == "grpc_typed":
            contents = (pb.InferTensorContents(bytes_contents=[b"a"] * count) if datatype == "BYTES"
                        else pb.InferTensorContents(fp32_contents=[1.0] * count))
            blob, target = _grpc_seed([("X", shape, datatype)], [], contents), grpc_infer
        else:
            raw = _strings(*[b"a"] * count) if datatype == "BYTES" else b"\1" * count * 4
            blob, target = _grpc_seed([("X", shape, datatype)], [raw]), grpc_infer
    else:
        blob, target = _http_body(shape, datatype, count, how), binary_infer
    tracemalloc.start()
    try:
        target(blob)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < (1 << 20) + 64 * (len(blob) + REGION_SIZE), (peak, len(blob))
