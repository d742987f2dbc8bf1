"""Triton's tables of platforms, backends and default model files, and backend detection."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

# platform -> backend name, and the default model file of each, as Triton fills them in.
PLATFORM_TO_BACKEND = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorrt_plan": "tensorrt",
}
BACKEND_TO_PLATFORM = {v: k for k, v in PLATFORM_TO_BACKEND.items()}
DEFAULT_FILENAMES = {
    "onnxruntime": "model.onnx",
    "pytorch": "model.pt",
    "tensorrt": "model.plan",
    "python": "model.py",
    "openvino": "model.xml",
}
# a ``default_model_filename``'s suffix -> the backend that reads such a file
SUFFIX_TO_BACKEND = {".onnx": "onnxruntime", ".pt": "pytorch", ".pt2": "pytorch",
                     ".plan": "tensorrt", ".py": "python", ".xml": "openvino"}


def detect_backend(version_paths: Sequence[Path]) -> str | None:
    """The backend whose default model file is present in a version folder, if any."""
    for path in version_paths:
        for backend, filename in DEFAULT_FILENAMES.items():
            if (path / filename).exists():
                return backend
    return None
