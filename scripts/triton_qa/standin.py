"""The `tritonserver` stand-in of the Triton qa harness (scripts/triton_qa/run.py).

Triton's qa scripts start `$SERVER $SERVER_ARGS` and later `kill $SERVER_PID`. The harness points
`SERVER` at a two-line shell script that runs this file, which maps tritonserver's command line
onto `python -m nursery serve` and *replaces itself* with that process (os.execve), so the PID the
script holds is nursery's and its signals reach nursery directly.

nursery accepts Triton's flags itself, so the mapping is nearly the identity. What it changes,
each change printed to stderr (the script's server log) as one `nursery-qa:` line:

- `--allow-client-shm[=true]` is dropped: nursery always lets clients register shared memory,
  which is Triton's behaviour with that flag true. `--allow-client-shm=false` is passed on
  unchanged (nursery then refuses the flag: the restricted-API work of issue 25).
- `--allow-model-file-upload=true` is appended unless the command line sets it: Triton writes
  the `file:` parameters of a repository load for any client (it has no such flag); nursery
  refuses them unless told (docs/security.md), and Triton's scripts load models that way.
- `--backend-config=python,nursery-instance-mode=<mode>` is appended when the harness chose a
  Python instance mode (NURSERY_QA_PYTHON_MODE) and the command line does not choose one:
  `process` is how Triton runs Python models (a stub process per instance).

Every other argument reaches nursery as given, so a flag nursery lacks fails the start the way a
Triton user would see it.
"""
from __future__ import annotations

import os
import sys

_TRUE = ("true", "1", "on", "yes")
UPLOAD = "--allow-model-file-upload=true"
_HOOKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hooks")


def _split(argv: list[str], i: int) -> tuple[str, str | None, int]:
    """The flag at argv[i], its value (inline `=v` or the next word when that is not a flag)
    and the index after it."""
    word = argv[i]
    if "=" in word:
        name, value = word.split("=", 1)
        return name, value, i + 1
    if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
        return word, argv[i + 1], i + 2
    return word, None, i + 1


def map_flags(argv: list[str], python_mode: str = "") -> tuple[list[str], list[str]]:
    """tritonserver's arguments -> (`python -m nursery serve` arguments, notes on what changed)."""
    out: list[str] = []
    notes: list[str] = []
    mode_given = False
    upload_given = False
    i = 0
    while i < len(argv):
        word = argv[i]
        if not word.startswith("--"):
            out.append(word)
            i += 1
            continue
        name, value, after = _split(argv, i)
        if name == "--allow-client-shm":
            # a bare flag or a following word that is not a boolean is not its value
            if value is not None and "=" not in word and value.lower() not in _TRUE + (
                    "false", "0", "off", "no"):
                value, after = None, i + 1
            if value is None or value.lower() in _TRUE:
                notes.append(f"dropped {' '.join(argv[i:after])} (nursery always allows "
                             "client shared memory)")
                i = after
                continue
        if name == "--backend-config" and value is not None and "nursery-instance-mode" in value:
            mode_given = True
        if name == "--allow-model-file-upload":
            upload_given = True
        out.append(word)
        i += 1
    if not upload_given:
        out.append(UPLOAD)
        notes.append(f"added {UPLOAD} (Triton writes a load's files for any client)")
    if python_mode and not mode_given:
        extra = f"--backend-config=python,nursery-instance-mode={python_mode}"
        out.append(extra)
        notes.append(f"added {extra}")
    return out, notes


def server_env(env: dict[str, str]) -> dict[str, str]:
    """The server's environment: the project first on PYTHONPATH, the harness's recording
    hooks (meant for the test clients) taken off it."""
    root = env.get("NURSERY_QA_ROOT", "")
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != _HOOKS]
    if root:
        parts.insert(0, root)
    new = dict(env)
    new["PYTHONPATH"] = os.pathsep.join(parts)
    new.pop("NURSERY_QA_RECORD", None)
    new.pop("PYTEST_PLUGINS", None)
    return new


def main() -> None:
    args, notes = map_flags(sys.argv[1:], os.environ.get("NURSERY_QA_PYTHON_MODE", ""))
    for note in notes:
        print(f"nursery-qa: {note}", file=sys.stderr, flush=True)
    python = os.environ.get("NURSERY_QA_PYTHON") or sys.executable
    os.execve(python, [python, "-m", "nursery", "serve", *args], server_env(dict(os.environ)))


if __name__ == "__main__":
    main()
