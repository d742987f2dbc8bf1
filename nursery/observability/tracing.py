"""Request tracing as Triton does it: settings, sampling, timestamps, and the trace file.

Settings (Triton's trace extension): ``trace_level`` (``OFF``, or any of ``TIMESTAMPS`` and
``TENSORS``), ``trace_rate`` (trace one request in N), ``trace_count`` (traces left to take,
-1 for no limit), ``log_frequency`` (write the file every N traces; 0: at shutdown),
``trace_file`` and ``trace_mode`` (``triton``). Global settings start from the command line;
a model may override any of them, the rest follow the global ones; clearing a setting
(``null``) falls back to the command line's value (global) or the global one (model).

A sampled request carries a :class:`Trace` (``InferenceRequest.trace``): the frontend, the
core and the instance worker stamp it at the stages of the house plan (``HTTP_RECV_START`` ...
``REQUEST_START``, ``QUEUE_START``, ``COMPUTE_START``, ``COMPUTE_INPUT_END``,
``COMPUTE_OUTPUT_START``, ``COMPUTE_END``, ``REQUEST_END`` ... ``HTTP_SEND_START``), each
``time.monotonic_ns()``, as Triton's steady-clock stamps. Finished traces go to their file in
Triton's JSON shape: for each trace one object with ``id``, ``model_name``, ``model_version``
(and ``request_id``), then one with its ``timestamps``, then one per traced tensor. As in
Triton, each settings holder buffers its own traces and writes them to ``file.N`` every
``log_frequency`` traces and once its ``trace_count`` is used up (and its traces are in);
what is left goes to ``file`` at shutdown.

A traced request's work may spawn child traces, as Triton's do: each step request of an
ensemble, and each BLS request a Python model makes with ``trace=request.trace()``. A child
has its own ``id`` and names its parent's (``parent_id`` in the file; in OpenTelemetry mode its
model span is a child of the parent's model span, in the same trace). Such requests are never
sampled on their own: a request that does not come from a frontend is traced only as a child.
What a request carries for that (``InferenceRequest.trace``) is a :class:`ChildOf` until the
model client spawns the child; a stub process sees its requests' traces as :class:`TraceLink`
(the id and the OpenTelemetry context), and its BLS requests name their parent by that id.

Untraced requests pay one attribute check; nothing here runs unless a level is on.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import threading
import time
import weakref
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from nursery.errors import InvalidArgument, Unsupported
from nursery.observability.otel import OtelExporter, OtelSettings

log = logging.getLogger("nursery.trace")

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
KEYS = ("trace_file", "trace_level", "trace_rate", "trace_count", "log_frequency", "trace_mode")


@dataclass(frozen=True)
class TraceSettings:
    trace_file: str = ""
    trace_level: tuple[str, ...] = ("OFF",)
    trace_rate: int = 1000
    trace_count: int = -1
    log_frequency: int = 0
    trace_mode: str = "triton"
    # --trace-config opentelemetry,<key>=<value> entries (start-up only, not in the extension)
    otel: tuple[tuple[str, str], ...] = ()

    @property
    def on(self) -> bool:
        return any(level != "OFF" for level in self.trace_level)

    @property
    def tensors(self) -> bool:
        return "TENSORS" in self.trace_level

    def to_json(self) -> dict[str, Any]:
        if self.trace_mode == "opentelemetry":  # Triton shows no file settings in this mode,
            # and its --trace-config opentelemetry,... entries (the exporter's) instead
            return {"trace_level": list(self.trace_level), "trace_rate": str(self.trace_rate),
                    "trace_count": str(self.trace_count), "trace_mode": self.trace_mode,
                    **dict(OtelSettings.reported(self.otel))}
        return {"trace_file": self.trace_file, "trace_level": list(self.trace_level),
                "trace_rate": str(self.trace_rate), "trace_count": str(self.trace_count),
                "log_frequency": str(self.log_frequency), "trace_mode": self.trace_mode}


def _one(key: str, value: Any) -> str:
    if isinstance(value, list):
        if len(value) != 1:
            raise InvalidArgument(f"expecting a single value for '{key}', got {len(value)}")
        value = value[0]
    if not isinstance(value, str):
        raise InvalidArgument(f"expecting a string for '{key}'")
    return value


def _int(key: str, value: Any, minimum: int) -> int:
    text = _one(key, value)
    try:
        number = int(text)
    except ValueError:
        raise InvalidArgument(f"Unable to parse '{key}', got: {text}") from None
    if number < minimum:
        raise InvalidArgument(f"'{key}' must be >= {minimum}, got: {text}")
    if number > _INT32_MAX:  # Triton reads them as C ints, and names its settings' range
        top = _INT32_MAX if key == "trace_count" else _UINT32_MAX
        raise InvalidArgument(f"Unable to parse '{key}', value is out of range [ {minimum}, "
                              f"{top} ], got: {text}")
    return number


_INT32_MAX = 2**31 - 1
_UINT32_MAX = 2**32 - 1


def parse_setting(key: str, value: Any) -> Any:
    """One setting from the extension's JSON (a string, or a list of strings) to its type."""
    if key == "trace_level":
        levels = value if isinstance(value, list) else [value]
        if not levels or not all(isinstance(v, str) for v in levels):
            raise InvalidArgument("expecting a list of strings for 'trace_level'")
        for level in levels:
            if level not in LEVELS:
                raise InvalidArgument(f"Unsupported trace level '{level}' (expected OFF, "
                                      "TIMESTAMPS or TENSORS)")
        chosen = tuple(dict.fromkeys(v for v in levels if v != "OFF"))
        return chosen or ("OFF",)
    if key == "trace_rate":  # 0: none by rate (OpenTelemetry mode still traces a request
        return _int(key, value, 0)  # that carries a context: Triton's way to ask only those)
    if key == "trace_count":
        return _int(key, value, -1)
    if key == "log_frequency":
        return _int(key, value, 0)
    if key == "trace_file":
        return _one(key, value)
    if key == "trace_mode":
        mode = _one(key, value)
        if mode not in ("triton", "opentelemetry"):
            raise InvalidArgument(f"unknown trace mode '{mode}' (expected triton or "
                                  "opentelemetry)")
        return mode
    raise InvalidArgument(f"unknown trace setting '{key}'")


# Triton's command line reads a trace level case-insensitively, with older spellings
# (TritonParser::ParseTraceLevelOption); the trace extension takes OFF, TIMESTAMPS and TENSORS
_COMMAND_LINE_LEVELS = {"false": "OFF", "off": "OFF", "true": "TIMESTAMPS", "on": "TIMESTAMPS",
                        "min": "TIMESTAMPS", "max": "TIMESTAMPS", "timestamps": "TIMESTAMPS",
                        "tensors": "TENSORS"}


def command_line_level(value: str) -> str:
    """A ``--trace-level`` / ``--trace-config level=`` value as a trace level (``MIN`` and
    ``MAX``, the deprecated spellings Triton's own qa scripts still pass, are TIMESTAMPS)."""
    level = _COMMAND_LINE_LEVELS.get(value.lower())
    if level is None:
        raise ValueError(f"invalid value for trace level option: {value.lower()}")
    return level


def settings_from_config(entries: tuple[str, ...]) -> TraceSettings:
    """``--trace-config`` entries (``[mode,]setting=value``) and the deprecated flags, as
    Triton reads them."""
    values: dict[str, Any] = {}
    levels: list[str] = []
    otel: list[tuple[str, str]] = []
    for entry in entries:
        mode, _, rest = entry.partition(",") if "," in entry else ("", "", entry)
        if mode and mode not in ("triton", "opentelemetry"):
            raise ValueError(f"unknown trace mode '{mode}' in --trace-config {entry}")
        key, sep, value = rest.partition("=")
        if not sep:
            raise ValueError(f"--trace-config expects <setting>=<value>, got '{entry}'")
        key = key.strip().replace("-", "_")
        if mode == "opentelemetry":
            otel.append((key, value))
            continue
        mapped = {"rate": "trace_rate", "level": "trace_level", "count": "trace_count",
                  "mode": "trace_mode", "file": "trace_file", "log_frequency": "log_frequency"}
        if key not in mapped:
            raise ValueError(f"unknown trace setting '{key}' in --trace-config {entry}")
        if mapped[key] == "trace_level":
            levels.append(command_line_level(value))
        else:
            try:
                values[mapped[key]] = parse_setting(mapped[key], value)
            except (InvalidArgument, Unsupported) as exc:
                raise ValueError(f"--trace-config {entry}: {exc.message}") from None
    if levels:
        try:
            values["trace_level"] = parse_setting("trace_level", levels)
        except InvalidArgument as exc:
            raise ValueError(f"--trace-config: {exc.message}") from None
    if otel or values.get("trace_mode") == "opentelemetry":
        OtelSettings.from_entries(otel)  # report bad settings (and OTEL_BSP_*) at the start
        values["otel"] = tuple(otel)
    return replace(TraceSettings(), **values)


@dataclass(frozen=True, slots=True)
class TraceLink:
    """A trace as a stub process sees it: the id its BLS requests name as their parent, and
    the OpenTelemetry context (``pb_utils.InferenceTrace.get_context()``; None in triton
    mode)."""

    id: int
    context: str | None = None


@dataclass(frozen=True, slots=True)
class ChildOf:
    """A request to be traced as a child of ``parent`` (a :class:`Trace`, or the
    :class:`TraceLink` a stub named): the model client spawns the child when it queues the
    request, naming the model it reached."""

    parent: Any


def child_of(trace: Any) -> ChildOf | bool:
    """What a request made for a traced request's work carries: its parent's trace (a
    :class:`Trace` or :class:`TraceLink`), else False (not traced, never sampled on its own,
    as Triton samples only at its frontends)."""
    return ChildOf(trace) if isinstance(trace, Trace | TraceLink) else False


def link(trace: Any) -> TraceLink | None:
    """What crosses to a stub process for a request's trace."""
    if isinstance(trace, Trace):
        return TraceLink(trace.id, trace.context())
    return trace if isinstance(trace, TraceLink) else None


class Trace:
    """The record of one sampled request (written by the trio thread and one instance
    thread, never at the same time: the request moves from one to the other)."""

    __slots__ = ("id", "model_name", "model_version", "request_id", "stamps", "tensors",
                 "traceparent", "parent_id", "otel_trace_id", "span_id", "parent_span_id",
                 "_sink", "_tensor_level", "_held", "_finished", "__weakref__")

    def __init__(self, trace_id: int, model_name: str, sink: Any, tensors: bool) -> None:
        self.id = trace_id
        self.model_name = model_name
        self.model_version = -1
        self.request_id = ""
        self.stamps: list[tuple[str, int]] = []
        self.tensors: list[dict[str, Any]] = []
        self.traceparent = ""  # W3C trace context from the client (OpenTelemetry mode)
        self.parent_id = 0  # a child trace's parent (0: a request from a frontend)
        # OpenTelemetry mode: the trace's id and its model span's id, chosen up front so that
        # the model can see its context and children can name their parent span before the
        # spans are exported (0: triton mode)
        self.otel_trace_id = 0
        self.span_id = 0
        self.parent_span_id = 0
        self._sink = sink
        self._tensor_level = tensors
        self._held = 0  # batches on an instance that carry the request
        self._finished = False

    def context(self) -> str | None:
        """The OpenTelemetry context of the request's span, as JSON (Triton's
        TRITONSERVER_InferenceTraceContext); None in triton mode."""
        if not self.span_id:
            return None
        return json.dumps({"traceparent":
                           f"00-{self.otel_trace_id:032x}-{self.span_id:016x}-01"})

    def stamp(self, name: str, ns: int | None = None) -> None:
        self.stamps.append((name, time.monotonic_ns() if ns is None else ns))

    def tensor(self, activity: str, name: str, datatype: str, array: Any) -> None:
        if not self._tensor_level:
            return
        flat = np.asarray(array).reshape(-1)
        if flat.dtype == object:
            data = ",".join(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
                            for v in flat.tolist())
        else:
            data = ",".join(str(v) for v in flat.tolist())
        self.tensors.append({"id": self.id, "activity": activity, "tensor": {
            "name": name, "data": data, "shape": ",".join(str(d) for d in np.shape(array)),
            "dtype": datatype}})

    def finish(self) -> None:
        """The request is done with, for whoever started the trace. While an instance still
        computes it (its client left), the trace goes to its sink when the instance is done,
        with the compute stamps, as Triton's lives until its request is released."""
        self._finished = True
        if not self._held:
            self._sink.add(self)

    def hold(self) -> None:
        """An instance took the request (trio thread)."""
        self._held += 1

    def release(self) -> None:
        """The instance is done with it (trio thread): a trace finished meanwhile goes now."""
        self._held -= 1
        if not self._held and self._finished:
            self._sink.add(self)

    def records(self) -> list[dict[str, Any]]:
        head: dict[str, Any] = {"id": self.id, "model_name": self.model_name,
                                "model_version": self.model_version}
        if self.request_id:
            head["request_id"] = self.request_id
        if self.parent_id:
            head["parent_id"] = self.parent_id
        out = [head, {"id": self.id, "timestamps": [{"name": n, "ns": ns}
                                                      for n, ns in self.stamps]}]
        return out + self.tensors


class _File:
    """One trace file: its indexed parts (``file.N``, numbered across every settings holder
    writing to it, as Triton's) and what goes to ``file`` itself at shutdown."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.index = itertools.count()
        self.final: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def write_indexed(self, records: list[dict[str, Any]]) -> None:
        with self.lock:
            name = f"{self.path}.{next(self.index)}"
        self._write(name, records)

    def keep(self, records: list[dict[str, Any]]) -> None:
        with self.lock:
            self.final.extend(records)

    def close(self) -> None:
        with self.lock:
            records, self.final = self.final, []
        if records:
            self._write(self.path, records)

    def _write(self, name: str, records: list[dict[str, Any]]) -> None:
        if not self.path:
            return  # tracing with no file: nothing to keep
        try:
            with open(name, "w") as f:  # compact, as Triton writes it (tools grep for it)
                json.dump(records, f, separators=(",", ":"))
        except OSError as exc:
            log.error("failed to write trace file '%s': %s", name, exc)


class _Sink:
    """Where the finished traces of one settings holder go (global, or a model's; a holder
    starts anew at each update of its settings, as Triton's): buffered, then written to an
    indexed part of the file every ``log_frequency`` traces, and as soon as its
    ``trace_count`` is used up and every trace it sampled has finished; what is left at
    shutdown goes to the file itself (to an indexed part with ``log_frequency``)."""

    def __init__(self, file: _File, log_frequency: int, sampler: _Sampler) -> None:
        self.file = file
        self.log_frequency = log_frequency
        self.sampler = sampler
        self.buffer: list[dict[str, Any]] = []
        self.traces = 0  # in the buffer
        self.lock = threading.Lock()  # traces finish on the trio thread; flush at shutdown

    def add(self, trace: Trace) -> None:
        with self.lock:
            self.buffer.extend(trace.records())
            if trace.parent_id:
                return  # a child is written with its request's trace, not counted apart
            self.traces += 1
            sampler = self.sampler
            sampler.collected += 1
            if ((sampler.remaining == 0 and sampler.collected == sampler.seen)
                    or (self.log_frequency and self.traces >= self.log_frequency)):
                records, self.buffer, self.traces = self.buffer, [], 0
            else:
                return
        self.file.write_indexed(records)

    def flush(self) -> None:
        with self.lock:
            records, self.buffer, self.traces = self.buffer, [], 0
        if records:
            if self.log_frequency:
                self.file.write_indexed(records)
            else:
                self.file.keep(records)


class _OtelSink:
    """Finished traces go to OpenTelemetry (``trace_mode`` opentelemetry)."""

    def __init__(self, exporter: Any) -> None:
        self.exporter = exporter

    def add(self, trace: Trace) -> None:
        try:
            self.exporter.export(trace)
        except Exception:
            log.exception("failed to export a trace to OpenTelemetry")

    def flush(self) -> None:
        self.exporter.close()


class _Sampler:
    """The counters of one settings holder (global, or a model with its own settings):
    requests seen while it had traces left to take, how many are left (-1: no limit), how
    many of its traces finished, and the buffer its traces go to."""

    __slots__ = ("seen", "remaining", "collected", "sink")

    def __init__(self, count: int) -> None:
        self.seen = 0
        self.remaining = count
        self.collected = 0  # its traces finished
        self.sink: _Sink | None = None


class TraceManager:
    """Global and per-model trace settings and the sampling decision (trio thread only)."""

    def __init__(self, startup: TraceSettings) -> None:
        self.startup = startup
        self.global_overrides: dict[str, Any] = {}
        self.model_overrides: dict[str, dict[str, Any]] = {}
        self._samplers: dict[str, _Sampler] = {}
        self._files: dict[str, _File] = {}
        self._sinks: list[_Sink] = []  # every holder's, retired ones too (flushed at close)
        self._ids = itertools.count(1)  # trace ids, children's included
        # the traces of requests in flight, by id: a stub's BLS request names its parent so
        self._live: weakref.WeakValueDictionary[int, Trace] = weakref.WeakValueDictionary()
        self.active = False
        self._otel: _OtelSink | None = None
        if startup.trace_mode == "opentelemetry":
            self._otel = _OtelSink(OtelExporter(OtelSettings.from_entries(list(startup.otel))))
        self._refresh()

    # -- settings ----------------------------------------------------------------------------

    def global_settings(self) -> TraceSettings:
        settings = replace(self.startup, **self.global_overrides)
        sampler = self._samplers.get("")
        if sampler is not None and settings.trace_count >= 0:
            settings = replace(settings, trace_count=sampler.remaining)
        return settings

    def settings(self, model: str = "") -> TraceSettings:
        base = self.global_settings()
        if not model or model not in self.model_overrides:
            return base
        settings = replace(base, **self.model_overrides[model])
        sampler = self._samplers.get(model)
        if sampler is not None and settings.trace_count >= 0:
            settings = replace(settings, trace_count=sampler.remaining)
        return settings

    def update(self, model: str, changes: dict[str, Any]) -> TraceSettings:
        """Apply the extension's update (``None`` clears a setting); all or nothing."""
        parsed: dict[str, Any] = {}
        for key, value in changes.items():
            if key not in KEYS:
                raise InvalidArgument(f"unknown trace setting '{key}'")
            if key == "trace_file" and value is not None:
                raise Unsupported("trace file location can not be updated through network "
                                  "protocol")
            if key == "trace_mode" and value is not None:
                raise Unsupported("trace mode can not be updated through network protocol")
            parsed[key] = None if value is None else parse_setting(key, value)
        target = self.global_overrides if not model else self.model_overrides.setdefault(model, {})
        if model and not changes:
            self.model_overrides.pop(model, None)  # an empty update clears the model's settings
        for key, value in parsed.items():
            if value is None:
                target.pop(key, None)
            else:
                target[key] = value
        if model and model in self.model_overrides and not self.model_overrides[model]:
            del self.model_overrides[model]
        # counts restart from the new settings; any update starts a new buffer, as Triton
        # replaces its setting object (traces in flight finish into the old one's)
        if "trace_count" in parsed or "trace_rate" in parsed or "trace_level" in parsed:
            self._samplers.pop(model, None)
        elif model in self._samplers:
            self._samplers[model].sink = None
        self._refresh()
        return self.settings(model)

    def _refresh(self) -> None:
        self.active = self.global_settings().on or any(
            self.settings(m).on for m in self.model_overrides)

    # -- sampling ----------------------------------------------------------------------------

    def start(self, model: str, traceparent: str = "") -> Trace | None:
        """A new trace for this request of ``model`` when the settings sample it. In
        OpenTelemetry mode a request that carries a ``traceparent`` is always traced."""
        if not self.active:
            return None
        owner = model if model in self.model_overrides else ""
        settings = self.settings(owner)
        if not settings.on:
            return None
        forced = bool(traceparent) and self._otel is not None
        sampler = self._samplers.get(owner)
        if sampler is None:
            sampler = self._samplers[owner] = _Sampler(settings.trace_count)
        if not forced:
            if sampler.remaining == 0 or not settings.trace_rate:
                return None
            sampler.seen += 1
            if sampler.seen % settings.trace_rate:
                return None
            if sampler.remaining > 0:
                sampler.remaining -= 1
        sink: Any = self._otel
        if sink is None:
            sink = sampler.sink
            if sink is None:
                file = self._files.get(settings.trace_file)
                if file is None:
                    file = self._files[settings.trace_file] = _File(settings.trace_file)
                sink = sampler.sink = _Sink(file, settings.log_frequency, sampler)
                self._sinks.append(sink)
        trace = Trace(next(self._ids), model, sink, settings.tensors)
        trace.traceparent = traceparent if forced else ""
        if self._otel is not None:
            trace.otel_trace_id = _traceparent_id(trace.traceparent) or _random_id(128)
            trace.span_id = _random_id(64)
        self._live[trace.id] = trace
        return trace

    def spawn(self, request: ChildOf, model: str) -> Trace | bool:
        """The child trace of a request made for a traced request's work (an ensemble step,
        a BLS call), reaching ``model``; False when its parent is no longer in flight."""
        parent = request.parent
        if isinstance(parent, TraceLink):
            parent = self._live.get(parent.id)
        if not isinstance(parent, Trace):
            return False
        trace = Trace(next(self._ids), model, parent._sink, parent._tensor_level)
        trace.parent_id = parent.id
        if parent.span_id:
            trace.otel_trace_id = parent.otel_trace_id
            trace.span_id = _random_id(64)
            trace.parent_span_id = parent.span_id
        self._live[trace.id] = trace
        return trace

    def close(self) -> None:
        """Write what is buffered (at shutdown)."""
        for sink in self._sinks:
            sink.flush()
        for file in self._files.values():
            file.close()
        if self._otel is not None:
            self._otel.flush()


# span and trace ids from a generator of the tracer's own: the process's global one is the
# user's (an embedding program that seeds it for its own ends must not make the server's ids
# repeat, nor see its sequence move under it while the server traces)
_IDS = random.Random()


def _random_id(bits: int) -> int:
    return _IDS.getrandbits(bits) or 1  # 0 is not a valid OpenTelemetry id


def _traceparent_id(traceparent: str) -> int:
    """The trace id of a W3C ``traceparent`` (``00-<32 hex>-<16 hex>-<2 hex>``), 0 if none."""
    parts = traceparent.split("-")
    if len(parts) >= 3 and len(parts[1]) == 32:
        try:
            return int(parts[1], 16)
        except ValueError:
            return 0
    return 0


__all__ = ["TraceManager", "TraceSettings", "Trace", "TraceLink", "ChildOf", "child_of", "link",
           "settings_from_config", "KEYS"]
