"""Triton's tables of platforms, backends and default model files, and backend detection."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

# platform -> backend name, and the default model file of each, as Triton fills them in.
PLATFORM_TO_BACKEND = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "torch_aoti": "pytorch",  # an AOTInductor package (model.pt2) on the PyTorch backend
    "tensorrt_plan": "tensorrt",
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
}
# the platform a backend implies; tensorflow has two, told apart by the model file
# (tensorflow_platform)
BACKEND_TO_PLATFORM = {"onnxruntime": "onnxruntime_onnx", "pytorch": "pytorch_libtorch",
                       "tensorrt": "tensorrt_plan"}
# a platform's own default model file, where its backend has several
PLATFORM_FILENAMES = {"tensorflow_savedmodel": "model.savedmodel",
                      "tensorflow_graphdef": "model.graphdef", "torch_aoti": "model.pt2"}
AOTI_FILENAME = PLATFORM_FILENAMES["torch_aoti"]
DEFAULT_FILENAMES = {
    "onnxruntime": "model.onnx",
    "pytorch": "model.pt",
    "tensorrt": "model.plan",
    "python": "model.py",
    "openvino": "model.xml",
    "tensorflow": "model.savedmodel",
}
# a ``default_model_filename``'s suffix -> the backend that reads such a file
SUFFIX_TO_BACKEND = {".onnx": "onnxruntime", ".pt": "pytorch", ".pt2": "pytorch",
                     ".plan": "tensorrt", ".py": "python", ".xml": "openvino",
                     ".savedmodel": "tensorflow", ".graphdef": "tensorflow"}


def detect_backend(version_paths: Sequence[Path]) -> str | None:
    """The backend whose default model file is present in a version folder, if any."""
    for path in version_paths:
        for backend, filename in DEFAULT_FILENAMES.items():
            if (path / filename).exists():
                return backend
        if (path / PLATFORM_FILENAMES["tensorflow_graphdef"]).exists():
            return "tensorflow"
    return None


def tensorflow_platform(model_filename: str, version_paths: Sequence[Path]) -> str:
    """A ``backend: "tensorflow"`` model's platform, as Triton tells it: from the model file's
    name, else from which default file the version folders hold (SavedModel first)."""
    if model_filename:
        return ("tensorflow_graphdef" if model_filename.endswith(".graphdef")
                else "tensorflow_savedmodel")
    for path in version_paths:
        if (path / PLATFORM_FILENAMES["tensorflow_savedmodel"]).exists():
            return "tensorflow_savedmodel"
        if (path / PLATFORM_FILENAMES["tensorflow_graphdef"]).exists():
            return "tensorflow_graphdef"
    return "tensorflow_savedmodel"
