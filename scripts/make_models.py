#!/usr/bin/env python3
"""Build the small ONNX example models and write them as a Triton-style model repository.

    python scripts/make_models.py                  # rewrites ./model_repository
    python scripts/make_models.py OUT_DIR          # somewhere else

Needs the `onnx` package (in the `test` extra). The builders are importable: the tests use
them to make repositories of their own (every datatype, broken models, other batch sizes).

Models written to model_repository/:
  add_sub   INPUT0, INPUT1 FP32 [-1,16] -> OUTPUT0 = INPUT0+INPUT1, OUTPUT1 = INPUT0-INPUT1
  mlp       INPUT0 FP32 [-1,784] -> Gemm+Relu -> Gemm+Relu -> Gemm -> OUTPUT0 FP32 [-1,10]
  string_identity  INPUT0 BYTES [-1,-1] -> OUTPUT0 (same strings); no config.pbtxt: the
            server completes it from the model, as Triton's auto-complete does
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
OPSET = 17

ONNX_TYPES = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
    "BF16": TensorProto.BFLOAT16,
}
CONFIG_TYPES = {
    "BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8", "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32", "UINT64": "TYPE_UINT64", "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16", "INT32": "TYPE_INT32", "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16", "FP32": "TYPE_FP32", "FP64": "TYPE_FP64",
    "BYTES": "TYPE_STRING", "BF16": "TYPE_BF16",
}


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="nursery"
    )
    model.ir_version = min(model.ir_version, 9)  # loadable by older onnxruntime builds
    onnx.checker.check_model(model)
    return model


def build_add_sub(width: int = 16) -> onnx.ModelProto:
    def vi(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", width])

    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"], name="add"),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"], name="sub"),
    ]
    graph = helper.make_graph(nodes, "add_sub", [vi("INPUT0"), vi("INPUT1")],
                              [vi("OUTPUT0"), vi("OUTPUT1")])
    return _model(graph)


def build_mlp(dims: tuple[int, ...] = (784, 128, 64, 10), seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    x = "INPUT0"
    for i, (fan_in, fan_out) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        w = (rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        b = (rng.standard_normal((fan_out,)) * 0.01).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"B{i}")]
        last = i == len(dims) - 2
        out = "OUTPUT0" if last else f"gemm{i}"
        nodes.append(helper.make_node("Gemm", [x, f"W{i}", f"B{i}"], [out], name=f"gemm{i}"))
        if not last:
            nodes.append(helper.make_node("Relu", [out], [f"relu{i}"], name=f"relu{i}"))
            x = f"relu{i}"
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", dims[0]])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", dims[-1]])],
        initializer=inits,
    )
    return _model(graph)


def build_identity(datatype: str, shape: list[int | str]) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 for one datatype (any protocol datatype, BF16 and BYTES included)."""
    t = ONNX_TYPES[datatype]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"], name="identity")],
        f"identity_{datatype.lower()}",
        [helper.make_tensor_value_info("INPUT0", t, shape)],
        [helper.make_tensor_value_info("OUTPUT0", t, shape)],
    )
    return _model(graph)


def config_text(
    name: str,
    inputs: list[tuple[str, str, list[int]]],
    outputs: list[tuple[str, str, list[int]]],
    max_batch_size: int,
    extra: str = "",
    instance_count: int = 1,
) -> str:
    def block(kind: str, tensors: list[tuple[str, str, list[int]]]) -> str:
        items = ",\n".join(
            f'  {{\n    name: "{n}"\n    data_type: {CONFIG_TYPES[dt]}\n'
            f"    dims: [ {', '.join(str(d) for d in dims)} ]\n  }}"
            for n, dt, dims in tensors
        )
        return f"{kind} [\n{items}\n]\n"

    return (
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch_size}\n'
        + block("input", inputs)
        + block("output", outputs)
        + f"instance_group [ {{ count: {instance_count}, kind: KIND_CPU }} ]\n"
        + extra
    )


def write_model(repo: Path, name: str, model: onnx.ModelProto, config: str | None,
                version: int = 1) -> Path:
    folder = repo / name
    (folder / str(version)).mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(folder / str(version) / "model.onnx"))
    if config is not None:
        (folder / "config.pbtxt").write_text(config)
    return folder


def write_add_sub(repo: Path, max_batch_size: int = 8, name: str = "add_sub") -> Path:
    io = [("INPUT0", "FP32", [16]), ("INPUT1", "FP32", [16])]
    out = [("OUTPUT0", "FP32", [16]), ("OUTPUT1", "FP32", [16])]
    return write_model(repo, name, build_add_sub(),
                       config_text(name, io, out, max_batch_size))


def write_mlp(repo: Path, max_batch_size: int = 64, name: str = "mlp") -> Path:
    return write_model(
        repo, name, build_mlp(),
        config_text(name, [("INPUT0", "FP32", [784])], [("OUTPUT0", "FP32", [10])],
                    max_batch_size, 'parameters { key: "intra_op_thread_count" '
                    'value: { string_value: "1" } }\n'),
    )


def write_string_identity(repo: Path, name: str = "string_identity") -> Path:
    return write_model(repo, name, build_identity("BYTES", ["batch", "n"]), None)


def write_bundled(repo: Path) -> None:
    write_add_sub(repo)
    write_mlp(repo)
    write_string_identity(repo)


# -- sequence models (the sequence batcher) ---------------------------------------------------


def build_sequence_accumulator(datatype: str = "INT32", width: int = 1,
                               batching: bool = True) -> onnx.ModelProto:
    """OUTPUT = INPUT + INPUT_STATE and OUTPUT_STATE = the same: a running sum per sequence,
    kept by the server as implicit state (INPUT_STATE in, OUTPUT_STATE out)."""
    t = ONNX_TYPES[datatype]

    def vi(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, t, ["batch", width] if batching else [width])

    nodes = [helper.make_node("Add", ["INPUT", "INPUT_STATE"], ["OUTPUT"], name="add"),
             helper.make_node("Identity", ["OUTPUT"], ["OUTPUT_STATE"], name="keep")]
    graph = helper.make_graph(nodes, "sequence_accumulator", [vi("INPUT"), vi("INPUT_STATE")],
                              [vi("OUTPUT"), vi("OUTPUT_STATE")])
    return _model(graph)


def sequence_accumulator_config(name: str, max_batch_size: int = 8, strategy: str = "direct { }",
                                idle_us: int = 5_000_000, instance_count: int = 1,
                                datatype: str = "INT32", initial: str = "zero_data: true") -> str:
    """``strategy``: "direct { }" or "oldest { max_candidate_sequences: N ... }";
    ``initial``: the initial_state's data ("zero_data: true" or 'data_file: "name"')."""
    cfg = CONFIG_TYPES[datatype]
    return config_text(
        name, [("INPUT", datatype, [1])], [("OUTPUT", datatype, [1])], max_batch_size,
        f"sequence_batching {{\n  max_sequence_idle_microseconds: {idle_us}\n  {strategy}\n"
        f'  state [ {{ input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" '
        f"data_type: {cfg} dims: [ 1 ] initial_state: {{ data_type: {cfg} dims: [ 1 ] "
        f'name: "init" {initial} }} }} ]\n}}\n',
        instance_count,
    )


def write_sequence_accumulator(repo: Path, name: str = "sequence_accumulator",
                               **options: Any) -> Path:
    model = build_sequence_accumulator(options.get("datatype", "INT32"),
                                       batching=options.get("max_batch_size", 8) > 0)
    return write_model(repo, name, model, sequence_accumulator_config(name, **options))


def build_sequence_controls(corrid: str = "UINT64") -> onnx.ModelProto:
    """Echoes its control inputs so a test can see them: OUTPUT = INPUT, START_OUT = START,
    END_OUT = END, READY_OUT = READY (INT32 [batch,1]), CORRID_OUT = CORRID."""
    i32 = TensorProto.INT32

    def vi(name: str, t: int = i32) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, t, ["batch", 1])

    names = ["INPUT", "START", "END", "READY", "CORRID"]
    outs = ["OUTPUT", "START_OUT", "END_OUT", "READY_OUT", "CORRID_OUT"]
    types = [i32, i32, i32, i32, ONNX_TYPES[corrid]]
    nodes = [helper.make_node("Identity", [n], [o], name=f"echo_{n.lower()}")
             for n, o in zip(names, outs, strict=True)]
    graph = helper.make_graph(nodes, "sequence_controls",
                              [vi(n, t) for n, t in zip(names, types, strict=True)],
                              [vi(o, t) for o, t in zip(outs, types, strict=True)])
    return _model(graph)


def write_sequence_controls(repo: Path, name: str = "sequence_controls", corrid: str = "UINT64",
                            max_batch_size: int = 4, strategy: str = "direct { }",
                            idle_us: int = 5_000_000) -> Path:
    outs = [("OUTPUT", "INT32", [1]), ("START_OUT", "INT32", [1]), ("END_OUT", "INT32", [1]),
            ("READY_OUT", "INT32", [1]), ("CORRID_OUT", corrid, [1])]
    controls = "".join(
        f'    {{ name: "{n}" control [ {{ kind: CONTROL_SEQUENCE_{n} int32_false_true: [ 0, 1 ] '
        "} ] },\n" for n in ("START", "END", "READY"))
    config = config_text(
        name, [("INPUT", "INT32", [1])], outs, max_batch_size,
        f"sequence_batching {{\n  max_sequence_idle_microseconds: {idle_us}\n  {strategy}\n"
        f"  control_input [\n{controls}"
        f'    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: '
        f"{CONFIG_TYPES[corrid]} }} ] }}\n  ]\n}}\n",
    )
    return write_model(repo, name, build_sequence_controls(corrid), config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=str(ROOT / "model_repository"))
    args = parser.parse_args()
    write_bundled(Path(args.out))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
