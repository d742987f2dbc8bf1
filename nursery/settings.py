"""Server settings: Triton's command-line flags, parsed once into a frozen :class:`Settings`.

Flag names, defaults and help follow ``tritonserver``. Flags whose feature lands in a later
release are accepted and reported as not active yet, so that a Triton command line keeps
working.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path

from nursery.observability.logs import escape_from_environment
from nursery.observability.tracing import TraceSettings, settings_from_config
from nursery.scheduling.cache_store import parse_cache_config
from nursery.scheduling.rate_limit_policy import parse_resource_flag

DEFAULT_HTTP_MAX_INPUT_SIZE = 64 * 1024 * 1024
# The hard cap on a whole HTTP request body, binary tensor data included (nursery only):
# --http-max-input-size bounds the JSON part, as in Triton, whose HTTP frontend reads the
# Content-Length into an int32, so that no body it can describe is larger than this.
DEFAULT_HTTP_MAX_BODY_SIZE = 2**31 - 1
# What one client may hold on the HTTP and metrics ports (nursery only: Triton has no such
# flags). Generous for real clients, short enough that idle or trickling ones let go.
DEFAULT_HTTP_HEAD_TIMEOUT = 30.0
DEFAULT_HTTP_BODY_TIMEOUT = 60.0
DEFAULT_HTTP_KEEPALIVE_TIMEOUT = 75.0
DEFAULT_HTTP_MAX_CONNECTIONS = 1000
DEFAULT_METRICS_MAX_CONNECTIONS = 64
DEFAULT_GRPC_MAX_INPUT_SIZE = DEFAULT_HTTP_MAX_INPUT_SIZE


@dataclass(frozen=True)
class Settings:
    model_repositories: tuple[Path, ...]
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    http_address: str = "0.0.0.0"
    grpc_address: str = "0.0.0.0"
    metrics_address: str = ""
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    model_control_mode: str = "none"
    repository_poll_secs: int = 15
    load_models: tuple[str, ...] = ()
    auto_complete: bool = True
    exit_on_error: bool = True
    exit_timeout_secs: float = 30.0
    model_unload_timeout_secs: float = 30.0
    strict_readiness: bool = True
    log_verbose: int = 0
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_file: str = ""
    log_format: str = "default"
    log_escape: bool = True  # TRITON_SERVER_ESCAPE_LOG_MESSAGES (an environment variable)
    allow_gpu_metrics: bool = True
    allow_cpu_metrics: bool = True
    metrics_interval_ms: int = 2000
    metrics_config: tuple[tuple[str, str], ...] = ()  # --metrics-config key=value, in order
    trace: TraceSettings = field(default_factory=TraceSettings)
    rate_limit: str = "off"  # --rate-limit off|execution_count
    rate_limit_resources: tuple[tuple[tuple[str, int | None], int], ...] = ()
    cache_size: int | None = None  # --cache-config local,size=N: the response cache's bytes
    http_max_input_size: int = DEFAULT_HTTP_MAX_INPUT_SIZE
    http_max_body_size: int = DEFAULT_HTTP_MAX_BODY_SIZE
    http_head_timeout: float = DEFAULT_HTTP_HEAD_TIMEOUT
    http_body_timeout: float = DEFAULT_HTTP_BODY_TIMEOUT
    http_keepalive_timeout: float = DEFAULT_HTTP_KEEPALIVE_TIMEOUT
    http_max_connections: int = DEFAULT_HTTP_MAX_CONNECTIONS
    metrics_max_connections: int = DEFAULT_METRICS_MAX_CONNECTIONS
    # the gRPC port: Triton's keepalive flags (milliseconds), then nursery's own limits
    grpc_keepalive_time: int = 7200000
    grpc_keepalive_timeout: int = 20000
    grpc_keepalive_permit_without_calls: bool = False
    grpc_http2_max_pings_without_data: int = 2
    grpc_http2_min_recv_ping_interval_without_data: int = 300000
    grpc_http2_max_ping_strikes: int = 2
    grpc_max_input_size: int = DEFAULT_GRPC_MAX_INPUT_SIZE
    grpc_max_connections: int = 1000
    grpc_idle_timeout: int = 300000
    grpc_handshake_timeout: int = 10000
    grpc_write_timeout: int = 60000
    server_id: str = "triton"
    http_server: str = "nursery"
    grpc_server: str = "nursery"
    arrival_log: str = ""  # nursery only: record every accepted request (observability/arrival_log.py)
    inactive: tuple[str, ...] = field(default=())  # flags given whose feature is not active
    # --backend-config=<backend>,<setting>=<value>: (backend, setting, value); backend "" for a
    # global setting. The Python backend reads nursery-instance-mode (thread | process).
    backend_config: tuple[tuple[str, str, str], ...] = ()


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "on", "yes"):
        return True
    if value in ("false", "0", "off", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got '{text}'")


def _bool_flag(parser: argparse.ArgumentParser, name: str, default: bool, help: str) -> None:
    parser.add_argument(name, type=_bool, nargs="?", const=True, default=default,
                        metavar="<bool>", help=f"{help} Default is {str(default).lower()}.")


# Flags tritonserver has whose features are not in this build yet: accepted, then reported.
_LATER_FLAGS = {
    "--backend-directory": "backend directories",
    "--model-load-thread-count": "parallel model loading settings",
    "--pinned-memory-pool-byte-size": "pinned memory pools",
    "--cuda-memory-pool-byte-size": "CUDA memory pools",
    "--allow-sagemaker": "the SageMaker frontend",
    "--allow-vertex-ai": "the Vertex AI frontend",
    # thread and pool sizes of Triton's C++ frontends; nursery's tasks need no such sizes
    "--http-thread-count": "HTTP thread pool sizing",
    "--grpc-infer-allocation-pool-size": "gRPC allocation pool sizing",
    "--sagemaker-port": "the SageMaker frontend",
    "--sagemaker-thread-count": "the SageMaker frontend",
    "--vertex-ai-port": "the Vertex AI frontend",
    "--vertex-ai-thread-count": "the Vertex AI frontend",
    "--enable-peer-access": "CUDA peer access settings",
    "--min-supported-compute-capability": "GPU compute capability filtering",
    "--repoagent-directory": "repository agents",
    "--cache-directory": "cache plugin directories",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m nursery serve",
        description="Serve the models of one or more Triton-style model repositories over "
        "KServe v2 HTTP (and gRPC), with Triton's flags.",
    )
    parser.add_argument(
        "--model-repository", "--model-store", action="append", default=None, metavar="<path>",
        help="Path to model repository directory. It may be specified multiple times to add "
        "multiple model repositories. Note that if a model is not unique across all model "
        "repositories at any time, the model will not be available. Defaults to "
        "./model_repository when that folder exists.",
    )
    parser.add_argument("--http-port", type=int, default=8000, metavar="<int>",
                        help="The port for the server to listen on for HTTP requests. "
                        "Default is 8000.")
    parser.add_argument("--http-address", default="0.0.0.0", metavar="<string>",
                        help="The address for the http server to bind to. Default is 0.0.0.0.")
    parser.add_argument("--grpc-port", type=int, default=8001, metavar="<int>",
                        help="The port for the server to listen on for GRPC requests. "
                        "Default is 8001.")
    parser.add_argument("--grpc-address", default="0.0.0.0", metavar="<string>",
                        help="The address for the grpc server to bind to. Default is 0.0.0.0.")
    parser.add_argument("--metrics-port", type=int, default=8002, metavar="<int>",
                        help="The port reporting prometheus metrics. Default is 8002.")
    parser.add_argument("--metrics-address", default="", metavar="<string>",
                        help="The address for the metrics server to bind to. Default is the "
                        "same as --http-address.")
    _bool_flag(parser, "--allow-http", True, "Allow the server to listen for HTTP requests.")
    _bool_flag(parser, "--allow-grpc", True, "Allow the server to listen for GRPC requests.")
    _bool_flag(parser, "--allow-metrics", True, "Allow the server to provide prometheus metrics.")
    _bool_flag(parser, "--allow-gpu-metrics", True,
               "Allow the server to provide GPU metrics. Ignored unless --allow-metrics is true.")
    _bool_flag(parser, "--allow-cpu-metrics", True,
               "Allow the server to provide CPU metrics. Ignored unless --allow-metrics is true.")
    parser.add_argument("--metrics-interval-ms", type=int, default=2000, metavar="<int>",
                        help="Metrics will be collected once every <metrics-interval-ms> "
                        "milliseconds. Default is 2000 milliseconds.")
    parser.add_argument(
        "--metrics-config", action="append", default=[], metavar="<string>",
        help="Specify a metrics-specific configuration setting. The format of this flag is "
        "--metrics-config=<setting>=<value>: counter_latencies, summary_latencies, "
        "histogram_latencies (true/false) and summary_quantiles "
        "(<quantile>:<error>,...).",
    )
    parser.add_argument(
        "--cache-config", action="append", default=[], metavar="<string>",
        help="Specify a cache-specific configuration setting. The format of this flag is "
        "--cache-config=<cache_name>,<setting>=<value>. This server has the 'local' cache: "
        "--cache-config local,size=<bytes> enables a response cache of that many bytes.",
    )
    parser.add_argument(
        "--rate-limit", choices=["off", "execution_count"], default="off",
        help="Specify the mode for rate limiting. Options are \"execution_count\" and "
        "\"off\". The default is \"off\". For \"execution_count\", the server will "
        "determine the instance using configured priority and the number of time the "
        "instance has been used to run inference. The inference will finally be executed once "
        "the required resources are available. For \"off\", the server will ignore any rate "
        "limiter config and run inference as soon as an instance is ready.",
    )
    parser.add_argument(
        "--rate-limit-resource", action="append", default=[], metavar="<string>",
        help="The number of resources available to the server. The format of this flag is "
        "--rate-limit-resource=<resource_name>:<count>:<device>. The <device> is optional and "
        "if not listed will be applied to every device. If the resource is specified as "
        "\"GLOBAL\" in the model configuration the resource is considered shared among all "
        "the devices in the system. The <device> property is ignored for such resources.",
    )
    parser.add_argument("--response-cache-byte-size", type=int, default=None, metavar="<int>",
                        help="DEPRECATED: use --cache-config local,size=<bytes>.")
    parser.add_argument(
        "--trace-config", action="append", default=[], metavar="<string>",
        help="Specify global or trace mode specific configuration setting. The format of this "
        "flag is --trace-config=<mode>,<setting>=<value> (mode: triton) or "
        "--trace-config=<setting>=<value> for rate, level, count and mode.",
    )
    for flag, key in (("--trace-file", "file"), ("--trace-level", "level"),
                      ("--trace-rate", "rate"), ("--trace-count", "count"),
                      ("--trace-log-frequency", "log-frequency")):
        parser.add_argument(flag, action="append", default=[], metavar="<value>",
                            help=f"DEPRECATED: use --trace-config {key}=<value>.")
    parser.add_argument(
        "--model-control-mode", choices=["none", "poll", "explicit"], default="none",
        help='Specify the mode for model management. Options are "none", "poll" and '
        '"explicit". The default is "none". For "none", the server will load all models in the '
        'model repository(s) at startup and will not make any changes to the load models after '
        'that. For "poll", the server will poll the model repository(s) to detect changes and '
        "will load/unload models based on those changes. The poll rate is controlled by "
        "'repository-poll-secs'. For \"explicit\", model load and unload is initiated by using "
        "the model control APIs, and only models specified with --load-model will be loaded at "
        "startup.",
    )
    parser.add_argument(
        "--repository-poll-secs", type=int, default=15, metavar="<int>",
        help="Interval in seconds between each poll of the model repository to check for "
        "changes. Valid only when --model-control-mode=poll is specified.",
    )
    parser.add_argument(
        "--load-model", action="append", default=[], metavar="<string>",
        help="Name of the model to be loaded on server startup. It may be specified multiple "
        "times to add multiple models. To load ALL models at startup, specify '*' as the model "
        "name with --load-model=* as the ONLY --load-model argument. Only takes effect with "
        "--model-control-mode=explicit.",
    )
    parser.add_argument(
        "--strict-model-config", type=_bool, nargs="?", const=True, default=None,
        metavar="<bool>",
        help="DEPRECATED: If true model configuration files must be provided and all required "
        "configuration settings must be specified. If false the model configuration may be "
        "absent or only partially specified and the server will attempt to derive the missing "
        "required configuration.",
    )
    parser.add_argument(
        "--disable-auto-complete-config", action="store_true",
        help="If set, disables the server and backends from auto completing model "
        "configuration files. Model configuration files must be provided and all required "
        "configuration settings must be specified.",
    )
    _bool_flag(parser, "--strict-readiness", True,
               "If true /v2/health/ready endpoint indicates ready if the server is responsive "
               "and all models are available. If false it indicates ready if the server is "
               "responsive even if some/all models are unavailable.")
    _bool_flag(parser, "--exit-on-error", True,
               "Exit the inference server if an error occurs during initialization.")
    parser.add_argument(
        "--exit-timeout-secs", type=int, default=30, metavar="<int>",
        help="Timeout (in seconds) when exiting to wait for in-flight inferences to finish. "
        "After the timeout expires the server exits even if inferences are still in flight. "
        "Default is 30.",
    )
    parser.add_argument(
        "--model-unload-timeout-secs", type=float, default=None, metavar="<float>",
        help="nursery only: how long an unload (or a reload's switch) waits for a model's "
        "queued and running requests to finish before it abandons the instances still busy "
        "(a model that never returns) and fails their requests. Default: the "
        "--exit-timeout-secs value.",
    )
    parser.add_argument("--log-verbose", type=int, default=0, metavar="<int>",
                        help="Set verbose logging level. Zero (0) disables verbose logging and "
                        "values >= 1 enable verbose logging.")
    _bool_flag(parser, "--log-info", True, "Enable/disable info-level logging.")
    _bool_flag(parser, "--log-warning", True, "Enable/disable warning-level logging.")
    _bool_flag(parser, "--log-error", True, "Enable/disable error-level logging.")
    parser.add_argument("--log-format", choices=["default", "ISO8601"], default="default",
                        help='Set the logging format. Options are "default" and "ISO8601". '
                        'The default is "default".')
    parser.add_argument("--log-file", default="", metavar="<string>",
                        help="Set the name of the log output file. If specified, log outputs "
                        "will be saved to this file. If not specified, log outputs will stream "
                        "to the console.")
    parser.add_argument(
        "--http-max-input-size", type=int, default=DEFAULT_HTTP_MAX_INPUT_SIZE, metavar="<int>",
        help="Maximum allowed HTTP request input size in bytes: the JSON part of a request "
        "(binary tensor data after an Inference-Header-Content-Length header does not count), "
        "a raw binary request, a decompressed body. Default is 64 MiB.",
    )
    parser.add_argument(
        "--http-max-body-size", type=int, default=DEFAULT_HTTP_MAX_BODY_SIZE, metavar="<int>",
        help="(nursery only) The hard cap on a whole HTTP request body in bytes, binary tensor "
        "data included; a body larger than this (or than --http-max-input-size, whichever is "
        "larger) is refused before it is read. Bytes are buffered only as they arrive. "
        "Default is 2147483647 (2 GiB - 1), the largest body Triton's HTTP frontend handles "
        "(it reads Content-Length into an int32).",
    )
    _grpc_flags(parser)
    parser.add_argument(
        "--http-head-timeout-secs", type=float, default=DEFAULT_HTTP_HEAD_TIMEOUT,
        metavar="<float>",
        help="(nursery only) Seconds a client has to send a whole request head on the HTTP and "
        "metrics ports: counted from the connection's opening for its first request, from "
        "the head's first byte after that. Late: 408, then the connection closes. Default is "
        f"{DEFAULT_HTTP_HEAD_TIMEOUT:g}.",
    )
    parser.add_argument(
        "--http-body-timeout-secs", type=float, default=DEFAULT_HTTP_BODY_TIMEOUT,
        metavar="<float>",
        help="(nursery only) Seconds a client has to send a whole request body after its head, "
        "and to take a whole response, on the HTTP and metrics ports. Late: 408 (a body), "
        f"then the connection closes. Default is {DEFAULT_HTTP_BODY_TIMEOUT:g}.",
    )
    parser.add_argument(
        "--http-keepalive-timeout-secs", type=float, default=DEFAULT_HTTP_KEEPALIVE_TIMEOUT,
        metavar="<float>",
        help="(nursery only) Seconds a kept-alive connection on the HTTP and metrics ports may "
        f"idle between requests before it closes. Default is {DEFAULT_HTTP_KEEPALIVE_TIMEOUT:g}.",
    )
    parser.add_argument(
        "--http-max-connections", type=int, default=DEFAULT_HTTP_MAX_CONNECTIONS,
        metavar="<int>",
        help="(nursery only) Open connections the HTTP port serves at once; one more is answered "
        "503 'connection limit reached' and closed. Default is "
        f"{DEFAULT_HTTP_MAX_CONNECTIONS}.",
    )
    parser.add_argument(
        "--metrics-max-connections", type=int, default=DEFAULT_METRICS_MAX_CONNECTIONS,
        metavar="<int>",
        help="(nursery only) The same cap for the metrics port. Default is "
        f"{DEFAULT_METRICS_MAX_CONNECTIONS}.",
    )
    parser.add_argument(
        "--http-server", choices=["nursery", "hypercorn"], default="nursery",
        help="(nursery only) Which HTTP/1.1 implementation serves the HTTP port: nursery's own "
        "lean server (default) or hypercorn with quart-trio, the design card's, which needs the "
        "'card-servers' extra (pip install \"nursery[card-servers]\"). Both serve the same routes "
        "and answers; the --http-*-timeout-secs and --http-max-connections flags apply to "
        "nursery's own only.",
    )
    parser.add_argument(
        "--grpc-server", choices=["nursery", "grpclib"], default="nursery",
        help="(nursery only) Which HTTP/2 implementation serves the gRPC port: nursery's own "
        "lean server on trio (default) or grpclib on a trio-asyncio loop, the design card's, "
        "which needs the 'card-servers' extra (pip install \"nursery[card-servers]\"). Both "
        "serve the same services and answers.",
    )
    parser.add_argument(
        "--arrival-log", default="", metavar="<string>",
        help="(nursery only) Write one JSON line per accepted inference request (time, model, "
        "batch size, priority, timeout, sequence id) to this file, for replay with "
        "`python -m nursery simulate --arrivals trace`.",
    )
    parser.add_argument("--id", default="triton", metavar="<string>",
                        help='Identifier for this server (the "name" in server metadata). '
                        'Default is "triton", which Triton clients expect.')
    parser.add_argument(
        "--backend-config", action="append", default=[], metavar="<<string>,<string>=<string>>",
        help="Specify a backend-specific configuration setting: "
        "<backend name>,<setting>=<value>. nursery's Python backend reads "
        "nursery-instance-mode=process (each instance in a stub process of its own) or "
        "thread (on the server's instance thread, the default).")
    for flag, feature in _LATER_FLAGS.items():
        parser.add_argument(flag, action="append", default=None, metavar="<value>",
                            help=f"Accepted for compatibility; {feature} is not active yet.")
    return parser


def _grpc_flags(parser: argparse.ArgumentParser) -> None:
    """Triton's gRPC keepalive flags (milliseconds, gRPC core's defaults) and nursery's own
    limits of the gRPC port (served by --grpc-server=nursery)."""
    def ms(flag: str, default: int, help: str) -> None:
        parser.add_argument(flag, type=_non_negative, default=default, metavar="<integer>",
                            help=help)

    ms("--grpc-keepalive-time", 7200000, "The period (in milliseconds) after which a keepalive "
       "ping is sent on the transport. Default is 7200000 (2 hours).")
    ms("--grpc-keepalive-timeout", 20000, "The period (in milliseconds) the sender of the "
       "keepalive ping waits for an acknowledgement. If it does not receive an acknowledgment "
       "within this time, it will close the connection. Default is 20000 (20 seconds).")
    parser.add_argument(
        "--grpc-keepalive-permit-without-calls", type=_bool, nargs="?", const=True,
        default=False, metavar="<boolean>",
        help="Allows keepalive pings to be sent even if there are no calls in flight "
        "(0 : false; 1 : true). Default is 0 (false).")
    ms("--grpc-http2-max-pings-without-data", 2, "The maximum number of pings that can be sent "
       "when there is no data/header frame to be sent. Setting it to 0 allows sending pings "
       "without such a restriction. Default is 2.")
    ms("--grpc-http2-min-recv-ping-interval-without-data", 300000, "If there are no "
       "data/header frames being sent on the transport, the minimum time (in milliseconds) "
       "expected between receiving successive pings; a ping sooner than that is a ping "
       "strike. Default is 300000 (5 minutes).")
    ms("--grpc-http2-max-ping-strikes", 2, "Maximum number of bad pings that the server will "
       "tolerate before sending an HTTP2 GOAWAY frame and closing the transport. Setting it to "
       "0 allows the server to accept any number of bad pings. Default is 2.")
    parser.add_argument(
        "--grpc-max-input-size", type=_positive, default=DEFAULT_GRPC_MAX_INPUT_SIZE,
        metavar="<int>",
        help="(nursery only) Maximum allowed gRPC request message size in bytes, checked on "
        "the declared length before the message is read and on the inflated size of a "
        "compressed one (RESOURCE_EXHAUSTED beyond it). Default is 64 MiB.")
    parser.add_argument(
        "--grpc-max-connections", type=_positive, default=1000, metavar="<int>",
        help="(nursery only) Maximum number of open connections on the gRPC port; one more is "
        "answered GOAWAY and closed at once. Default is 1000.")
    ms("--grpc-idle-timeout", 300000, "(nursery only) A gRPC connection without a call in "
       "flight for this long (in milliseconds) is closed with GOAWAY; 0 never. Default is "
       "300000 (5 minutes).")
    ms("--grpc-handshake-timeout", 10000, "(nursery only) A gRPC connection whose HTTP/2 "
       "preface and first SETTINGS do not arrive within this time (in milliseconds) is closed; "
       "0 never. Default is 10000 (10 seconds).")
    ms("--grpc-write-timeout", 60000, "(nursery only) A gRPC connection whose client leaves a "
       "piece of a response (at most 256 KiB) unread for this long (in milliseconds) is closed; "
       "0 never. Default is 60000 (1 minute).")


def _non_negative(text: str) -> int:
    value = _strict_int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got '{text}'")
    return value


def _positive(text: str) -> int:
    value = _strict_int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'")
    return value


def _strict_int(text: str) -> int:
    """An integer of at most 19 digits (no 4000-digit numbers to parse)."""
    digits = text.strip()
    if not digits.isdigit() or len(digits) > 19:
        raise argparse.ArgumentTypeError(f"expected an integer, got '{text}'")
    return int(digits)


def settings_from_args(argv: list[str]) -> Settings:
    parser = build_parser()
    args = parser.parse_args(argv)
    repos = args.model_repository
    if not repos:
        if Path("model_repository").is_dir():
            repos = ["model_repository"]
        else:
            parser.error("--model-repository is required (no ./model_repository folder here)")
    if "*" in args.load_model and len(args.load_model) > 1:
        parser.error("Wildcard model name '*' must be the ONLY startup model if specified at all.")
    if args.load_model and args.model_control_mode != "explicit":
        parser.error("--load-model only takes effect with --model-control-mode=explicit")
    metrics_config = []
    for entry in args.metrics_config:
        key, sep, value = entry.partition("=")
        if not sep or key not in ("counter_latencies", "summary_latencies",
                                  "histogram_latencies", "summary_quantiles"):
            parser.error(f"--metrics-config: unknown or malformed setting '{entry}'")
        if key != "summary_quantiles" and value not in ("true", "false"):
            parser.error(f"--metrics-config {key} expects true or false, got '{value}'")
        metrics_config.append((key, value))
    trace_entries = list(args.trace_config)
    if args.trace_file:
        trace_entries.append(f"triton,file={args.trace_file[-1]}")
    if args.trace_log_frequency:
        trace_entries.append(f"triton,log-frequency={args.trace_log_frequency[-1]}")
    trace_entries += [f"level={v}" for v in args.trace_level]
    trace_entries += [f"rate={v}" for v in args.trace_rate[-1:]]
    trace_entries += [f"count={v}" for v in args.trace_count[-1:]]
    try:
        trace = settings_from_config(tuple(trace_entries))
    except ValueError as exc:
        parser.error(str(exc))
    cache_entries = list(args.cache_config)
    if args.response_cache_byte_size is not None:
        cache_entries.append(f"local,size={args.response_cache_byte_size}")
    try:
        cache_size = parse_cache_config(cache_entries)
    except ValueError as exc:
        parser.error(str(exc))
    resources = []
    for entry in args.rate_limit_resource:
        try:
            resources.append(parse_resource_flag(entry))
        except ValueError as exc:
            parser.error(str(exc))
    if args.metrics_interval_ms <= 0:
        parser.error("--metrics-interval-ms must be positive")
    for flag in ("http_head_timeout_secs", "http_body_timeout_secs",
                 "http_keepalive_timeout_secs", "http_max_connections",
                 "metrics_max_connections"):
        if not getattr(args, flag) > 0:  # also refuses nan
            parser.error(f"--{flag.replace('_', '-')} must be positive")
    auto_complete = not args.disable_auto_complete_config and not bool(args.strict_model_config)
    inactive = tuple(
        flag for flag in _LATER_FLAGS if getattr(args, flag[2:].replace("-", "_")) is not None
    )
    backend_config = []
    for entry in args.backend_config:
        backend, _, setting = entry.partition(",") if "," in entry.split("=", 1)[0] else (
            "", "", entry)
        key, eq, value = setting.partition("=")
        if not eq or not key:
            parser.error(f"--backend-config {entry}: expected <backend>,<setting>=<value>")
        backend_config.append((backend, key, value))
    return Settings(
        backend_config=tuple(backend_config),
        model_repositories=tuple(Path(os.path.abspath(r)) for r in repos),
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        http_address=args.http_address,
        grpc_address=args.grpc_address,
        metrics_address=args.metrics_address or args.http_address,
        allow_http=args.allow_http,
        allow_grpc=args.allow_grpc,
        allow_metrics=args.allow_metrics,
        model_control_mode=args.model_control_mode,
        repository_poll_secs=args.repository_poll_secs,
        load_models=tuple(args.load_model),
        auto_complete=auto_complete,
        exit_on_error=args.exit_on_error,
        exit_timeout_secs=float(args.exit_timeout_secs),
        model_unload_timeout_secs=float(args.exit_timeout_secs
                                        if args.model_unload_timeout_secs is None
                                        else args.model_unload_timeout_secs),
        strict_readiness=args.strict_readiness,
        log_verbose=args.log_verbose,
        log_info=args.log_info,
        log_warning=args.log_warning,
        log_error=args.log_error,
        log_file=args.log_file,
        log_format=args.log_format,
        log_escape=escape_from_environment(os.environ),
        allow_gpu_metrics=args.allow_gpu_metrics,
        allow_cpu_metrics=args.allow_cpu_metrics,
        metrics_interval_ms=args.metrics_interval_ms,
        metrics_config=tuple(metrics_config),
        trace=trace,
        cache_size=cache_size or None,
        rate_limit=args.rate_limit,
        rate_limit_resources=tuple(resources),
        http_max_input_size=args.http_max_input_size,
        http_max_body_size=args.http_max_body_size,
        http_head_timeout=args.http_head_timeout_secs,
        http_body_timeout=args.http_body_timeout_secs,
        http_keepalive_timeout=args.http_keepalive_timeout_secs,
        http_max_connections=args.http_max_connections,
        metrics_max_connections=args.metrics_max_connections,
        grpc_keepalive_time=args.grpc_keepalive_time,
        grpc_keepalive_timeout=args.grpc_keepalive_timeout,
        grpc_keepalive_permit_without_calls=args.grpc_keepalive_permit_without_calls,
        grpc_http2_max_pings_without_data=args.grpc_http2_max_pings_without_data,
        grpc_http2_min_recv_ping_interval_without_data=(
            args.grpc_http2_min_recv_ping_interval_without_data),
        grpc_http2_max_ping_strikes=args.grpc_http2_max_ping_strikes,
        grpc_max_input_size=args.grpc_max_input_size,
        grpc_max_connections=args.grpc_max_connections,
        grpc_idle_timeout=args.grpc_idle_timeout,
        grpc_handshake_timeout=args.grpc_handshake_timeout,
        grpc_write_timeout=args.grpc_write_timeout,
        server_id=args.id,
        http_server=args.http_server,
        grpc_server=args.grpc_server,
        arrival_log=args.arrival_log,
        inactive=inactive,
    )
