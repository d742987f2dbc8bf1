"""A stand-in for the OpenTelemetry Collector (`otelcol`), for Triton's qa/L0_trace.

    otelcol.py --config trace-config.yaml

Triton's L0_trace downloads the collector (v0.91.0) at test time and runs it with a config of
one traces pipeline: the `otlp` receiver over HTTP, the `batch` processor and the `file`
exporter, whose output `opentelemetry_unittest.py` reads. This does that pipeline and no more:

- receiver `otlp`, protocol `http` (`endpoint`, default 0.0.0.0:4318): POST /v1/traces with an
  `ExportTraceServiceRequest` in protobuf (`application/x-protobuf`) or in the OTLP JSON
  encoding (`application/json`), gzip accepted; the answer is an `ExportTraceServiceResponse`
  in the same encoding. An endpoint on 0.0.0.0 is served on 127.0.0.1 (the harness runs in
  a loopback-only namespace; nothing here listens beyond the machine).
- processor `batch` (`send_batch_size`, default 8192; `timeout`, default 200ms): requests'
  resource spans are appended to one batch, sent when it holds `send_batch_size` spans or more,
  and by a timer every `timeout` (restarted by each send), as the collector's batch processor;
  SIGTERM / SIGINT send what is held, SIGKILL loses it.
- exporter `file` (`path`): the file is truncated at start; each batch is one line of the OTLP
  JSON encoding (`resourceSpans` / `scopeSpans` / `spans`, hex trace and span ids,
  `parentSpanId` always present, empty for a root span, enums as numbers, 64-bit integers as
  strings), written and flushed at once.

Any other receiver, processor, exporter or pipeline in the config is refused at start.
"""
from __future__ import annotations

import argparse
import base64
import gzip
import http.server
import json
import re
import signal
import sys
import threading
import time
from typing import Any

import yaml
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

_IDS = ("traceId", "spanId", "parentSpanId")


def log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    print(f"{stamp}\tinfo\t{message}", file=sys.stderr, flush=True)


def duration(text: Any) -> float:
    """A Go duration of the config (`10s`, `200ms`, `1m`) in seconds."""
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    total = 0.0
    parts = re.findall(r"([0-9.]+)(ns|us|µs|ms|s|m|h)", str(text))
    if not parts or "".join(n + u for n, u in parts) != str(text):
        raise SystemExit(f"otelcol stand-in: cannot read the duration '{text}'")
    for number, unit in parts:
        total += float(number) * units[unit]
    return total


def to_otlp_json(message: trace_service_pb2.ExportTraceServiceRequest) -> list[dict[str, Any]]:
    """The request's resource spans in the OTLP JSON encoding (ids in hex)."""
    data = json_format.MessageToDict(message, use_integers_for_enums=True)
    spans_of = (span for rs in data.get("resourceSpans", [])
                for ss in rs.get("scopeSpans", []) for span in ss.get("spans", []))
    for span in spans_of:
        for key in _IDS:
            span[key] = base64.b64decode(span.get(key, "")).hex()
        for link in span.get("links", []):
            for key in ("traceId", "spanId"):
                link[key] = base64.b64decode(link.get(key, "")).hex()
    return list(data.get("resourceSpans", []))


def from_otlp_json(body: bytes) -> trace_service_pb2.ExportTraceServiceRequest:
    """An OTLP JSON request (hex ids) parsed into the protobuf message."""
    data = json.loads(body)
    for rs in data.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for key in _IDS:
                    if key in span:
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
                for link in span.get("links", []):
                    for key in ("traceId", "spanId"):
                        if key in link:
                            link[key] = base64.b64encode(bytes.fromhex(link[key])).decode()
    return json_format.ParseDict(data, trace_service_pb2.ExportTraceServiceRequest())


class Pipeline:
    """The batch processor and the file exporter."""

    def __init__(self, path: str, send_batch_size: int, timeout: float) -> None:
        self.out = open(path, "w", encoding="utf-8")  # noqa: SIM115 - held for the run
        self.send_batch_size = send_batch_size
        self.timeout = timeout
        self.lock = threading.Lock()
        self.held: list[dict[str, Any]] = []
        self.count = 0
        self.due = time.monotonic() + timeout

    def consume(self, resource_spans: list[dict[str, Any]]) -> None:
        with self.lock:
            self.held.extend(resource_spans)
            self.count += sum(len(ss.get("spans", [])) for rs in resource_spans
                              for ss in rs.get("scopeSpans", []))
            if self.count >= self.send_batch_size:
                self._send()

    def tick(self) -> None:
        with self.lock:
            if time.monotonic() >= self.due:
                self._send()

    def flush(self) -> None:
        with self.lock:
            self._send()
            self.out.close()

    def _send(self) -> None:
        self.due = time.monotonic() + self.timeout
        if not self.held or self.out.closed:
            return
        line = json.dumps({"resourceSpans": self.held}, separators=(",", ":"))
        self.out.write(line + "\n")
        self.out.flush()
        self.held, self.count = [], 0


def handler(pipeline: Pipeline) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.split("?")[0] != "/v1/traces":
                self._answer(404, "text/plain", b"404 page not found\n")
                return
            kind = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            try:
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if kind == "application/json":
                    request = from_otlp_json(body)
                elif kind == "application/x-protobuf":
                    request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                else:
                    self._answer(415, "text/plain", f"unsupported media type {kind}\n".encode())
                    return
            except Exception as exc:  # noqa: BLE001 - any undecodable body is a 400
                self._answer(400, "text/plain", f"{exc}\n".encode())
                return
            pipeline.consume(to_otlp_json(request))
            reply = trace_service_pb2.ExportTraceServiceResponse()
            if kind == "application/json":
                self._answer(200, kind, json_format.MessageToJson(reply).encode())
            else:
                self._answer(200, kind, reply.SerializeToString())

        def _answer(self, code: int, kind: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(prog="otelcol")
    parser.add_argument("--config", required=True)
    args, _ = parser.parse_known_args()
    config = yaml.safe_load(open(args.config, encoding="utf-8"))  # noqa: SIM115
    pipelines = config.get("service", {}).get("pipelines", {})
    if set(pipelines) != {"traces"}:
        raise SystemExit(f"otelcol stand-in: only a `traces` pipeline, got {sorted(pipelines)}")
    traces = pipelines["traces"]
    if (traces.get("receivers") != ["otlp"] or traces.get("exporters") != ["file"]
            or traces.get("processors", []) not in ([], ["batch"])):
        raise SystemExit(f"otelcol stand-in: only otlp -> [batch] -> file, got {traces}")
    protocols = config["receivers"]["otlp"].get("protocols") or {}
    if "http" not in protocols or set(protocols) - {"http"}:
        raise SystemExit("otelcol stand-in: only the otlp receiver's http protocol")
    endpoint = (protocols["http"] or {}).get("endpoint", "0.0.0.0:4318")
    host, _, port = endpoint.rpartition(":")
    host = "127.0.0.1" if host in ("", "0.0.0.0") else host
    batch = (config.get("processors") or {}).get("batch") or {}
    if "batch" in traces.get("processors", []):
        size, timeout = int(batch.get("send_batch_size", 8192)), duration(batch.get("timeout",
                                                                                   "200ms"))
    else:
        size, timeout = 1, 3600.0
    pipeline = Pipeline(config["exporters"]["file"]["path"], size, timeout)
    server = http.server.ThreadingHTTPServer((host, int(port)), handler(pipeline))
    server.daemon_threads = True

    def stop(signum: int, frame: Any) -> None:
        log(f"Received signal from OS {signal.Signals(signum).name}")
        pipeline.flush()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log(f"otelcol stand-in (nursery qa harness): otlp http on {host}:{port}, batch "
        f"send_batch_size={size} timeout={timeout}s, file {config['exporters']['file']['path']}")
    log("Everything is ready. Begin running and processing data.")
    while True:
        time.sleep(0.05)
        pipeline.tick()


if __name__ == "__main__":
    main()
