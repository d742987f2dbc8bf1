"""OpenTelemetry trace mode (``--trace-config mode=opentelemetry``), as Triton exports it.

Each finished :class:`~nursery.observability.tracing.Trace` becomes three spans sent over OTLP/HTTP: a top
level span ``InferRequest`` (receive to send, with the frontend's stamps as events), a model
span named after the model (``REQUEST_START`` to ``REQUEST_END``, with ``QUEUE_START``), and a
``compute`` span (``COMPUTE_START`` to ``COMPUTE_END``, with the input-end and output-start
stamps). Each carries ``triton.model_name``, ``triton.model_version`` and
``triton.request_id`` attributes. Stamps are taken on the monotonic clock and moved to the
wall clock once, when the exporter starts. A ``traceparent`` header on the request makes the
top span a child of the caller's span (context propagation). A child trace (an ensemble
step, a BLS request made with ``trace=request.trace()``) has no top span: its model span is a
child of its parent's model span, in the parent's trace. The ids of a trace and of its model
span are chosen when the trace starts (the model may ask for its context, a child names its
parent span), and given to the SDK as the spans are made.

Settings (``--trace-config opentelemetry,<key>=<value>``): ``url`` (default
``http://localhost:4318/v1/traces``), ``resource`` (``key=value``, repeatable; default
``service.name=triton-inference-server``), ``bsp_max_queue_size`` (2048),
``bsp_schedule_delay`` (5000 ms), ``bsp_max_export_batch_size`` (512). The trace extension
shows them beside the other settings, which it updates as in triton mode (rate, level, count).

The OpenTelemetry SDK and its OTLP/HTTP exporter are optional (the ``otel`` extra) and
imported only in this mode; the SDK's batch span processor exports from its own thread.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("nursery.trace")

_FRONTEND = ("HTTP_RECV_START", "HTTP_RECV_END", "GRPC_WAITREAD_START", "GRPC_WAITREAD_END",
             "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END", "GRPC_SEND_START",
             "GRPC_SEND_END")

_BSP = ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size")


@dataclass(frozen=True)
class OtelSettings:
    url: str = "http://localhost:4318/v1/traces"
    resource: tuple[tuple[str, str], ...] = field(
        default_factory=lambda: (("service.name", "triton-inference-server"),))
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay: int = 5000
    bsp_max_export_batch_size: int = 512

    @property
    def endpoint(self) -> str:
        """Where spans go: ``url``, read as http when it names no scheme (Triton's exporter
        takes ``localhost:4318/v1/traces`` as it is; the settings report it as given)."""
        return self.url if "://" in self.url else f"http://{self.url}"

    @staticmethod
    def reported(entries: tuple[tuple[str, str], ...]) -> list[tuple[str, str]]:
        """The settings as the trace extension shows them (Triton's): the command line's
        entries as given, then the batch span processor's defaults it did not set (a key
        given twice, ``resource``, shows its last value, as a JSON reader sees Triton's)."""
        given = {key for key, _ in entries}
        defaults = OtelSettings()
        return [*entries, *((key, str(getattr(defaults, key))) for key in _BSP
                            if key not in given)]

    @classmethod
    def from_entries(cls, entries: list[tuple[str, str]],
                     env: Mapping[str, str] | None = None) -> OtelSettings:
        """The settings of ``--trace-config opentelemetry,...`` entries; a batch span
        processor setting they leave out comes from ``OTEL_BSP_*`` in ``env`` (the
        process's environment by default), as in Triton. A value that is not a number is
        refused in Triton's words ('Bad option: "OTEL_BSP_MAX_QUEUE_SIZE".')."""
        env = os.environ if env is None else env
        given = {key for key, _ in entries}
        for key in _BSP:
            name = f"OTEL_{key.upper()}"
            if key not in given and name in env:
                if not _uint32(env[name]):
                    raise ValueError(f'Bad option: "{name}".\nInvalid argument - '
                                     f"'{env[name]}' is not an unsigned 32-bit integer")
                entries = [*entries, (key, env[name])]
        values: dict[str, Any] = {}
        resource: list[tuple[str, str]] = []
        for key, value in entries:
            if key == "url":
                values["url"] = value
            elif key == "resource":
                k, sep, v = value.partition("=")
                if not sep:
                    raise ValueError(f"opentelemetry,resource expects key=value, got '{value}'")
                resource.append((k, v))
            elif key in _BSP:
                if not _uint32(value):
                    raise ValueError(f'Bad option: "--trace-config opentelemetry,{key}".\n'
                                     f"Invalid argument - '{value}' is not an unsigned 32-bit "
                                     "integer")
                values[key] = int(value)
            else:
                raise ValueError(f"unknown opentelemetry trace setting '{key}'")
        if resource:
            values["resource"] = tuple(resource)
        return cls(**values)


def _uint32(text: str) -> bool:
    return text.strip().isdigit() and int(text) < 2**32


class OtelExporter:
    """Turns finished traces into spans and hands them to the SDK's batch processor."""

    def __init__(self, settings: OtelSettings) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError as exc:
            raise ValueError("--trace-config mode=opentelemetry needs the OpenTelemetry SDK and "
                             "its OTLP/HTTP exporter: pip install 'nursery[otel]'") from exc
        self.ids = _chosen_ids()
        self.provider = TracerProvider(resource=Resource.create(dict(settings.resource)),
                                       id_generator=self.ids)
        # Triton's (C++) SDK takes what the Python SDK refuses: a delay of 0 (its worker then
        # never waits; here 1 ms) and a batch larger than the queue (a batch is then at most
        # the queue)
        self.provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=settings.endpoint),
            max_queue_size=settings.bsp_max_queue_size,
            schedule_delay_millis=settings.bsp_schedule_delay or 1,
            max_export_batch_size=min(settings.bsp_max_export_batch_size,
                                      settings.bsp_max_queue_size)))
        _say_dropped_as_triton()
        self.tracer = self.provider.get_tracer("nursery")
        self.propagator = TraceContextTextMapPropagator()
        self.offset = time.time_ns() - time.monotonic_ns()  # monotonic -> wall clock
        log.info("OpenTelemetry tracing: exporting to %s", settings.url)

    def export(self, trace: Any) -> None:
        with self.ids.lock:
            self._export(trace)

    def _export(self, trace: Any) -> None:
        from opentelemetry import trace as otel

        if not trace.stamps:
            return
        at = {name: ns + self.offset for name, ns in trace.stamps}
        first = min(at.values())
        last = max(at.values())
        attrs = {"triton.model_name": trace.model_name,
                 "triton.model_version": int(trace.model_version),
                 "triton.request_id": trace.request_id}
        top = None
        if trace.parent_span_id:  # a child: under its parent's model span
            model_parent = otel.set_span_in_context(otel.NonRecordingSpan(otel.SpanContext(
                trace.otel_trace_id, trace.parent_span_id, is_remote=False,
                trace_flags=otel.TraceFlags(otel.TraceFlags.SAMPLED))))
        else:
            parent = None
            if trace.traceparent:
                parent = self.propagator.extract({"traceparent": trace.traceparent})
            self.ids.trace_id = trace.otel_trace_id
            top = self.tracer.start_span("InferRequest", context=parent, start_time=first,
                                         attributes=attrs)
            for name in _FRONTEND:
                if name in at:
                    top.add_event(name, timestamp=at[name])
            model_parent = otel.set_span_in_context(top)
        self.ids.span_id = trace.span_id
        model = self.tracer.start_span(trace.model_name, context=model_parent,
                                       start_time=at.get("REQUEST_START", first),
                                       attributes=attrs)
        self.ids.trace_id = self.ids.span_id = 0
        for name in ("REQUEST_START", "QUEUE_START", "REQUEST_END"):
            if name in at:
                model.add_event(name, timestamp=at[name])
        if "COMPUTE_START" in at:
            compute = self.tracer.start_span("compute", context=otel.set_span_in_context(model),
                                             start_time=at["COMPUTE_START"], attributes=attrs)
            for name in ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
                         "COMPUTE_END"):
                if name in at:
                    compute.add_event(name, timestamp=at[name])
            compute.end(end_time=at.get("COMPUTE_END", last))
        model.end(end_time=at.get("REQUEST_END", last))
        if top is not None:
            top.end(end_time=last)

    def close(self) -> None:
        self.provider.shutdown()  # flushes what is queued


class _TritonWords(logging.Filter):
    """The SDK's warning that its full queue drops a span, in the words Triton's (C++) SDK
    logs (L0_trace looks for them with ``bsp_max_queue_size=1``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Queue full, dropping"):
            record.msg, record.args = "BatchSpanProcessor queue is full - dropping span.", ()
        return True


def _say_dropped_as_triton() -> None:
    sdk = logging.getLogger("opentelemetry.sdk._shared_internal")
    if not any(isinstance(f, _TritonWords) for f in sdk.filters):
        sdk.addFilter(_TritonWords())


def _chosen_ids() -> Any:
    """The SDK's id generator: the next id set on it (a trace's chosen ids, set under its
    ``lock``), else a random one, as the SDK's own generator makes them."""
    import threading

    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class ChosenIds(RandomIdGenerator):
        def __init__(self) -> None:
            self.lock = threading.Lock()
            self.trace_id = 0
            self.span_id = 0

        def generate_span_id(self) -> int:
            chosen, self.span_id = self.span_id, 0
            return chosen or super().generate_span_id()

        def generate_trace_id(self) -> int:
            chosen, self.trace_id = self.trace_id, 0
            return chosen or super().generate_trace_id()

    return ChosenIds()
