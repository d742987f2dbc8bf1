"""gRPC requests whose answers must match real Triton's, case by case.

``python tests/conformance/grpc_cases.py HOST:PORT OUT.json`` sends every case (grpcio with
tritonclient's generated messages) to a server serving ``add_sub`` (FP32 [16] x2,
max_batch_size 64) and writes ``{case: {"code": "NOT_FOUND", "details": "..."}}``. The answers
of Triton 2.51 are recorded in ``triton_2_51_grpc.json`` beside this file.
"""

from __future__ import annotations

import json
import struct
import sys
from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc


def _f32(n: int, v: float = 1.0) -> bytes:
    return struct.pack(f"<{n}f", *([v] * n))


def _inp(name: str, shape: list[int], datatype: str = "FP32", **kw: Any) -> Any:
    return pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape, **kw)


def _req(inputs: list[Any], raw: list[bytes] | None = None, model: str = "add_sub",
         **kw: Any) -> Any:
    return pb.ModelInferRequest(model_name=model, inputs=inputs, raw_input_contents=raw or [], **kw)


GOOD = [_inp("INPUT0", [1, 16]), _inp("INPUT1", [1, 16])]
GOOD_RAW = [_f32(16), _f32(16, 2.0)]

INFER_CASES: dict[str, Any] = {
    "ok_raw": _req(GOOD, GOOD_RAW),
    "ok_typed": _req([
        _inp("INPUT0", [1, 16], contents=pb.InferTensorContents(fp32_contents=[1.0] * 16)),
        _inp("INPUT1", [1, 16], contents=pb.InferTensorContents(fp32_contents=[2.0] * 16))]),
    "unknown_model": _req(GOOD, GOOD_RAW, model="nope"),
    "unknown_version": _req(GOOD, GOOD_RAW, model_version="9"),
    "bad_version_string": _req(GOOD, GOOD_RAW, model_version="abc"),
    "missing_input": _req(GOOD[:1], GOOD_RAW[:1]),
    "unknown_input": _req([_inp("INPUT0", [1, 16]), _inp("BOGUS", [1, 16])], GOOD_RAW),
    "wrong_datatype": _req([_inp("INPUT0", [1, 16], "INT32"), _inp("INPUT1", [1, 16])],
                           GOOD_RAW),
    "invalid_datatype": _req([_inp("INPUT0", [1, 16], "FLOAT99"), _inp("INPUT1", [1, 16])],
                             GOOD_RAW),
    "wrong_shape": _req([_inp("INPUT0", [1, 8]), _inp("INPUT1", [1, 8])],
                        [_f32(8), _f32(8)]),
    "batch_too_big": _req([_inp("INPUT0", [65, 16]), _inp("INPUT1", [65, 16])],
                          [_f32(65 * 16), _f32(65 * 16)]),
    "byte_size_mismatch": _req(GOOD, [_f32(15), _f32(16)]),
    "raw_count_mismatch": _req(GOOD, GOOD_RAW[:1]),
    "raw_and_contents": _req([
        _inp("INPUT0", [1, 16], contents=pb.InferTensorContents(fp32_contents=[1.0] * 16)),
        _inp("INPUT1", [1, 16])], GOOD_RAW),
    "typed_count_mismatch": _req([
        _inp("INPUT0", [1, 16], contents=pb.InferTensorContents(fp32_contents=[1.0] * 15)),
        _inp("INPUT1", [1, 16], contents=pb.InferTensorContents(fp32_contents=[2.0] * 16))]),
    "unknown_output": _req(GOOD, GOOD_RAW, outputs=[
        pb.ModelInferRequest.InferRequestedOutputTensor(name="NOPE")]),
    "triton_param": _req(GOOD, GOOD_RAW, parameters={"triton_x": pb.InferParameter(bool_param=True)}),
}

OTHER_CASES: dict[str, tuple[str, Any]] = {
    "metadata_unknown": ("ModelMetadata", pb.ModelMetadataRequest(name="nope")),
    "metadata_bad_version": ("ModelMetadata", pb.ModelMetadataRequest(name="add_sub", version="7")),
    "metadata_no_name": ("ModelMetadata", pb.ModelMetadataRequest()),
    "config_unknown": ("ModelConfig", pb.ModelConfigRequest(name="nope")),
    "ready_unknown": ("ModelReady", pb.ModelReadyRequest(name="nope")),
    "ready_bad_version": ("ModelReady", pb.ModelReadyRequest(name="add_sub", version="7")),
}


# bytes that are not a valid ModelInferRequest
MALFORMED = {
    "malformed_truncated_string": b"\x0a\xff\x01add_sub",  # model_name declares 255 bytes
    "malformed_bad_wire_type": b"\x0f\x00",  # field 1 with wire type 7
    "malformed_truncated_varint": b"\x08",
}


def run_all(target: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with grpc.insecure_channel(target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        calls = {name: (stub.ModelInfer, req) for name, req in INFER_CASES.items()}
        calls.update({name: (getattr(stub, rpc), req) for name, (rpc, req) in OTHER_CASES.items()})
        for name, (call, req) in calls.items():
            try:
                reply = call(req, timeout=30)
                entry: dict[str, Any] = {"code": "OK"}
                if hasattr(reply, "outputs"):
                    entry["outputs"] = [o.name for o in reply.outputs]
                    entry["raw"] = [r.hex() for r in reply.raw_output_contents]
                if hasattr(reply, "ready"):
                    entry["ready"] = reply.ready
                out[name] = entry
            except grpc.RpcError as err:
                out[name] = {"code": err.code().name, "details": err.details()}
        raw_call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                       request_serializer=lambda b: b,
                                       response_deserializer=lambda b: b)
        for name, payload in MALFORMED.items():
            try:
                raw_call(payload, timeout=30)
                out[name] = {"code": "OK"}
            except grpc.RpcError as err:
                out[name] = {"code": err.code().name, "details": err.details()}
    return out


if __name__ == "__main__":
    answers = run_all(sys.argv[1])
    with open(sys.argv[2], "w") as f:
        json.dump(answers, f, indent=1, sort_keys=True)
    for name, a in answers.items():
        print(f"{name:22s} {a['code']:18s} {a.get('details', '')[:140]}")
