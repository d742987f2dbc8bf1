"""``python -m nursery serve [tritonserver flags]``, and the ``tritonserver`` command (the same
server under Triton's name, for images and charts that run ``tritonserver <flags>``)."""

from __future__ import annotations

import sys
from functools import partial

import trio

from nursery.errors import StartupError, first_error
from nursery.observability.logs import LogManager, log_manager_for
from nursery.protocol.openai.cli import main as openai_main
from nursery.server import serve
from nursery.settings import Settings, settings_from_args

USAGE = """usage: python -m nursery serve [flags]

commands:
  serve    serve a Triton-style model repository (see `python -m nursery serve --help`)
  openai   the same server under the command line of Triton's OpenAI frontend
           (openai_frontend/main.py; `python -m nursery openai --help`)
  simulate replay scheduling policies on a virtual clock (`python -m nursery simulate --help`)
  analyze  find a model's best configuration: profile, simulate, verify
           (`python -m nursery analyze --help`)
"""


def setup_logging(settings: Settings) -> LogManager:
    """Triton's logging flags; the manager also serves the logging extension."""
    return log_manager_for(settings)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "simulate":  # the scheduling-policy research kit (nursery/simulate)
        from nursery.simulate.cli import main as simulate_main

        return simulate_main(rest)
    if command == "analyze":  # the configuration search (nursery/analyze)
        from nursery.analyze.cli import main as analyze_main

        return analyze_main(rest)
    if command == "openai":  # Triton's OpenAI frontend's command line (openai_frontend/main.py)
        return openai_main(rest, run)
    if command != "serve":
        print(f"unknown command '{command}'\n\n{USAGE}", end="", file=sys.stderr)
        return 2
    return serve_command(rest)


def serve_command(rest: list[str], prog: str = "python -m nursery serve") -> int:
    return run(settings_from_args(rest, prog=prog))


def run(settings: Settings) -> int:
    """Serve ``settings`` until stopped: the exit status."""
    for warning in settings.cli_warnings:
        print(warning, file=sys.stderr)
    try:
        log_manager = setup_logging(settings)
    except OSError as exc:
        print(f"error: cannot open log file '{settings.log_file}': {exc}", file=sys.stderr)
        return 1
    try:
        trio.run(partial(serve, settings, log_manager=log_manager))
    except BaseException as exc:  # trio wraps failures in exception groups
        error = first_error(exc)
        if isinstance(error, KeyboardInterrupt):
            return 130
        if isinstance(error, StartupError):
            print(f"error: creating server: Internal - {error}", file=sys.stderr)
            return 1
        raise
    return 0


def tritonserver(argv: list[str] | None = None) -> int:
    """``tritonserver [flags]``: Triton's command line, as KServe's ``kserve-tritonserver``
    runtime and Triton's Helm charts give it (``--model-store=/mnt/models --grpc-port=9000
    --http-port=8080 --allow-grpc=true --allow-http=true``)."""
    return serve_command(list(sys.argv[1:] if argv is None else argv), prog="tritonserver")


if __name__ == "__main__":
    sys.exit(main())
