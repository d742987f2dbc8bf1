"""The `tritonserver` stand-in of the Triton qa harness (scripts/triton_qa/run.py).

Triton's qa scripts start `$SERVER $SERVER_ARGS` and later `kill $SERVER_PID`. The harness points
`SERVER` at a two-line shell script that runs this file, which maps tritonserver's command line
onto `python -m nursery serve` and *replaces itself* with that process (os.execve), so the PID the
script holds is nursery's and its signals reach nursery directly.

nursery accepts Triton's flags itself, so the mapping is nearly the identity. What it changes,
each change printed to stderr (the script's server log) as one `nursery-qa:` line:

- `--allow-model-file-upload=true` is appended unless the command line gives the flag: Triton
  accepts the repository API's `file:` load parameters without a flag, nursery only with it
  (docs/security.md), and Triton's scripts expect Triton's default.
- `--backend-directory=<tree>/opt/tritonserver/backends` is appended when the command line
  names none (NURSERY_QA_BACKEND_DIR): Triton's default backend directory, where the harness
  keeps its stand-ins for Triton's C++ test backends.
- `--backend-config=python,nursery-instance-mode=<mode>` is appended when the harness chose a
  Python instance mode (NURSERY_QA_PYTHON_MODE) and the command line does not choose one:
  `process` is how Triton runs Python models (a stub process per instance).

Every other argument reaches nursery as given, so a flag nursery lacks fails the start the way a
Triton user would see it.
"""
from __future__ import annotations

import os
import sys

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


def map_flags(argv: list[str], python_mode: str = "",
              backend_dir: str = "") -> tuple[list[str], list[str]]:
    """tritonserver's arguments -> (`python -m nursery serve` arguments, notes on what changed).
    ``backend_dir`` stands for Triton's default --backend-directory (/opt/tritonserver/backends,
    which the harness's tree keeps elsewhere): added when the command line names none."""
    out: list[str] = []
    notes: list[str] = []
    mode_given = False
    backends_given = False
    upload_given = False
    i = 0
    while i < len(argv):
        word = argv[i]
        if not word.startswith("--"):
            out.append(word)
            i += 1
            continue
        name, value, _ = _split(argv, i)
        if name == "--backend-config" and value is not None and "nursery-instance-mode" in value:
            mode_given = True
        backends_given = backends_given or name == "--backend-directory"
        upload_given = upload_given or name == "--allow-model-file-upload"
        out.append(word)
        i += 1
    if not upload_given:
        extra = "--allow-model-file-upload=true"
        out.append(extra)
        notes.append(f"added {extra} (Triton accepts 'file:' load parameters without a flag; "
                     "nursery keeps that door closed unless asked)")
    if backend_dir and not backends_given:
        extra = f"--backend-directory={backend_dir}"
        out.append(extra)
        notes.append(f"added {extra} (Triton's default backend directory in this tree)")
    if python_mode and not mode_given:
        extra = f"--backend-config=python,nursery-instance-mode={python_mode}"
        out.append(extra)
        notes.append(f"added {extra}")
    return out, notes


def server_env(env: dict[str, str]) -> dict[str, str]:
    """The server's environment: the project first on PYTHONPATH, the harness's recording
    hooks (meant for the test clients) taken off it, NumPy 1's ``np.NINF`` alias
    (hooks/numpy1) added for Triton's Python models."""
    root = env.get("NURSERY_QA_ROOT", "")
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != _HOOKS]
    if root:
        parts.insert(0, root)
    # NumPy 1's np.NINF for Triton's Python models (L0_nan_inf's), as Triton's container has
    parts.append(os.path.join(_HOOKS, "numpy1"))
    new = dict(env)
    new["PYTHONPATH"] = os.pathsep.join(parts)
    new.pop("NURSERY_QA_RECORD", None)
    new.pop("PYTEST_PLUGINS", None)
    return new


def main() -> None:
    args, notes = map_flags(sys.argv[1:], os.environ.get("NURSERY_QA_PYTHON_MODE", ""),
                            os.environ.get("NURSERY_QA_BACKEND_DIR", ""))
    for note in notes:
        print(f"nursery-qa: {note}", file=sys.stderr, flush=True)
    python = os.environ.get("NURSERY_QA_PYTHON") or sys.executable
    # the interpreter through a link named tritonserver (the process's name, as Triton's);
    # argv[0] stays the interpreter's path, so that the server's own children are not named so
    exe = os.environ.get("NURSERY_QA_SERVER_EXE", "")
    if not (exe and os.path.exists(exe)):
        exe = python
    os.execve(exe, [python, "-m", "nursery", "serve", *args], server_env(dict(os.environ)))


if __name__ == "__main__":
    main()
