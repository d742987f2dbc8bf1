"""OpenVINO models for the tests, made in the test run: the project's MLP (ONNX, from
``scripts/make_models.py``) converted to OpenVINO IR (``model.xml`` + ``model.bin``), with or
without layouts, and the ONNX file itself read through OpenVINO."""

from __future__ import annotations

from pathlib import Path

import onnx

from tests.conftest import make_models

MLP_IO = ([("INPUT0", "FP32", [784])], [("OUTPUT0", "FP32", [10])])


def ov_config(name: str, max_batch_size: int = 64, params: dict[str, str] | None = None,
              io: bool = True, extra: str = "", dims: list[int] | None = None) -> str:
    lines = [f'name: "{name}"', 'backend: "openvino"', f"max_batch_size: {max_batch_size}"]
    if io:
        d = ", ".join(str(x) for x in (dims or [784]))
        lines.append(f'input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {d} ] }}]')
        lines.append('output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] }]')
    for key, value in (params or {}).items():
        lines.append(f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}')
    lines.append(extra)
    return "\n".join(lines) + "\n"


def save_ir(folder: Path, layout: bool = False, batch: int | None = None) -> Path:
    """The MLP as OpenVINO IR in ``folder/model.xml``; ``layout`` names its batch dimension
    ("NC"), ``batch`` fixes it."""
    import openvino as ov

    folder.mkdir(parents=True, exist_ok=True)
    onnx_path = folder / "mlp.onnx"
    onnx.save(make_models.build_mlp(), str(onnx_path))
    model = ov.Core().read_model(str(onnx_path))
    onnx_path.unlink()
    if batch is not None:
        model.reshape({"INPUT0": ov.PartialShape([batch, 784])})
    if layout:
        model.inputs[0].get_node().set_layout(ov.Layout("NC"))
        model.outputs[0].get_node().set_layout(ov.Layout("NC"))
    ov.save_model(model, str(folder / "model.xml"))
    return folder / "model.xml"


def write_model(repo: Path, name: str, config: str, **ir: object) -> Path:
    folder = repo / name
    save_ir(folder / "1", **ir)  # type: ignore[arg-type]
    (folder / "config.pbtxt").write_text(config)
    return folder


def write_onnx(repo: Path, name: str, config: str) -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(make_models.build_mlp(), str(folder / "1" / "model.onnx"))
    (folder / "config.pbtxt").write_text(config)
    return folder
