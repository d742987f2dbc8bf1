"""``python -m nursery serve [tritonserver flags]``."""

from __future__ import annotations

import logging
import sys

import trio

from nursery.actors.model_manager import StartupError, first_error
from nursery.server import serve
from nursery.settings import settings_from_args

USAGE = """usage: python -m nursery serve [flags]

commands:
  serve    serve a Triton-style model repository (see `python -m nursery serve --help`)
"""


def setup_logging(verbose: int) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose > 0 else logging.INFO,
        format="%(levelname).1s%(asctime)s.%(msecs)03d %(process)d %(name)s] %(message)s",
        datefmt="%m%d %H:%M:%S",
        stream=sys.stderr,
    )
    if verbose <= 1:  # third-party chatter only at --log-verbose 2 and up
        for name in ("hypercorn", "quart", "nursery.http"):
            logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command != "serve":
        print(f"unknown command '{command}'\n\n{USAGE}", end="", file=sys.stderr)
        return 2
    settings = settings_from_args(rest)
    setup_logging(settings.log_verbose)
    try:
        trio.run(serve, settings)
    except BaseException as exc:  # trio wraps failures in exception groups
        error = first_error(exc)
        if isinstance(error, KeyboardInterrupt):
            return 130
        if isinstance(error, StartupError):
            print(f"error: creating server: Internal - {error}", file=sys.stderr)
            return 1
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
