#!/usr/bin/env python3
"""Regenerate the betterproto code in nursery/schema from protos/.

    python scripts/gen_protos.py            # rewrite the committed code
    python scripts/gen_protos.py --check    # exit 1 if the committed code is stale

Needs the `test` extra (grpcio-tools for protoc, betterproto[compiler] for the plugin).

A package's gRPC services (client stubs and server bases) go into a module of their own,
``services.py`` beside its messages: importing the messages (the configuration, a Python
stub process) then never loads grpclib's server.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
TARGET = ROOT / "nursery" / "schema"
HEADER = "# Generated from protos/ by scripts/gen_protos.py. Do not edit.\n"
SERVICES_NOTE = ("# The package's gRPC services, apart from its messages (those come from the "
                 "package itself).\n")
# what only the services use, at run time, in the generated imports
SERVICE_IMPORTS = ("import grpclib\n", "from betterproto.grpc.grpclib_server import ServiceBase\n")


def generate(out: Path) -> None:
    sources = sorted(str(p) for p in PROTOS.glob("*.proto"))
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTOS}",
         f"--python_betterproto_out={out}", *sources],
        check=True, capture_output=True,
    )
    for path in out.rglob("__init__.py"):
        text = path.read_text()
        split_services(path, text)
        text = path.read_text()
        path.write_text(HEADER + text if text else HEADER)


def split_services(path: Path, text: str) -> None:
    """Move the services of a generated package (from its first service class on: betterproto
    writes them after every message) into ``services.py``, which takes the messages from the
    package; the package keeps its messages and no longer imports grpclib."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith("class ") and (
        "(betterproto.ServiceStub)" in line or "(ServiceBase)" in line)]
    if not starts:
        return
    first = starts[0]
    body = [i for i, line in enumerate(lines) if line.startswith(("class ", "@dataclass"))]
    head = lines[:body[0]]  # the generated comments and imports
    messages = [line for line in head if line not in SERVICE_IMPORTS] + lines[body[0]:first]
    while messages and not messages[-1].strip():
        messages.pop()
    path.write_text("".join(messages) + "\n")
    services = head + ["from . import *  # noqa: F403 - the package's messages\n", "\n", "\n"]
    (path.parent / "services.py").write_text(HEADER + SERVICES_NOTE + "".join(services)
                                             + "".join(lines[first:]))


def differences(a: Path, b: Path) -> list[str]:
    cmp = filecmp.dircmp(a, b, ignore=["__pycache__"])
    found: list[str] = []

    def walk(c: filecmp.dircmp, prefix: str) -> None:
        found.extend(prefix + n for n in c.left_only + c.right_only + c.diff_files)
        for name, sub in c.subdirs.items():
            walk(sub, f"{prefix}{name}/")

    walk(cmp, "")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "_generated"
        out.mkdir()
        generate(out)
        if args.check:
            stale = differences(out, TARGET) if TARGET.exists() else ["(missing)"]
            if stale:
                print("stale generated code:", ", ".join(stale))
                return 1
            return 0
        if TARGET.exists():
            shutil.rmtree(TARGET)
        shutil.copytree(out, TARGET)
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
