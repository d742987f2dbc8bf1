"""Server settings: Triton's command-line flags, parsed once into a frozen :class:`Settings`.

Flag names, defaults and help follow ``tritonserver``. Flags whose feature lands in a later
release are accepted and reported as not active yet, so that a Triton command line keeps
working.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nursery.config.storage.url import CloudRoot, is_cloud_url, parse_root
from nursery.observability.logs import escape_from_environment
from nursery.observability.tracing import TraceSettings, settings_from_config
from nursery.protocol.access import (
    CATEGORIES,
    GRPC_KEY_PREFIX,
    HeaderForward,
    Restrictions,
    compile_forward_pattern,
    parse_restrictions,
)
from nursery.protocol.openai import restrictions
from nursery.protocol.tls import TlsFiles
from nursery.scheduling.cache_store import CacheConfig, parse_cache_config
from nursery.scheduling.model_budget import Budget, parse_budget
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
# Triton's gRPC server takes messages up to INT32_MAX bytes (its MAX_GRPC_MESSAGE_SIZE; its
# qa/L0_large_payload sends 1.9 GB tensors); bytes are buffered only as they arrive
DEFAULT_GRPC_MAX_INPUT_SIZE = 2**31 - 1
# --max-tool-call-parse-bytes (Triton's OpenAI frontend's default, 128 KiB)
DEFAULT_TOOL_CALL_PARSE_BYTES = 128 * 1024
# --openai-max-input-size (Triton's OpenAI frontend's --http-max-input-size: 64 MiB)
DEFAULT_OPENAI_MAX_INPUT_SIZE = 1 << 26


@dataclass(frozen=True)
class OpenAISettings:
    """The OpenAI-compatible frontend (``--openai-port``; off without it), with the flags of
    Triton's OpenAI frontend (``python/openai/openai_frontend/main.py``)."""

    port: int = 9000
    address: str = "0.0.0.0"
    tokenizer: str = ""  # --tokenizer: a local folder in Hugging Face's layout
    lora_separator: str = ""  # --lora-separator: "<model><sep><lora>" picks an adapter
    default_max_tokens: int = 16  # --default-max-tokens
    chat_template: str = ""  # --chat-template: a Jinja file that replaces the tokenizer's
    backend: str = ""  # --backend vllm|tensorrtllm: the request format for every model
    tool_call_parser: str = ""  # --tool-call-parser llama3|hermes|mistral: tool calls in chat answers
    max_input_size: int = DEFAULT_OPENAI_MAX_INPUT_SIZE  # --openai-max-input-size
    restrictions: Restrictions = Restrictions()  # --openai-restricted-api <APIs> <header> <value>
    # --max-tool-call-parse-bytes: a streamed chat's text the tool-call parser reads, at most
    max_tool_call_parse_bytes: int = DEFAULT_TOOL_CALL_PARSE_BYTES


@dataclass(frozen=True)
class SageMakerSettings:
    """The SageMaker frontend (``--allow-sagemaker``; off without it): Triton's flags, and the
    environment variables its SageMaker server reads once at start-up."""

    port: int = 8080  # --sagemaker-port
    address: str = "0.0.0.0"  # Triton has no flag for it; nursery follows --http-address
    safe_range: tuple[int, int] | None = None  # --sagemaker-safe-port-range: the other ports'
    # SAGEMAKER_TRITON_DEFAULT_MODEL_NAME: the model /invocations serves
    default_model: str = "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"
    ping_mode: str = "ready"  # SAGEMAKER_TRITON_PING_MODE: "live", or readiness otherwise
    inference_type: str = "infer"  # SAGEMAKER_TRITON_INFERENCE_TYPE: infer|generate|generate_stream
    # where the multi-model endpoint's urls must lie (Triton: /opt/ml/models, fixed);
    # NURSERY_SAGEMAKER_MODELS_ROOT moves it (a test tree standing in for /opt/ml)
    models_root: str = "/opt/ml/models"


@dataclass(frozen=True)
class VertexAiSettings:
    """The Vertex AI frontend (``--allow-vertex-ai``, on by default when ``AIP_MODE`` is
    ``PREDICTION``): Triton's flags, and the ``AIP_*`` environment variables it reads once at
    start-up (``nursery/protocol/vertex_ai.py``)."""

    port: int = 8080  # --vertex-ai-port, else AIP_HTTP_PORT, else 8080
    address: str = "0.0.0.0"  # Triton has no flag for it; nursery follows --http-address
    default_model: str = ""  # --vertex-ai-default-model ("": the repository's one model)
    predict_route: str = ""  # AIP_PREDICT_ROUTE (a regular expression; required)
    health_route: str = ""  # AIP_HEALTH_ROUTE (a regular expression; required)


@dataclass(frozen=True)
class Settings:
    model_repositories: tuple[Path | CloudRoot, ...]
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    # the metrics port itself (off for Triton's OpenAI frontend's command line, whose metrics
    # are served at /metrics on the OpenAI port only)
    open_metrics_port: bool = True
    http_address: str = "0.0.0.0"
    grpc_address: str = "0.0.0.0"
    reuse_http_port: bool = False  # SO_REUSEPORT on the HTTP listeners
    reuse_grpc_port: bool = False  # SO_REUSEPORT on the gRPC listeners
    # processes that serve the HTTP port beside the engine (0: the engine serves it alone)
    http_frontend_processes: int = 0
    # gRPC infer responses compressed (gzip) at this level when the client accepts it
    grpc_response_compression: str = "none"  # none | low | medium | high
    metrics_address: str = ""
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    model_control_mode: str = "none"
    model_config_name: str = ""  # --model-config-name: configs/<name>.pbtxt over config.pbtxt
    model_namespacing: bool = False  # each repository a namespace (same names may repeat)
    model_load_retry_count: int = 0  # --model-load-retry-count: loads retried on failure
    repository_poll_secs: int = 15
    # nursery only: a lasting cache of cloud repositories' objects (config/storage/mirror.py)
    cloud_cache_directory: str = ""
    # nursery only, explicit mode: models that come and go with demand (actors/demand.py)
    model_load_on_demand: bool = False
    model_load_on_demand_timeout_secs: float = 60.0
    model_load_budget: Budget = Budget()
    model_load_pins: tuple[str, ...] = ()
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
    cache: CacheConfig | None = None  # --cache-config: the response cache (None: none)
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
    # what tritonserver prints to stderr while parsing its command line (deprecated flags)
    cli_warnings: tuple[str, ...] = field(default=())
    # --backend-config=<backend>,<setting>=<value>: (backend, setting, value); backend "" for a
    # global setting. The Python backend reads nursery-instance-mode (thread | process).
    backend_config: tuple[tuple[str, str, str], ...] = ()
    # the locked doors (docs/security.md): TLS, restricted groups, forwarded headers, and the
    # two switches that are off unless the operator turns them on
    grpc_tls: TlsFiles | None = None  # --grpc-use-ssl[-mutual] and its files
    http_tls: TlsFiles | None = None  # --http-ssl-cert / --http-ssl-key (nursery only)
    http_restrictions: Restrictions = Restrictions()  # --http-restricted-api
    grpc_restrictions: Restrictions = Restrictions()  # --grpc-restricted-protocol
    http_forward: HeaderForward = HeaderForward()  # --http-header-forward-pattern
    grpc_forward: HeaderForward = HeaderForward()  # --grpc-header-forward-pattern
    allow_client_shm: bool = False  # --allow-client-shm (Triton 2.68: off by default)
    allow_model_file_upload: bool = False  # --allow-model-file-upload (nursery only)
    openai: OpenAISettings | None = None  # --openai-port: the OpenAI-compatible frontend
    sagemaker: SageMakerSettings | None = None  # --allow-sagemaker: the SageMaker frontend
    vertex_ai: VertexAiSettings | None = None  # --allow-vertex-ai: the Vertex AI frontend
    # --backend-directory: where Python-based backends live (<dir>/<name>/model.py)
    backend_directory: Path = Path("/opt/tritonserver/backends")


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "on", "yes"):
        return True
    if value in ("false", "0", "off", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got '{text}'")


def _int_bool(text: str) -> int:
    """An integer, or true / false as 1 / 0 (Triton's ParseIntBoolOption: --log-verbose=true
    is how SageMaker's serve script starts it)."""
    value = text.strip().lower()
    if value in ("true", "false"):
        return int(value == "true")
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: '{text}'") from None


def _check_sized_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The values tritonserver refuses for two sizes nursery accepts without using: a
    start-up script that passes one Triton stops on must stop here too (L0_sequence_stress
    starts it with --grpc-infer-thread-count of -1, 0, 1 and 129 and expects each to fail)."""
    checks = (("grpc_infer_thread_count", 2, 128,
               "invalid argument for --grpc_infer_thread_count. Must be in the range 2 to 128."),
              ("grpc_max_response_pool_size", 1, None,
               "Error: --grpc-max-response-pool-size must be greater than 0."))
    for name, low, high, words in checks:
        for text in getattr(args, name) or ():
            try:
                value = int(text)
            except ValueError:
                parser.error(f"invalid int value for --{name.replace('_', '-')}: '{text}'")
            if value < low or (high is not None and value > high):
                parser.error(f'Bad option: "--{name.replace("_", "-")}".\n{words}')


def _bool_flag(parser: argparse.ArgumentParser, name: str, default: bool, help: str) -> None:
    parser.add_argument(name, type=_bool, nargs="?", const=True, default=default,
                        metavar="<bool>", help=f"{help} Default is {str(default).lower()}.")


# Flags tritonserver has whose features are not in this build yet: accepted, then reported.
_LATER_FLAGS = {
    "--model-load-thread-count": "parallel model loading settings",
    "--pinned-memory-pool-byte-size": "pinned memory pools",
    "--cuda-memory-pool-byte-size": "CUDA memory pools",
    # thread and pool sizes of Triton's C++ frontends; nursery's tasks need no such sizes
    "--http-thread-count": "HTTP thread pool sizing",
    "--grpc-infer-allocation-pool-size": "gRPC allocation pool sizing",
    "--sagemaker-thread-count": "SageMaker thread pool sizing",
    "--vertex-ai-thread-count": "Vertex AI thread pool sizing",
    "--enable-peer-access": "CUDA peer access settings",
    "--min-supported-compute-capability": "GPU compute capability filtering",
    "--repoagent-directory": "repository agents",
    "--cache-directory": "cache plugin directories",
    # the rest of Triton's flags (its command_line_parser's list): refusing one would stop a
    # Triton start-up script (L0_decoupled passes --grpc-max-response-pool-size=1)
    "--buffer-manager-thread-count": "parallel input copy threads",
    "--cuda-virtual-address-size": "CUDA virtual address reservations",
    "--grpc-infer-thread-count": "gRPC inference thread sizing",
    "--grpc-max-connection-age": "gRPC connection age limits",
    "--grpc-max-response-pool-size": "gRPC response pool sizing",
    "--host-policy": "host (NUMA) policies",
    "--model-load-gpu-limit": "GPU memory limits for model loading",
}


# the deprecated trace flags and what replaces each (tritonserver's warning names it)
_DEPRECATED_TRACE_FLAGS = {
    "--trace-file": "--trace-config triton,file=<filepath>",
    "--trace-level": "--trace-config level=<OFF|TIMESTAMPS|TENSORS>",
    "--trace-rate": "--trace-config rate=<rate value>",
    "--trace-count": "--trace-config count=<count value>",
    "--trace-log-frequency": "--trace-config triton,log-frequency=<log frequency value>",
}


class FlagError(ValueError):
    """A command line the parser refuses, for callers that are not a command line (the
    in-process API): argparse's message, naming the flag."""


class _Parser(argparse.ArgumentParser):
    """argparse, which exits on a bad command line, or raises :class:`FlagError` instead."""

    raise_errors = False

    def error(self, message: str) -> Any:
        if self.raise_errors:
            raise FlagError(message)
        return super().error(message)


def build_parser(prog: str = "python -m nursery serve",
                 raise_errors: bool = False) -> _Parser:
    parser = _Parser(
        prog=prog,
        description="Serve the models of one or more Triton-style model repositories over "
        "KServe v2 HTTP (and gRPC), with Triton's flags.",
    )
    parser.raise_errors = raise_errors
    parser.add_argument(
        "--model-repository", "--model-store", action="append", default=None, metavar="<path>",
        help="Path to model repository directory, or a bucket: s3://bucket/path, "
        "s3://host:port/bucket/path, gs://bucket/path, as://account/container/path. It may be "
        "specified multiple times to add multiple model repositories. Note that if a model is "
        "not unique across all model repositories at any time, the model will not be available. Defaults to "
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
    _bool_flag(parser, "--reuse-http-port", False,
               "Let several servers listen on the same HTTP port (SO_REUSEPORT): each of them "
               "must set this; the kernel spreads the connections.")
    _bool_flag(parser, "--reuse-grpc-port", False,
               "Let several servers listen on the same gRPC port (SO_REUSEPORT): each of them "
               "must set this; the kernel spreads the connections.")
    parser.add_argument(
        "--grpc-infer-response-compression-level", choices=["none", "low", "medium", "high"],
        type=str.lower,  # as Triton reads it, in any case
        default="none", metavar="<string>",
        help="Compress the gRPC inference responses at this level (none, low, medium or "
        "high), with gzip when the client accepts it. Default is none.")
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
        "--cache-config=<cache_name>,<setting>=<value>. This server has the 'local' cache "
        "(--cache-config local,size=<bytes>: a response cache of that many bytes in this "
        "process) and the 'redis' cache (--cache-config redis,host=<host> --cache-config "
        "redis,port=<port>, and optionally user, password, db, connect_timeout, "
        "socket_timeout, pool_size, wait_timeout, tls_enabled, cert, key, cacert, sni).",
    )
    parser.add_argument(
        "--rate-limit", choices=["off", "execution_count"], default="off", type=str.lower,
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
    for flag, instead in _DEPRECATED_TRACE_FLAGS.items():
        parser.add_argument(flag, action="append", default=[], metavar="<value>",
                            help=f"DEPRECATED: use {instead}.")
    parser.add_argument(
        "--model-control-mode", choices=["none", "poll", "explicit"], default="none",
        type=str.lower,  # Triton reads the mode in any case (L0_model_namespacing: POLL)
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
        "--cloud-cache-directory", default="", metavar="<path>",
        help="(nursery only) Keep the files of s3://, gs:// and as:// model repositories in "
        "this folder, keyed by each object's ETag or generation, so that a reload or a restart "
        "downloads only the objects that changed. Without it, downloads go to a temporary "
        "folder under TRITON_AWS_MOUNT_DIRECTORY / TRITON_GCS_MOUNT_DIRECTORY / "
        "TRITON_AZURE_MOUNT_DIRECTORY (or the system's temporary folder), removed at exit.",
    )
    _bool_flag(parser, "--model-load-on-demand", False,
               "(nursery only; explicit mode) A request for a model of the repository that is "
               "not loaded loads it, then is served; requests arriving meanwhile wait for the "
               "same load.")
    parser.add_argument(
        "--model-load-on-demand-timeout-secs", type=float, default=60.0, metavar="<float>",
        help="(nursery only) How long requests wait for a load on demand. Default is 60.")
    parser.add_argument(
        "--model-load-budget", action="append", default=[], metavar="<string>",
        help="(nursery only; explicit mode) models=<n> and/or bytes=<size> (2G, 512Mi, ...): "
        "after each load, the least recently used idle models are unloaded until the loaded "
        "ones fit; a model with requests in flight or named by --model-load-pin never is.")
    parser.add_argument(
        "--model-load-pin", action="append", default=[], metavar="<string>",
        help="(nursery only) A model --model-load-budget never unloads. Repeatable.")
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
    parser.add_argument(
        "--model-config-name", default=None, metavar="<string>",
        help="A custom configuration name: a model whose folder has configs/<name>.pbtxt is "
        "configured by that file instead of config.pbtxt (the others by config.pbtxt). No "
        "space allowed. Default: config.pbtxt for every model.")
    _bool_flag(parser, "--model-namespacing", False,
               "Serve models of the same name from different repositories, each in the "
               "namespace of its repository. A request for a name that several models hold is "
               "refused as ambiguous; an ensemble's steps take the model of its own "
               "repository first.")
    parser.add_argument(
        "--model-load-retry-count", type=int, default=0, metavar="<int>",
        help="How many times a model version that fails to load is tried again before the "
        "load fails. Default is 0.")
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
    parser.add_argument("--log-verbose", type=_int_bool, default=0, metavar="<int>",
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
    _door_flags(parser)
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
        "--http-frontend-processes", type=_non_negative, default=0, metavar="<int>",
        help="(nursery only) Serve the HTTP port from this many processes beside the engine: "
        "each parses, decodes and encodes on a core of its own, and hands the decoded "
        "inference requests to the one engine, which still schedules and batches every "
        "request of every process. 0 (the default): the engine serves the port alone. Used "
        "with --http-server=nursery only.",
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
        "nursery-instance-mode=process (each instance in a stub process of its own, the "
        "default, as in Triton) or thread (on the server's instance thread).")
    parser.add_argument(
        "--backend-directory", default="/opt/tritonserver/backends", metavar="<string>",
        help="The global directory searched for backends. nursery serves Python-based "
        "backends from it: a model whose configuration names backend \"<name>\" runs "
        "<dir>/<name>/model.py. Default is /opt/tritonserver/backends.")
    for flag, feature in _LATER_FLAGS.items():
        parser.add_argument(flag, action="append", default=None, metavar="<value>",
                            help=f"Accepted for compatibility; {feature} is not active yet.")
    _openai_flags(parser)
    _sagemaker_flags(parser)
    _vertex_ai_flags(parser)
    return parser


def _sagemaker_flags(parser: argparse.ArgumentParser) -> None:
    _bool_flag(parser, "--allow-sagemaker", False,
               "Allow the server to listen for Sagemaker requests.")
    parser.add_argument("--sagemaker-port", type=int, default=8080, metavar="<int>",
                       help="The port for the server to listen on for Sagemaker requests. "
                       "Default is 8080.")
    parser.add_argument("--sagemaker-safe-port-range", default=None, metavar="<string>",
                       help="Set the allowed port range for endpoints other than the "
                       "SageMaker endpoints (<start>-<end>).")


def _sagemaker_settings(parser: argparse.ArgumentParser, args: argparse.Namespace,
                        environ: Mapping[str, str]) -> SageMakerSettings | None:
    if not args.allow_sagemaker:
        return None
    if not 0 <= args.sagemaker_port <= 65535:
        parser.error("--sagemaker-port must be a port number")
    safe_range = None
    if args.sagemaker_safe_port_range is not None:
        first, dash, last = args.sagemaker_safe_port_range.partition("-")
        try:
            if not dash:
                raise ValueError
            safe_range = (int(first), int(last))
        except ValueError:
            parser.error(f"--sagemaker-safe-port-range {args.sagemaker_safe_port_range}: "
                         "expected <start>-<end>")
    default = SageMakerSettings()
    return SageMakerSettings(
        port=args.sagemaker_port, address=args.http_address, safe_range=safe_range,
        default_model=environ.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME", default.default_model),
        ping_mode=environ.get("SAGEMAKER_TRITON_PING_MODE", default.ping_mode),
        inference_type=environ.get("SAGEMAKER_TRITON_INFERENCE_TYPE", default.inference_type),
        models_root=os.path.abspath(environ.get("NURSERY_SAGEMAKER_MODELS_ROOT",
                                                default.models_root)))


def _vertex_ai_flags(parser: argparse.ArgumentParser) -> None:
    _bool_flag(parser, "--allow-vertex-ai", False,
               "Allow the server to listen for Vertex AI requests (true by default when "
               "AIP_MODE=PREDICTION, and then --allow-http and --allow-grpc are false by "
               "default).")
    parser.add_argument("--vertex-ai-port", type=int, default=None, metavar="<int>",
                        help="The port for the server to listen on for Vertex AI requests. "
                        "Default is AIP_HTTP_PORT if set, 8080 otherwise.")
    parser.add_argument("--vertex-ai-default-model", default="", metavar="<string>",
                        help="The name of the model to use for single-model inference "
                        "requests (the predict route without a redirect).")


def _vertex_ai_defaults(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Triton's defaults in a Vertex AI container: ``AIP_MODE=PREDICTION`` turns the Vertex AI
    frontend on and the HTTP and gRPC ports off unless the flags say otherwise."""
    if environ.get("AIP_MODE", "") == "PREDICTION":
        parser.set_defaults(allow_vertex_ai=True, allow_http=False, allow_grpc=False)


def _vertex_ai_settings(parser: argparse.ArgumentParser, args: argparse.Namespace,
                        environ: Mapping[str, str]) -> VertexAiSettings | None:
    if not args.allow_vertex_ai:
        return None
    port = args.vertex_ai_port
    if port is None:
        text = environ.get("AIP_HTTP_PORT", "8080")
        try:
            port = int(text)
        except ValueError:
            parser.error(f"AIP_HTTP_PORT: expected a port number, got '{text}'")
    if not 0 <= port <= 65535:
        parser.error("--vertex-ai-port must be a port number")
    return VertexAiSettings(
        port=port, address=args.http_address, default_model=args.vertex_ai_default_model,
        predict_route=environ.get("AIP_PREDICT_ROUTE", ""),
        health_route=environ.get("AIP_HEALTH_ROUTE", ""))


def port_collision(ports: list[tuple[str, str, int, tuple[int, int] | None]]) -> str | None:
    """Triton's check of the ports it is to listen on (``CheckPortCollision``): (service,
    address, port, the range it allows the others) each; the first conflict in Triton's
    words, or None. A service with a range is compared with every other one on its address,
    the others only with those after them."""
    for i, (name, address, port, allowed) in enumerate(ports):
        for j, (other, other_address, other_port, _) in enumerate(ports):
            if j == i or (allowed is None and j < i) or address != other_address:
                continue
            if allowed is not None and not allowed[0] <= other_port <= allowed[1]:
                return (f"The server cannot listen to {other} requests at port {other_port}, "
                        f"allowed port range is [{allowed[0]}, {allowed[1]}]")
            if port == other_port:
                return (f"The server cannot listen to {name} requests and {other} requests "
                        f"at the same address and port {address}:{port}")
    return None


def _openai_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of Triton's OpenAI-compatible frontend; it runs in the same process."""
    group = parser.add_argument_group(
        "OpenAI-compatible frontend", "Off unless --openai-port is given (docs/llm.md).")
    group.add_argument("--openai-port", type=int, default=None, metavar="<int>",
                       help="Serve the OpenAI-compatible API (/v1/chat/completions, "
                       "/v1/completions, /v1/embeddings, /v1/models) on this port. Triton's "
                       "frontend uses 9000. Default: off.")
    group.add_argument("--openai-address", default=None, metavar="<string>",
                       help="(nursery only) The address the OpenAI frontend binds to. Default "
                       "is the same as --http-address.")
    group.add_argument("--tokenizer", default="", metavar="<path>",
                       help="A local tokenizer folder (tokenizer.json and tokenizer_config.json "
                       "with its chat_template) used for chat prompts and token counts of "
                       "every model. Without it, a model's own <model>/tokenizer/ folder is "
                       "used; a model with neither cannot serve chat completions.")
    group.add_argument("--lora-separator", default="", metavar="<string>",
                       help="LoRA name selection may be appended to the model name following "
                       "this separator (the adapters listed in the version folder's "
                       "multi_lora.json).")
    group.add_argument("--default-max-tokens", type=int, default=16, metavar="<int>",
                       help="The maximum number of tokens to generate when a request does not "
                       "say. Default is 16.")
    group.add_argument("--chat-template", default="", metavar="<path>",
                       help="A Jinja chat template file used instead of the tokenizer's.")
    group.add_argument("--backend", default="", choices=["", "vllm", "tensorrtllm"],
                       metavar="<vllm|tensorrtllm>",
                       help="The request format (tensor names) for every model, instead of the "
                       "one chosen per model (vLLM for backend vllm or a sampling_parameters "
                       "input, TRT-LLM otherwise).")
    group.add_argument("--tool-call-parser", default="",
                       choices=["", "llama3", "hermes", "mistral"],
                       metavar="<llama3|hermes|mistral>",
                       help="Specify the parser for handling tool calling related response "
                       "text: 'llama3' (JSON calls), 'hermes' (<tool_call> blocks) or "
                       "'mistral' ([TOOL_CALLS] and a JSON list). Needed for requests with "
                       "tools and an \"auto\" tool_choice.")
    group.add_argument("--max-tool-call-parse-bytes", type=int,
                       default=DEFAULT_TOOL_CALL_PARSE_BYTES,
                       metavar="<int>",
                       help="The most output (characters of text) the streaming tool-call "
                       "parser reads per request; past it the stream ends with finish_reason "
                       "'length' and the model's inference is cancelled. Default is 131072.")
    group.add_argument("--openai-max-input-size", type=int,
                       default=DEFAULT_OPENAI_MAX_INPUT_SIZE, metavar="<int>",
                       help="The largest OpenAI request body in bytes. Default is 67108864 "
                       "(64 MiB, Triton's frontend's --http-max-input-size).")
    group.add_argument("--openai-restricted-api", nargs=3, action="append", default=[],
                       metavar=("APIs", "Restricted Key", "Restricted Value"),
                       help="Restrict access to groups of the OpenAI routes: '<API_1>,<API_2>,... "
                       "<restricted-key> <restricted-value>' (APIs: inference, "
                       "model-repository, metrics, health), e.g. 'inference,model-repository "
                       "admin-key admin-value': those routes then answer 401 unless the request "
                       "carries that header with that value. May be given once per group of "
                       "APIs. Default: every route open.")


def _openai_settings(parser: argparse.ArgumentParser,
                     args: argparse.Namespace) -> OpenAISettings | None:
    if args.openai_port is None:
        for flag in ("tokenizer", "lora_separator", "chat_template", "backend",
                     "tool_call_parser", "openai_restricted_api"):
            if getattr(args, flag):
                parser.error(f"--{flag.replace('_', '-')} needs --openai-port")
        return None
    if not 0 <= args.openai_port <= 65535:
        parser.error("--openai-port must be a port number")
    if args.default_max_tokens <= 0:
        parser.error("--default-max-tokens must be positive")
    if args.openai_max_input_size <= 0:
        parser.error("--openai-max-input-size must be positive")
    if args.max_tool_call_parse_bytes <= 0:
        parser.error("--max-tool-call-parse-bytes must be positive")
    try:  # Triton's frontend refuses these at start-up, in these words
        restricted = restrictions.parse(args.openai_restricted_api)
    except restrictions.RestrictionError as exc:
        parser.error(f"--openai-restricted-api: {exc}")
    if args.tokenizer and not os.path.isdir(args.tokenizer):
        parser.error(f"--tokenizer: '{args.tokenizer}' is not a folder (a tokenizer is read "
                     "from a local folder; nothing is downloaded)")
    return OpenAISettings(
        port=args.openai_port,
        address=args.openai_address or args.http_address,
        tokenizer=os.path.abspath(args.tokenizer) if args.tokenizer else "",
        lora_separator=args.lora_separator,
        default_max_tokens=args.default_max_tokens,
        chat_template=args.chat_template,
        backend=args.backend,
        tool_call_parser=args.tool_call_parser,
        max_input_size=args.openai_max_input_size,
        max_tool_call_parse_bytes=args.max_tool_call_parse_bytes,
        restrictions=restricted,
    )


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
        "compressed one (RESOURCE_EXHAUSTED beyond it); bytes are buffered only as they "
        "arrive. Default is 2147483647 (2 GiB - 1), the largest message Triton's gRPC server "
        "takes.")
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


def _door_flags(parser: argparse.ArgumentParser) -> None:
    """TLS, restricted groups, forwarded headers, client shared memory and file uploads
    (docs/security.md)."""
    groups = ", ".join(CATEGORIES)
    _bool_flag(parser, "--grpc-use-ssl", False, "Use SSL authentication for GRPC requests.")
    _bool_flag(parser, "--grpc-use-ssl-mutual", False,
               "Use mutual SSL authentication for GRPC requests: every client must present a "
               "certificate signed by --grpc-root-cert. This option will preempt "
               "'--grpc-use-ssl' if it is also specified.")
    parser.add_argument("--grpc-server-cert", default="", metavar="<string>",
                        help="File holding PEM-encoded server certificate. Ignored unless "
                        "--grpc-use-ssl is true.")
    parser.add_argument("--grpc-server-key", default="", metavar="<string>",
                        help="File holding PEM-encoded server key. Ignored unless "
                        "--grpc-use-ssl is true.")
    parser.add_argument("--grpc-root-cert", default="", metavar="<string>",
                        help="File holding PEM-encoded root certificate, which client "
                        "certificates are checked against under --grpc-use-ssl-mutual.")
    parser.add_argument("--http-ssl-cert", default="", metavar="<string>",
                        help="(nursery only) File holding the PEM-encoded certificate (chain) "
                        "of the HTTP port: with --http-ssl-key, the port speaks HTTPS only. "
                        "Triton's HTTP port has no TLS (a proxy goes in front).")
    parser.add_argument("--http-ssl-key", default="", metavar="<string>",
                        help="(nursery only) File holding the PEM-encoded private key of "
                        "--http-ssl-cert.")
    parser.add_argument(
        "--http-restricted-api", action="append", default=[], metavar="<string>:<string>=<string>",
        help="Specify restricted HTTP api setting. The format of this flag is "
        "--http-restricted-api=<apis>:<key>=<value>. Where <api> is a comma-separated list of "
        "apis to be restricted. <key> will be additional header key to be checked when a HTTP "
        f"request is received, and <value> is the value expected to be matched. Allowed APIs: "
        f"{groups}")
    parser.add_argument(
        "--grpc-restricted-protocol", action="append", default=[],
        metavar="<string>:<string>=<string>",
        help="Specify restricted GRPC protocol setting. The format of this flag is "
        "--grpc-restricted-protocol=<protocols>:<key>=<value>. Where <protocol> is a "
        "comma-separated list of protocols to be restricted. <key> will be additional header "
        "key to be checked when a GRPC request is received (sent as the metadata key "
        f"'{GRPC_KEY_PREFIX}<key>'), and <value> is the value expected to be matched. Allowed "
        f"protocols: {groups}")
    parser.add_argument("--http-header-forward-pattern", default="", metavar="<string>",
                        help="The regular expression pattern that will be used for forwarding "
                        "HTTP headers as inference request parameters.")
    parser.add_argument("--grpc-header-forward-pattern", default="", metavar="<string>",
                        help="The regular expression pattern that will be used for forwarding "
                        "GRPC headers as inference request parameters.")
    _bool_flag(parser, "--allow-client-shm", False,
               "Allow clients to register (and unregister) system and CUDA shared memory "
               "regions. While false, registration is refused and the shared-memory "
               "extensions are not listed in server metadata; status queries still answer.")
    _bool_flag(parser, "--allow-model-file-upload", False,
               "(nursery only) Allow the model repository API's 'file:' load parameters, which "
               "write files (a model.py: code the server runs) into a model's folder. While "
               "false, a load that carries files is refused.")


def _door_settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """The door flags checked and turned into settings; a malformed one stops here with
    the reason (Triton's for the restrictions)."""
    out: dict[str, Any] = {}
    try:
        out["http_restrictions"] = parse_restrictions(
            args.http_restricted_api, "http-restricted-api", "api")
        out["grpc_restrictions"] = parse_restrictions(
            args.grpc_restricted_protocol, "grpc-restricted-protocol", "protocol",
            GRPC_KEY_PREFIX)
    except ValueError as exc:
        parser.error(str(exc))
    for side in ("http", "grpc"):
        pattern = getattr(args, f"{side}_header_forward_pattern")
        try:
            out[f"{side}_forward"] = HeaderForward(compile_forward_pattern(pattern))
        except re.error as exc:
            parser.error(f"--{side}-header-forward-pattern '{pattern}' is not a valid regular "
                         f"expression: {exc}")
    if args.grpc_use_ssl or args.grpc_use_ssl_mutual:
        if not args.grpc_server_cert or not args.grpc_server_key:
            parser.error("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
        if args.grpc_use_ssl_mutual and not args.grpc_root_cert:
            parser.error("--grpc-use-ssl-mutual needs --grpc-root-cert (the certificate that "
                         "signs the clients' certificates)")
        out["grpc_tls"] = TlsFiles(args.grpc_server_cert, args.grpc_server_key,
                                   args.grpc_root_cert, bool(args.grpc_use_ssl_mutual))
    if args.http_ssl_cert or args.http_ssl_key:
        if not args.http_ssl_cert or not args.http_ssl_key:
            parser.error("--http-ssl-cert and --http-ssl-key go together")
        out["http_tls"] = TlsFiles(args.http_ssl_cert, args.http_ssl_key)
    out["allow_client_shm"] = args.allow_client_shm
    out["allow_model_file_upload"] = args.allow_model_file_upload
    return out


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


def settings_from_args(argv: list[str], *, prog: str = "python -m nursery serve",
                       raise_errors: bool = False) -> Settings:
    """The settings of a command line. A bad one: argparse's message and exit status 2, or
    with ``raise_errors`` a :class:`FlagError` carrying the message."""
    parser = build_parser(prog, raise_errors)
    _vertex_ai_defaults(parser, os.environ)
    args = parser.parse_args(argv)
    repos = args.model_repository
    if not repos and os.environ.get("AIP_STORAGE_URI"):  # a Vertex AI container's models
        repos = [os.environ["AIP_STORAGE_URI"]]
    if not repos:
        if Path("model_repository").is_dir():
            repos = ["model_repository"]
        else:
            parser.error("--model-repository is required (no ./model_repository folder here)")
    if "*" in args.load_model and len(args.load_model) > 1:
        parser.error("Wildcard model name '*' must be the ONLY startup model if specified at all.")
    if args.load_model and args.model_control_mode != "explicit":
        parser.error("--load-model only takes effect with --model-control-mode=explicit")
    try:
        budget = parse_budget(args.model_load_budget)
    except ValueError as exc:
        parser.error(f"--model-load-budget: {exc}")
    if (args.model_load_on_demand or budget) and args.model_control_mode != "explicit":
        parser.error("--model-load-on-demand and --model-load-budget only take effect with "
                     "--model-control-mode=explicit")
    if args.model_load_on_demand_timeout_secs <= 0:
        parser.error("--model-load-on-demand-timeout-secs must be more than 0")
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
    try:
        cache = parse_cache_config(list(args.cache_config), args.response_cache_byte_size)
    except ValueError as exc:
        parser.error(str(exc))
    if cache is not None and cache.name == "local" and not cache.size:
        cache = None  # a local cache of 0 bytes keeps nothing
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
    cli_warnings = []
    for flag, instead in _DEPRECATED_TRACE_FLAGS.items():  # tritonserver's words, per use
        cli_warnings += [f"Warning: '{flag}' has been deprecated and will be removed in future "
                         f"releases. Please use '{instead} instead."] * len(
                             getattr(args, flag[2:].replace("-", "_")))
    if args.strict_model_config is not None:  # tritonserver's words, on stderr
        cli_warnings.append("Warning: '--strict-model-config' has been deprecated! Please use "
                            "'--disable-auto-complete-config' instead.")
        if args.disable_auto_complete_config and not args.strict_model_config:
            cli_warnings.append("Warning: Overriding deprecated '--strict-model-config' from "
                                "False to True in favor of '--disable-auto-complete-config'!")
    if args.response_cache_byte_size is not None:  # tritonserver's words, on stderr
        cli_warnings.append(
            "Warning: '--response-cache-byte-size' has been deprecated! This will default to "
            "the 'local' cache implementation with the provided byte size for its config. "
            "Please use '--cache-config' instead. The equivalent --cache-config CLI args "
            f"would be: '--cache-config=local,size={args.response_cache_byte_size}'")
    inactive = tuple(
        flag for flag in _LATER_FLAGS if getattr(args, flag[2:].replace("-", "_")) is not None
    )
    _check_sized_flags(parser, args)
    if args.model_config_name == "":  # given, and empty: Triton refuses to start
        parser.error("Error: empty argument for --model-config-name")
    if any(c.isspace() for c in args.model_config_name or ""):
        parser.error("--model-config-name must not contain a space")
    if args.model_load_retry_count < 0:
        parser.error("--model-load-retry-count must not be negative")
    backend_config = []
    for entry in args.backend_config:  # Triton's words for each malformed form
        backend, _, setting = entry.partition(",") if "," in entry.split("=", 1)[0] else (
            "", "", entry)
        if entry.startswith(","):
            parser.error("No backend specified. --backend-config option format is <backend "
                         f"name>,<setting>=<value> or <setting>=<value>. Got {entry}")
        key, eq, value = setting.partition("=")
        if not eq or not key or not value:
            parser.error("--backend-config option format is '<backend name>,<setting>=<value>'. "
                         f"Got {entry}")
        backend_config.append((backend, key, value))
    doors = _door_settings(parser, args)
    sagemaker = _sagemaker_settings(parser, args, os.environ)
    vertex_ai = _vertex_ai_settings(parser, args, os.environ)
    if sagemaker is not None or vertex_ai is not None:
        # Triton's check; nursery runs it with the SageMaker or Vertex AI port only
        ports: list[tuple[str, str, int, tuple[int, int] | None]] = [
            (name, address, port, None) for name, address, port, on in (
            ("HTTP", args.http_address, args.http_port, args.allow_http),
            ("GRPC", args.grpc_address, args.grpc_port, args.allow_grpc),
            ("metrics", args.metrics_address or args.http_address, args.metrics_port,
             args.allow_metrics)) if on]
        if sagemaker is not None:
            ports.append(("SageMaker", sagemaker.address, sagemaker.port, sagemaker.safe_range))
        if vertex_ai is not None:
            ports.append(("Vertex AI", vertex_ai.address, vertex_ai.port, None))
        collision = port_collision(ports)
        if collision is not None:
            parser.error(collision)
    return Settings(
        **doors,
        openai=_openai_settings(parser, args),
        sagemaker=sagemaker,
        vertex_ai=vertex_ai,
        backend_config=tuple(backend_config),
        backend_directory=Path(os.path.abspath(args.backend_directory)),
        # a repository given twice is one repository (Triton keeps them in a set)
        model_repositories=tuple(dict.fromkeys(
            parse_root(r) if is_cloud_url(r) else Path(os.path.abspath(r)) for r in repos)),
        cloud_cache_directory=(os.path.abspath(args.cloud_cache_directory)
                               if args.cloud_cache_directory else ""),
        model_load_on_demand=args.model_load_on_demand,
        model_load_on_demand_timeout_secs=args.model_load_on_demand_timeout_secs,
        model_load_budget=budget,
        model_load_pins=tuple(args.model_load_pin),
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        http_address=args.http_address,
        grpc_address=args.grpc_address,
        metrics_address=args.metrics_address or args.http_address,
        allow_http=args.allow_http,
        allow_grpc=args.allow_grpc,
        allow_metrics=args.allow_metrics,
        reuse_http_port=args.reuse_http_port,
        reuse_grpc_port=args.reuse_grpc_port,
        grpc_response_compression=args.grpc_infer_response_compression_level,
        model_control_mode=args.model_control_mode,
        model_config_name=args.model_config_name or "",
        model_namespacing=args.model_namespacing,
        model_load_retry_count=args.model_load_retry_count,
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
        cache=cache,
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
        http_frontend_processes=args.http_frontend_processes,
        grpc_server=args.grpc_server,
        arrival_log=args.arrival_log,
        inactive=inactive,
        cli_warnings=tuple(cli_warnings),
    )
