"""ruff (configured in pyproject.toml, flake8-async rules included) passes on the tree."""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.conftest import ROOT


def test_ruff_is_clean() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "nursery", "tritonserver",
                           "tritonfrontend", "tests", "scripts", "bench"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _thread_clients_left_open() -> list[str]:
    """tritonclient HTTP clients made inside a nested function (a thread's body, in these
    tests) that are neither a ``with`` item nor closed in that function."""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for outer in ast.walk(tree):
            if not isinstance(outer, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(outer):
                if inner is outer or not isinstance(inner, ast.FunctionDef):
                    continue
                nodes = list(ast.walk(inner))
                managed = {id(item.context_expr) for node in nodes
                           if isinstance(node, ast.With) for item in node.items}
                closes = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                             and n.func.attr == "close" for n in nodes)
                for n in nodes:
                    if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                            and n.func.attr == "InferenceServerClient"
                            and getattr(n.func.value, "id", "") == "httpclient"
                            and id(n) not in managed and not closes):
                        found.append(f"{path.relative_to(ROOT)}:{n.lineno} ({inner.name})")
    return found


def test_clients_made_in_threads_are_closed_there() -> None:
    """A tritonclient HTTP client left to the garbage collector can leak its pooled socket
    (an error's traceback puts it in a cycle, collected by whichever thread allocates next),
    and the ResourceWarning fails some unrelated later test. The e2e conftest closes the
    clients a test body makes on the main thread; one made in another thread must be closed
    in that thread, as gevent cannot close a socket of another thread's hub."""
    assert _thread_clients_left_open() == []
