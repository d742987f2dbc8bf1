"""HTTP requests whose answers must match real Triton's, case by case.

``python tests/conformance/http_cases.py URL OUT.json`` sends every case to a running server
serving the ``add_sub`` and ``mlp`` models (FP32, max_batch_size 8 and 0-or-more as in
``model_repository/``) and writes ``{case: {"status": int, "body": ...}}``. The recorded answers
of Triton 2.51 live in ``triton_2_51_http.json`` beside this file; the e2e test sends the same
cases to nursery and compares.
"""

from __future__ import annotations

import http.client
import json
import struct
import sys
from typing import Any
from urllib.parse import urlparse


def _f32(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


ONES = [1.0] * 16
TWOS = [2.0] * 16


def _infer_json(inputs: list[dict[str, Any]], **extra: Any) -> bytes:
    return json.dumps({"inputs": inputs, **extra}).encode()


def _in(name: str, shape: list[int], data: Any, datatype: str = "FP32", **extra: Any) -> dict[str, Any]:
    return {"name": name, "shape": shape, "datatype": datatype, "data": data, **extra}


def _binary(inputs: list[tuple[str, list[int], str, bytes]], outputs: Any = None,
            header_len: int | None = None, extra_tail: bytes = b"",
            declared: list[int] | None = None) -> tuple[bytes, dict[str, str]]:
    head: dict[str, Any] = {"inputs": []}
    blobs = b""
    for i, (name, shape, dt, blob) in enumerate(inputs):
        size = declared[i] if declared else len(blob)
        head["inputs"].append({"name": name, "shape": shape, "datatype": dt,
                               "parameters": {"binary_data_size": size}})
        blobs += blob
    if outputs is not None:
        head["outputs"] = outputs
    js = json.dumps(head).encode()
    hl = len(js) if header_len is None else header_len
    return js + blobs + extra_tail, {"Inference-Header-Content-Length": str(hl)}


ADD = "/v2/models/add_sub/infer"

CASES: dict[str, tuple[str, str, bytes, dict[str, str]]] = {
    # name: (method, path, body, headers)
    "health_live": ("GET", "/v2/health/live", b"", {}),
    "health_ready": ("GET", "/v2/health/ready", b"", {}),
    "model_ready": ("GET", "/v2/models/add_sub/ready", b"", {}),
    "model_ready_v1": ("GET", "/v2/models/add_sub/versions/1/ready", b"", {}),
    "model_ready_unknown": ("GET", "/v2/models/nope/ready", b"", {}),
    "model_ready_bad_version": ("GET", "/v2/models/add_sub/versions/7/ready", b"", {}),
    "metadata_unknown": ("GET", "/v2/models/nope", b"", {}),
    "metadata_bad_version": ("GET", "/v2/models/add_sub/versions/7", b"", {}),
    "config_unknown": ("GET", "/v2/models/nope/config", b"", {}),
    "unknown_route": ("GET", "/v2/nothing/here", b"", {}),
    "wrong_method_infer": ("GET", ADD, b"", {}),
    "wrong_method_meta": ("POST", "/v2/models/add_sub", b"{}", {}),
    "infer_unknown_model": ("POST", "/v2/models/nope/infer",
                            _infer_json([_in("INPUT0", [1, 16], ONES)]), {}),
    "infer_unknown_version": ("POST", "/v2/models/add_sub/versions/9/infer",
                              _infer_json([_in("INPUT0", [1, 16], ONES)]), {}),
    "infer_ok_json": ("POST", ADD, _infer_json(
        [_in("INPUT0", [1, 16], ONES), _in("INPUT1", [1, 16], TWOS)], id="abc"), {}),
    "infer_ok_nested": ("POST", ADD, _infer_json(
        [_in("INPUT0", [1, 16], [ONES]), _in("INPUT1", [1, 16], [TWOS])]), {}),
    "infer_ok_outputs_listed": ("POST", ADD, _infer_json(
        [_in("INPUT0", [1, 16], ONES), _in("INPUT1", [1, 16], TWOS)],
        outputs=[{"name": "OUTPUT1"}]), {}),
    "malformed_json": ("POST", ADD, b"{not json", {}),
    "empty_body": ("POST", ADD, b"", {}),
    "json_not_object": ("POST", ADD, b"[1,2]", {}),
    "no_inputs_key": ("POST", ADD, b"{}", {}),
    "inputs_not_array": ("POST", ADD, b'{"inputs": 5}', {}),
    "missing_input": ("POST", ADD, _infer_json([_in("INPUT0", [1, 16], ONES)]), {}),
    "unknown_input": ("POST", ADD, _infer_json(
        [_in("INPUT0", [1, 16], ONES), _in("BOGUS", [1, 16], TWOS)]), {}),
    "extra_input": ("POST", ADD, _infer_json(
        [_in("INPUT0", [1, 16], ONES), _in("INPUT1", [1, 16], TWOS), _in("X", [1, 16], ONES)]), {}),
    "wrong_datatype": ("POST", ADD, _infer_json(
        [_in("INPUT0", [1, 16], [1] * 16, "INT32"), _in("INPUT1", [1, 16], TWOS)]), {}),
    "invalid_datatype": ("POST", ADD, _infer_json(
        [_in("INPUT0", [1, 16], ONES, "FLOAT99"), _in("INPUT1", [1, 16], TWOS)]), {}),
    "wrong_shape": ("POST", ADD, _infer_json(
        [_in("INPUT0", [1, 8], ONES[:8]), _in("INPUT1", [1, 8], TWOS[:8])]), {}),
    "wrong_rank": ("POST", ADD, _infer_json(
        [_in("INPUT0", [16], ONES), _in("INPUT1", [16], TWOS)]), {}),
    "batch_too_big": ("POST", ADD, _infer_json(
        [_in("INPUT0", [65, 16], ONES * 65), _in("INPUT1", [65, 16], TWOS * 65)]), {}),
    "batch_mismatch": ("POST", ADD, _infer_json(
        [_in("INPUT0", [2, 16], ONES * 2), _in("INPUT1", [1, 16], TWOS)]), {}),
    "negative_dim": ("POST", ADD, _infer_json(
        [_in("INPUT0", [1, -16], ONES), _in("INPUT1", [1, 16], TWOS)]), {}),
    "too_few_elements": ("POST", ADD, _infer_json(
        [_in("INPUT0", [1, 16], ONES[:15]), _in("INPUT1", [1, 16], TWOS)]), {}),
    "too_many_elements": ("POST", ADD, _infer_json(
        [_in("INPUT0", [1, 16], ONES + [1.0]), _in("INPUT1", [1, 16], TWOS)]), {}),
    "string_in_fp32": ("POST", ADD, _infer_json(
        [_in("INPUT0", [1, 16], ["a"] * 16), _in("INPUT1", [1, 16], TWOS)]), {}),
    "no_data": ("POST", ADD, json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32"},
        _in("INPUT1", [1, 16], TWOS)]}).encode(), {}),
    "unknown_output": ("POST", ADD, _infer_json(
        [_in("INPUT0", [1, 16], ONES), _in("INPUT1", [1, 16], TWOS)],
        outputs=[{"name": "NOPE"}]), {}),
    "triton_param": ("POST", ADD, _infer_json(
        [_in("INPUT0", [1, 16], ONES), _in("INPUT1", [1, 16], TWOS)],
        parameters={"triton_foo": 1}), {}),
    "bad_param_type": ("POST", ADD, _infer_json(
        [_in("INPUT0", [1, 16], ONES), _in("INPUT1", [1, 16], TWOS)],
        parameters={"custom": [1, 2]}), {}),
    "fp16_json": ("POST", ADD, _infer_json(
        [_in("INPUT0", [1, 16], ONES, "FP16"), _in("INPUT1", [1, 16], TWOS)]), {}),
}

_ok_bin = _binary([("INPUT0", [1, 16], "FP32", _f32(ONES)), ("INPUT1", [1, 16], "FP32", _f32(TWOS))],
                  outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}},
                           {"name": "OUTPUT1", "parameters": {"binary_data": False}}])
CASES["infer_ok_binary"] = ("POST", ADD, *_ok_bin)
_b = _binary([("INPUT0", [1, 16], "FP32", _f32(ONES)), ("INPUT1", [1, 16], "FP32", _f32(TWOS))])
CASES["binary_header_too_long"] = ("POST", ADD, _b[0], {"Inference-Header-Content-Length": "99999"})
CASES["binary_header_negative"] = ("POST", ADD, _b[0], {"Inference-Header-Content-Length": "-5"})
CASES["binary_leftover"] = ("POST", ADD, *_binary(
    [("INPUT0", [1, 16], "FP32", _f32(ONES)), ("INPUT1", [1, 16], "FP32", _f32(TWOS))],
    extra_tail=b"xxxx"))
CASES["binary_short"] = ("POST", ADD, *_binary(
    [("INPUT0", [1, 16], "FP32", _f32(ONES)), ("INPUT1", [1, 16], "FP32", _f32(TWOS)[:60])],
    declared=[64, 64]))
CASES["binary_size_mismatch"] = ("POST", ADD, *_binary(
    [("INPUT0", [1, 16], "FP32", _f32(ONES)[:60]), ("INPUT1", [1, 16], "FP32", _f32(TWOS))]))
CASES["binary_without_header"] = ("POST", ADD, _b[0][: int(_b[1]["Inference-Header-Content-Length"])], {})
CASES["huge_shape"] = ("POST", ADD, *_binary(
    [("INPUT0", [1, 2**40], "FP32", _f32(ONES)), ("INPUT1", [1, 16], "FP32", _f32(TWOS))]))
CASES["data_and_binary"] = ("POST", ADD, json.dumps({"inputs": [
    {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": ONES,
     "parameters": {"binary_data_size": 64}}, _in("INPUT1", [1, 16], TWOS)]}).encode() + _f32(ONES),
    {"Inference-Header-Content-Length": str(len(json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": ONES,
         "parameters": {"binary_data_size": 64}}, _in("INPUT1", [1, 16], TWOS)]}).encode()))})


def send(url: str, method: str, path: str, body: bytes, headers: dict[str, str]) -> dict[str, Any]:
    u = urlparse(url if "://" in url else f"http://{url}")
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        conn.request(method, path, body=body if method == "POST" else None, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        hl = resp.getheader("Inference-Header-Content-Length")
        out: dict[str, Any] = {"status": resp.status}
        js = raw[: int(hl)] if hl else raw
        try:
            out["body"] = json.loads(js) if js else ""
        except ValueError:
            out["body"] = js.decode("utf-8", "replace")
        if hl:
            out["binary_bytes"] = len(raw) - int(hl)
        return out
    finally:
        conn.close()


def run_all(url: str) -> dict[str, Any]:
    return {name: send(url, *case) for name, case in CASES.items()}


if __name__ == "__main__":
    answers = run_all(sys.argv[1])
    with open(sys.argv[2], "w") as f:
        json.dump(answers, f, indent=1, sort_keys=True)
    for name, a in answers.items():
        print(f"{name:28s} {a['status']}  {json.dumps(a.get('body'))[:150]}")
