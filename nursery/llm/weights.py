"""Weight files: safetensors read and written with numpy (the format is an 8-byte header
length, a JSON header naming each tensor's dtype, shape and byte range, then the bytes), and
Triton's ``multi_lora.json`` with PEFT-layout adapter folders."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64,
           "I32": np.int32, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


class WeightsError(ValueError):
    """A weight file or an adapter that cannot be used, with the file named."""


def save_safetensors(path: str | Path, tensors: dict[str, np.ndarray],
                     metadata: dict[str, str] | None = None) -> None:
    header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    blobs = []
    for name, array in tensors.items():
        data = np.ascontiguousarray(array)
        blob = data.tobytes()
        header[name] = {"dtype": _NAMES[data.dtype], "shape": list(data.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for blob in blobs:
            f.write(blob)


def load_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    try:
        raw = Path(path).read_bytes()
        (size,) = struct.unpack("<Q", raw[:8])
        if size > len(raw) - 8:
            raise WeightsError(f"{path}: header of {size} bytes in a file of {len(raw)}")
        header = json.loads(raw[8:8 + size])
        body = memoryview(raw)[8 + size:]
        out = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            dtype = np.dtype(_DTYPES[info["dtype"]])
            shape = tuple(int(d) for d in info["shape"])
            if not 0 <= begin <= end <= len(body) or \
                    end - begin != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
                raise WeightsError(f"{path}: tensor {name!r} has a bad byte range")
            out[name] = np.frombuffer(body[begin:end], dtype=dtype).reshape(shape)
        return out
    except WeightsError:
        raise
    except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
        raise WeightsError(f"cannot read {path}: {exc!r}") from exc


@dataclass(frozen=True)
class Adapter:
    """One LoRA adapter: for each target module, A [r, in] and B [out, r], and the scale
    (lora_alpha / r) its delta ``scale * x @ A.T @ B.T`` is multiplied by."""

    name: str
    scale: float
    rank: int
    modules: dict[str, tuple[np.ndarray, np.ndarray]]


def read_multi_lora(version_dir: str | Path) -> dict[str, Path]:
    """Triton's ``multi_lora.json`` (its vLLM backend's format: ``{"name": "path"}``), a
    relative path taken from the version folder; {} when the file is absent."""
    path = Path(version_dir) / "multi_lora.json"
    if not path.exists():
        return {}
    try:
        listing = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise WeightsError(f"cannot read {path}: {exc}") from exc
    if not isinstance(listing, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in listing.items()):
        raise WeightsError(f"{path}: expected an object of adapter name -> folder")
    return {name: (Path(version_dir) / folder) for name, folder in listing.items()}


def load_adapter(name: str, folder: Path, prefix: str = "base_model.model.") -> Adapter:
    """A PEFT adapter folder: ``adapter_config.json`` (``r``, ``lora_alpha``) and
    ``adapter_model.safetensors`` with ``<prefix><module>.lora_A.weight`` / ``lora_B``."""
    try:
        config = json.loads((folder / "adapter_config.json").read_text())
        rank, alpha = int(config["r"]), float(config.get("lora_alpha", config["r"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WeightsError(f"LoRA '{name}': cannot read {folder / 'adapter_config.json'}: "
                           f"{exc!r}") from exc
    tensors = load_safetensors(folder / "adapter_model.safetensors")
    modules: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for key, a in tensors.items():
        if not key.endswith(".lora_A.weight"):
            continue
        module = key[: -len(".lora_A.weight")].removeprefix(prefix)
        b = tensors.get(key.replace(".lora_A.", ".lora_B."))
        if b is None or a.ndim != 2 or b.ndim != 2 or a.shape[0] != rank or b.shape[1] != rank:
            raise WeightsError(f"LoRA '{name}': {key} has no matching lora_B of rank {rank}")
        modules[module] = (a.astype(np.float32), b.astype(np.float32))
    if not modules:
        raise WeightsError(f"LoRA '{name}': no lora_A/lora_B weights in {folder}")
    return Adapter(name, alpha / rank, rank, modules)
