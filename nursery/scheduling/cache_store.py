"""The response cache's pure parts: the request key and a byte-budgeted LRU store.

The key is a BLAKE2b-256 digest of everything that changes an answer: model name and version,
every input's name, datatype, shape and bytes (inputs in name order, so the order a client
lists them in does not matter), and the requested outputs with their classification counts.
Triton uses a 64-bit hash; 256 bits make a collision no practical concern.

:class:`LruStore` never holds more than its budget: an entry's size is its outputs' bytes plus
the key and a fixed overhead; an entry larger than the whole budget is never stored; inserting
evicts the least recently used entries until the new one fits. No trio, no clock: the
ResponseCache actor owns one and moves messages.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from nursery.types import InferenceRequest, InferenceResponse, Tensor

ENTRY_OVERHEAD = 128  # bytes charged per entry on top of its data (bookkeeping, key)


def _tensor_bytes(array: np.ndarray) -> bytes | memoryview:
    if array.dtype == object:  # BYTES: length-prefixed elements, as on the wire
        parts = []
        for item in array.reshape(-1).tolist():
            data = item if isinstance(item, bytes) else str(item).encode()
            parts.append(struct.pack("<I", len(data)))
            parts.append(data)
        return b"".join(parts)
    return np.ascontiguousarray(array).data.cast("B")


def request_key(model: str, version: int | str, request: InferenceRequest) -> bytes:
    h = hashlib.blake2b(digest_size=32)

    def text(value: str) -> None:
        data = value.encode()
        h.update(struct.pack("<I", len(data)))
        h.update(data)

    text(model)
    text(str(version))
    h.update(struct.pack("<I", len(request.inputs)))
    for name in sorted(request.inputs):
        tensor = request.inputs[name]
        text(name)
        text(tensor.datatype.value)
        h.update(struct.pack(f"<I{len(tensor.shape)}q", len(tensor.shape), *tensor.shape))
        data = _tensor_bytes(tensor.data)
        h.update(struct.pack("<Q", len(data)))
        h.update(data)
    outputs = sorted((o.name, o.classification) for o in request.requested_outputs)
    h.update(struct.pack("<I", len(outputs)))
    for name, classes in outputs:
        text(name)
        h.update(struct.pack("<i", classes))
    return h.digest()


def tensor_size(tensor: Tensor) -> int:
    array = tensor.data
    if array.dtype == object:
        return sum(4 + (len(x) if isinstance(x, bytes) else len(str(x).encode()))
                   for x in array.reshape(-1).tolist())
    return int(array.nbytes)


def entry_size(key: bytes, response: InferenceResponse) -> int:
    return ENTRY_OVERHEAD + len(key) + sum(tensor_size(t) for t in response.outputs)


def frozen_copy(response: InferenceResponse) -> InferenceResponse:
    """What the cache keeps: its own read-only copies of the outputs (the caller's arrays may
    be views into buffers that change later)."""
    outputs = []
    for t in response.outputs:
        data = np.array(t.data, copy=True)
        data.setflags(write=False)
        outputs.append(Tensor(t.name, t.datatype, t.shape, data))
    return InferenceResponse(response.model_name, response.model_version, outputs, "",
                             dict(response.parameters))


@dataclass(frozen=True, slots=True)
class CacheTotals:
    """Server-wide figures of the cache (Triton's ``nv_cache_*`` gauges)."""

    entries: int = 0
    bytes_used: int = 0
    budget: int = 0
    lookups: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    inserts: int = 0
    lookup_ns: int = 0
    insert_ns: int = 0

    @property
    def utilization(self) -> float:
        return self.bytes_used / self.budget if self.budget else 0.0


class LruStore:
    """Key -> (response, size), least recently used first; ``used`` <= ``budget`` always."""

    def __init__(self, budget: int) -> None:
        if budget < 0:
            raise ValueError("the cache budget must be >= 0")
        self.budget = budget
        self.used = 0
        self.evictions = 0
        self._entries: OrderedDict[bytes, tuple[Any, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: bytes) -> bool:
        return key in self._entries

    def keys(self) -> list[bytes]:
        """Least recently used first."""
        return list(self._entries)

    def get(self, key: bytes) -> Any | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: bytes, value: Any, size: int) -> bool:
        """Store ``value``; False (and nothing changes) when it can never fit."""
        if size > self.budget:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.used -= old[1]
        while self.used + size > self.budget:
            _, (_, evicted) = self._entries.popitem(last=False)
            self.used -= evicted
            self.evictions += 1
        self._entries[key] = (value, size)
        self.used += size
        return True

    def clear(self) -> None:
        self._entries.clear()
        self.used = 0


def parse_cache_config(entries: list[str]) -> int | None:
    """``--cache-config local,size=BYTES`` (Triton's syntax, repeatable): the local cache's
    byte budget, or None when no cache is configured. Raises ValueError with a message."""
    size: int | None = None
    for entry in entries:
        impl, sep, setting = entry.partition(",")
        if not sep:
            raise ValueError(f"--cache-config expects <cache>,<key>=<value>, got '{entry}'")
        if impl != "local":
            raise ValueError(f"cache implementation '{impl}' is not available in this server; "
                             "use 'local'")
        key, sep, value = setting.partition("=")
        if not sep or key != "size":
            raise ValueError(f"unknown setting '{setting}' for the local cache (expected "
                             "size=<bytes>)")
        try:
            size = int(value)
        except ValueError:
            raise ValueError(f"--cache-config local,size expects a number of bytes, got "
                             f"'{value}'") from None
        if size < 0:
            raise ValueError("--cache-config local,size must be >= 0")
    return size
