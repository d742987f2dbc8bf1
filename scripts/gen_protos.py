#!/usr/bin/env python3
"""Regenerate the betterproto code in nursery/schema from protos/.

    python scripts/gen_protos.py            # rewrite the committed code
    python scripts/gen_protos.py --check    # exit 1 if the committed code is stale

Needs the `test` extra (grpcio-tools for protoc, betterproto[compiler] for the plugin).
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


def generate(out: Path) -> None:
    sources = sorted(str(p) for p in PROTOS.glob("*.proto"))
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTOS}",
         f"--python_betterproto_out={out}", *sources],
        check=True, capture_output=True,
    )
    for path in out.rglob("__init__.py"):
        text = path.read_text()
        path.write_text(HEADER + text if text else HEADER)


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
