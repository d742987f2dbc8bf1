"""``python -m nursery openai [flags]``: Triton's OpenAI frontend's own command line
(``python3 openai_frontend/main.py``), so a script that starts Triton's frontend starts nursery
with its flags unchanged.

Its flags become ``nursery serve``'s: the OpenAI port (``--openai-port``, 9000) on ``--host``
(0.0.0.0); the KServe HTTP and gRPC ports only with ``--enable-kserve-frontends`` (on
``--kserve-http-port`` 8000 and ``--kserve-grpc-port`` 8001, the same host), as Triton's
frontend opens them; no metrics port (the metrics are served at ``/metrics`` on the OpenAI
port, as there); ``--tritonserver-log-verbose-level`` as ``--log-verbose``;
``--http-max-input-size`` as ``--openai-max-input-size``; ``--model-control-mode`` (``none``
or ``explicit``), ``--load-model``, ``--tokenizer``, ``--backend``, ``--lora-separator``,
``--tool-call-parser``, ``--max-tool-call-parse-bytes``, ``--chat-template``,
``--default-max-tokens`` and ``--openai-restricted-api`` as they are. ``--uvicorn-log-level``
is accepted: there is no uvicorn here, and the port logs through nursery's log.
Start-up refusals use the frontend's words (``Error: Use of '--load-model' requires ...``,
``[ERROR] Failed to initialize FastAPI frontend: ...``) and its exit status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable

from nursery.protocol.openai import restrictions
from nursery.settings import (
    DEFAULT_OPENAI_MAX_INPUT_SIZE,
    DEFAULT_TOOL_CALL_PARSE_BYTES,
    Settings,
    settings_from_args,
)

PROG = "python -m nursery openai"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Triton Inference Server with OpenAI-Compatible RESTful API "
        "server (Triton's OpenAI frontend's command line, served by nursery).")
    triton = parser.add_argument_group("Triton Inference Server")
    triton.add_argument("--model-repository", required=True,
                        help="Path to the Triton model repository holding the models to be "
                        "served")
    triton.add_argument("--tokenizer", default=None,
                        help="Local folder of the tokenizer to use for chat templates (nothing "
                        "is downloaded)")
    triton.add_argument("--backend", default=None, choices=["vllm", "tensorrtllm"],
                        help="Manual override of the request format (input/output names)")
    triton.add_argument("--lora-separator", default=None,
                        help="LoRA name selection may be appended to the model name following "
                        "this separator")
    triton.add_argument("--tritonserver-log-verbose-level", type=int, default=0,
                        help="The server's log verbosity level")
    triton.add_argument("--host", default="0.0.0.0",
                        help="Address/host of frontends (default: '0.0.0.0')")
    triton.add_argument("--tool-call-parser", default=None,
                        help="The parser for tool calls in responses: llama3, hermes or "
                        "mistral")
    triton.add_argument("--max-tool-call-parse-bytes", type=int,
                        default=DEFAULT_TOOL_CALL_PARSE_BYTES,
                        help="Most output the streaming tool-call parser reads per request; "
                        "past it the stream ends with finish_reason 'length' and the "
                        "inference is cancelled. Default: 131072.")
    triton.add_argument("--chat-template", default=None,
                        help="A custom Jinja chat template file")
    triton.add_argument("--default-max-tokens", type=int, default=16,
                        help="Tokens to generate when a request does not say. Default: 16.")
    triton.add_argument("--model-control-mode", default="none", choices=["none", "explicit"],
                        help="'none' loads every model at start-up; 'explicit' loads the "
                        "--load-model ones and takes load/unload requests")
    triton.add_argument("--load-model", action="append", default=None,
                        help="A model to load at start-up (explicit mode; '*' for all, alone)")
    openai = parser.add_argument_group("Triton OpenAI-Compatible Frontend")
    openai.add_argument("--openai-port", type=int, default=9000,
                        help="OpenAI HTTP port (default: 9000)")
    openai.add_argument("--uvicorn-log-level", default="info",
                        choices=["debug", "info", "warning", "error", "critical", "trace"],
                        help="Accepted for Triton's command lines; nursery's log is used")
    openai.add_argument("--openai-restricted-api", nargs=3, action="append", default=None,
                        metavar=("APIs", "Restricted Key", "Restricted Value"),
                        help="Restrict access to groups of the OpenAI routes: '<API_1>,"
                        "<API_2>,... <restricted-key> <restricted-value>'")
    openai.add_argument("--http-max-input-size", type=int,
                        default=DEFAULT_OPENAI_MAX_INPUT_SIZE,
                        help="Largest OpenAI request body in bytes (default: 67108864)")
    kserve = parser.add_argument_group("Triton KServe Frontend")
    kserve.add_argument("--enable-kserve-frontends", action="store_true",
                        help="Enable the KServe Predict v2 HTTP/GRPC frontends")
    kserve.add_argument("--kserve-http-port", type=int, default=8000,
                        help="KServe Predict v2 HTTP port (default: 8000)")
    kserve.add_argument("--kserve-grpc-port", type=int, default=8001,
                        help="KServe Predict v2 GRPC port (default: 8001)")
    return parser


def serve_flags(args: argparse.Namespace) -> list[str]:
    """The ``nursery serve`` command line of the frontend's parsed flags."""
    flags = ["--model-repository", args.model_repository,
             "--model-control-mode", args.model_control_mode,
             "--log-verbose", str(args.tritonserver_log_verbose_level),
             "--openai-port", str(args.openai_port), "--openai-address", args.host,
             "--openai-max-input-size", str(args.http_max_input_size),
             "--default-max-tokens", str(args.default_max_tokens),
             "--max-tool-call-parse-bytes", str(args.max_tool_call_parse_bytes)]
    for name in ("tokenizer", "backend", "lora_separator", "tool_call_parser", "chat_template"):
        value = getattr(args, name)
        if value:
            flags += [f"--{name.replace('_', '-')}", value]
    for model in args.load_model or ():
        flags += ["--load-model", model]
    for group in args.openai_restricted_api or ():
        flags += ["--openai-restricted-api", *group]
    if args.enable_kserve_frontends:
        flags += ["--http-address", args.host, "--http-port", str(args.kserve_http_port),
                  "--grpc-address", args.host, "--grpc-port", str(args.kserve_grpc_port)]
    else:
        flags += ["--allow-http", "false", "--allow-grpc", "false"]
    return flags


def openai_settings(argv: list[str]) -> Settings | int:
    """The settings of the frontend's command line, or the exit status of a refusal (its
    message printed as Triton's frontend prints it)."""
    args = build_parser().parse_args(argv)
    if args.load_model and args.model_control_mode != "explicit":
        print("Error: Use of '--load-model' requires setting '--model-control-mode=explicit' "
              "as well.", file=sys.stderr)
        return 1
    try:
        restrictions.parse(args.openai_restricted_api or ())
    except restrictions.RestrictionError as exc:
        print(f"[ERROR] Failed to initialize FastAPI frontend: {exc}", file=sys.stderr)
        return 1
    settings = settings_from_args(serve_flags(args), prog=PROG)
    return dataclasses.replace(settings, open_metrics_port=False)


def main(argv: list[str], serve: Callable[[Settings], int]) -> int:
    """``python -m nursery openai``: ``serve`` runs the settings (``nursery.__main__``'s)."""
    settings = openai_settings(argv)
    if isinstance(settings, int):
        return settings
    return serve(settings)
