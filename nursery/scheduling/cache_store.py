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
import json
import os
import re
import struct
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from nursery.errors import NurseryError
from nursery.types import (
    DataType,
    InferenceRequest,
    InferenceResponse,
    Tensor,
    tensor_from_bytes,
    tensor_to_bytes,
)

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


# -- a response as a Redis hash ---------------------------------------------------------------

_ENTRY_FORMAT = b"nursery-1"


def redis_key(key: bytes) -> bytes:
    """A request key as the Redis cache names it: its hex digest (readable in redis-cli)."""
    return key.hex().encode()


def entry_fields(response: InferenceResponse) -> dict[bytes, bytes]:
    """A cached answer as the fields of one Redis hash (Triton's Redis cache keeps each entry
    as a hash too): the outputs' names, datatypes, shapes and wire bytes, and the answer's
    model, version and parameters."""
    fields: dict[bytes, bytes] = {
        b"format": _ENTRY_FORMAT,
        b"model": response.model_name.encode(),
        b"version": str(response.model_version).encode(),
        b"parameters": json.dumps(response.parameters, separators=(",", ":")).encode(),
        b"outputs": str(len(response.outputs)).encode(),
    }
    for i, t in enumerate(response.outputs):
        fields[b"%d.name" % i] = t.name.encode()
        fields[b"%d.datatype" % i] = t.datatype.value.encode()
        fields[b"%d.shape" % i] = ",".join(str(d) for d in t.shape).encode()
        fields[b"%d.data" % i] = bytes(tensor_to_bytes(t.data, t.datatype))
    return fields


def response_from_fields(fields: Mapping[bytes, bytes]) -> InferenceResponse:
    """The answer :func:`entry_fields` stored, its arrays read-only; ValueError for a hash
    that is not one (another program's key, a damaged entry)."""
    try:
        if fields.get(b"format") != _ENTRY_FORMAT:
            raise ValueError("not an entry of this server's response cache")
        outputs = []
        for i in range(int(fields[b"outputs"])):
            name = fields[b"%d.name" % i].decode()
            datatype = DataType.from_protocol(fields[b"%d.datatype" % i].decode())
            text = fields[b"%d.shape" % i].decode()
            shape = tuple([int(d) for d in text.split(",")]) if text else ()
            data = tensor_from_bytes(fields[b"%d.data" % i], datatype, shape, name)
            data.setflags(write=False)
            outputs.append(Tensor(name, datatype, shape, data))
        parameters = json.loads(fields[b"parameters"])
        if not isinstance(parameters, dict):
            raise ValueError("parameters are not an object")
        return InferenceResponse(fields[b"model"].decode(), fields[b"version"].decode(),
                                 outputs, "", parameters)
    except (KeyError, UnicodeDecodeError, NurseryError) as exc:
        raise ValueError(f"a damaged cache entry ({type(exc).__name__}: {exc})") from None


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


@dataclass(frozen=True, slots=True)
class RedisOptions:
    """``--cache-config redis,<key>=<value>``: where Triton's Redis cache connects, with its
    defaults (times in milliseconds, 0 waits forever; ``pool_size`` connections, a command
    waiting ``wait_timeout`` for a free one)."""

    host: str
    port: int
    user: str = ""
    password: str = ""
    db: int = 0
    connect_timeout: int = 0
    socket_timeout: int = 0
    pool_size: int = 1
    wait_timeout: int = 1000
    tls_enabled: bool = False
    cert: str = ""
    key: str = ""
    cacert: str = ""
    cacert_dir: str = ""
    sni: str = ""
    ignored: tuple[str, ...] = ()  # settings Triton's Redis cache does not read either

    def __repr__(self) -> str:  # never the password
        return (f"RedisOptions(host={self.host!r}, port={self.port}, user={self.user!r}, "
                f"db={self.db}, pool_size={self.pool_size}, tls_enabled={self.tls_enabled})")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The one response cache a server runs: ``local`` (``size`` bytes in this process) or
    ``redis`` (``redis`` says where)."""

    name: str
    size: int = 0
    redis: RedisOptions | None = None


REDIS_USERNAME_ENV = "TRITONCACHE_REDIS_USERNAME"
REDIS_PASSWORD_ENV = "TRITONCACHE_REDIS_PASSWORD"
_REDIS_KEYS = frozenset({"host", "port", "user", "password", "db", "connect_timeout",
                         "socket_timeout", "pool_size", "wait_timeout", "tls_enabled", "cert",
                         "key", "cacert", "cacert_dir", "sni"})


def _split_cache_entry(entry: str) -> tuple[str, str, str]:
    """``<cache>,<setting>=<value>``, as tritonserver splits it (the value may hold '=' and
    ','), or ValueError in its words."""
    name, comma, rest = entry.partition(",")
    if not comma or not name:
        raise ValueError("No cache specified. --cache-config option format is "
                         f"<cache name>,<setting>=<value>. Got {entry}")
    setting, equals, value = rest.partition("=")
    if not equals or not setting or not value:
        raise ValueError("--cache-config option format is '<cache name>,<setting>=<value>'. "
                         f"Got {entry}")
    return name, setting, value


def _atoi(text: str) -> int:
    """C's atoi, which Triton's Redis cache reads its numbers with: the leading digits (with
    a sign), 0 when there are none (``port=nonexistent`` is port 0, refused on connect)."""
    match = re.match(r"\s*([+-]?\d+)", text)
    return int(match.group(1)) if match else 0


def redis_options(settings: dict[str, str],
                  environ: Mapping[str, str] | None = None) -> RedisOptions:
    """The Redis cache's settings (the last of a repeated key wins). The user and password
    come from ``TRITONCACHE_REDIS_USERNAME`` / ``TRITONCACHE_REDIS_PASSWORD`` unless given
    here. ValueError when host or port is missing, in Triton's words; other settings it
    does not know are kept in ``ignored`` (Triton ignores them; the cache logs them)."""
    if "host" not in settings or "port" not in settings:
        raise ValueError(
            "Failed to initialize RedisCache, didn't specify address. Must at a minimum "
            "specify 'host' and 'port' in the configuration - e.g. tritonserver "
            "--cache-config redis,host=redis --cache-config redis,port=6379 "
            "--model-repository=/models ...")
    env = os.environ if environ is None else environ
    tls = settings.get("tls_enabled") == "true"
    return RedisOptions(
        host=settings["host"], port=_atoi(settings["port"]),
        user=settings.get("user", env.get(REDIS_USERNAME_ENV, "")),
        password=settings.get("password", env.get(REDIS_PASSWORD_ENV, "")),
        db=_atoi(settings.get("db", "0")),
        connect_timeout=max(0, _atoi(settings.get("connect_timeout", "0"))),
        socket_timeout=max(0, _atoi(settings.get("socket_timeout", "0"))),
        pool_size=max(1, _atoi(settings.get("pool_size", "1"))),
        wait_timeout=max(0, _atoi(settings.get("wait_timeout", "1000"))),
        tls_enabled=tls,
        cert=settings.get("cert", "") if tls else "",
        key=settings.get("key", "") if tls else "",
        cacert=settings.get("cacert", "") if tls else "",
        cacert_dir=settings.get("cacert_dir", "") if tls else "",
        sni=settings.get("sni", "") if tls else "",
        ignored=tuple(sorted(set(settings) - _REDIS_KEYS)))


def parse_cache_config(entries: list[str], byte_size: int | None = None,
                       environ: Mapping[str, str] | None = None) -> CacheConfig | None:
    """``--cache-config <cache>,<setting>=<value>`` (Triton's syntax, repeatable) and the
    deprecated ``--response-cache-byte-size`` (``byte_size``): the cache to run, or None
    when none is configured. Raises ValueError with Triton's message: both flags, two
    caches, a malformed entry, a Redis cache without host and port."""
    if entries and byte_size is not None:
        raise ValueError("Error: Incompatible flags --response-cache-byte-size and "
                         "--cache-config both provided. Please provide one or the other.")
    if byte_size is not None:
        entries = [f"local,size={byte_size}"]
    caches: dict[str, dict[str, str]] = {}
    for entry in entries:
        name, setting, value = _split_cache_entry(entry)
        caches.setdefault(name, {})[setting] = value
    if not caches:
        return None
    if len(caches) > 1:
        raise ValueError("found multiple cache configurations, but only a single cache is "
                         "currently supported")
    ((name, settings),) = caches.items()
    if name == "redis":
        return CacheConfig("redis", redis=redis_options(settings, environ))
    if name != "local":
        raise ValueError(f"cache implementation '{name}' is not available in this server; "
                         "use 'local' or 'redis'")
    unknown = sorted(set(settings) - {"size"})
    if unknown:
        raise ValueError(f"unknown setting '{unknown[0]}' for the local cache (expected "
                         "size=<bytes>)")
    if "size" not in settings:
        raise ValueError("--cache-config local expects size=<bytes>")
    try:
        size = int(settings["size"])
    except ValueError:
        raise ValueError(f"--cache-config local,size expects a number of bytes, got "
                         f"'{settings['size']}'") from None
    if size < 0:
        raise ValueError("--cache-config local,size must be >= 0")
    return CacheConfig("local", size=size)
