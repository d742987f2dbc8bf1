"""What the GPU-only parts do where they cannot run: a clear reason, nothing imported early."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nursery.backends import tensorrt
from nursery.backends.base import get_factory
from nursery.config.model import read_model_config
from nursery.errors import ConfigError, InvalidArgument
from nursery.runtime.devices import InstancePlacement
from nursery.shm import cuda as cuda_shm
from tests.conftest import make_models


def _trt_model(tmp_path: Path) -> Path:
    config = make_models.config_text("plan", [("INPUT0", "FP32", [4])],
                                     [("OUTPUT0", "FP32", [4])], 8).replace(
        'platform: "onnxruntime_onnx"', 'platform: "tensorrt_plan"')
    (tmp_path / "plan" / "1").mkdir(parents=True)
    (tmp_path / "plan" / "1" / "model.plan").write_bytes(b"not an engine")
    (tmp_path / "plan" / "config.pbtxt").write_text(config)
    return tmp_path / "plan"


def test_tensorrt_on_a_cpu_instance_is_refused(tmp_path: Path) -> None:
    folder = _trt_model(tmp_path)
    config, _ = read_model_config(folder, "plan", backends=get_factory)
    with pytest.raises(ConfigError, match="TensorRT engines run only on a GPU"):
        tensorrt.FACTORY.load(config, folder / "1", InstancePlacement("g", 0, "cpu", 0))


def test_tensorrt_without_the_package_says_so(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _trt_model(tmp_path)
    config, _ = read_model_config(folder, "plan", backends=get_factory)
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import fails, as without the package
    with pytest.raises(ConfigError, match="needs the 'tensorrt' and 'cupy-cuda12x' packages"):
        tensorrt.FACTORY.load(config, folder / "1", InstancePlacement("g", 0, "gpu", 0))


def test_cuda_region_without_cupy_is_tritons_invalid_args(monkeypatch: pytest.MonkeyPatch) -> None:
    """As Triton's GPU build answers where no device can open the handle (L0_grpc's
    test_register_cuda_shared_memory), the reason after Triton's words."""
    monkeypatch.setitem(sys.modules, "cupy", None)
    cuda_shm._cupy.cache_clear()
    try:
        assert not cuda_shm.available()
        with pytest.raises(InvalidArgument, match=r"^failed to register shared memory region: "
                           r"invalid args \(CUDA shared memory is not available"):
            cuda_shm.CudaRegion("r", b"\0" * 64, 0, 64)
    finally:
        cuda_shm._cupy.cache_clear()


def test_no_gpu_package_is_imported_by_serving_cpu_models() -> None:
    code = ("import sys, nursery.server, nursery.backends.onnxruntime, nursery.backends.pytorch, "
            "nursery.backends.tensorrt, nursery.shm.system, nursery.shm.cuda; "
            "print(sorted(m for m in ('torch', 'tensorrt', 'cupy', 'pynvml') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
