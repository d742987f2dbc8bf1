"""The house's shape, checked on every run: no import cycle among nursery's modules (imports
under TYPE_CHECKING count: a cycle hidden from the interpreter is still a cycle to a reader),
no function-level import of a nursery module except the lazy imports of optional parts, a
small top level, and a Python stub process that starts without the server's side."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "nursery"

# function-level imports that exist to keep an optional part optional, or a Python stub
# process's start short (it imports the backend's instance side only), not to dodge a cycle
LAZY = {
    ("nursery.__main__", "nursery.simulate.cli"),  # `serve` never loads the research kit
    ("nursery", "nursery.embed"),  # `import nursery` stays light; nursery.Server on first use
    ("nursery.__main__", "nursery.analyze.cli"),  # nor the configuration search
    ("nursery.protocol.card_servers", "nursery.protocol.http.quart_app"),  # card-servers extra
    ("nursery.protocol.card_servers", "nursery.protocol.grpc.grpclib_server"),
    # the stub's start: the server's side of stub processes (and trio) on the server only
    ("nursery.backends.python.backend", "nursery.backends.python.process"),
    ("nursery.backends.python.outbox", "nursery.actors.mailbox"),  # and trio: answers on the server
}
TOP_LEVEL = {"core", "errors", "messages", "server", "settings", "types"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        name = ".".join(parts)
        if not name.startswith("nursery.schema"):
            out[name] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """(every nursery module ``name`` imports, those imported inside a function)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    local: set[str] = set()
    in_function: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function.update(id(n) for n in ast.walk(node) if n is not node)
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            # ``from pkg import module`` imports the module; ``from module import name`` it
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        hits = {t for t in targets if t in known and t != name}
        found |= hits
        if id(node) in in_function:
            local |= hits
    return found, local


def test_no_import_cycles_and_no_dodging_imports() -> None:
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    dodging = []
    for name, path in modules.items():
        graph[name], local = _imports(name, path, known)
        dodging += [(name, target) for target in local if (name, target) not in LAZY]
    assert not dodging, f"function-level imports of nursery modules: {sorted(dodging)}"

    # Tarjan's strongly connected components
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_top_level_stays_small() -> None:
    flat = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    assert flat == TOP_LEVEL, f"top-level modules changed: {sorted(flat ^ TOP_LEVEL)}"


# what a Python stub process must not load at its start (each costs its import time on every
# stub start, once per instance of every Python model): the server's side of stub processes,
# trio, grpclib's server (the gRPC services), the cloud storage code, the sequence policy
STUB_NEVER = ("nursery.backends.python.process", "nursery.actors", "trio", "outcome",
              "grpclib.server", "nursery.schema.inference.services", "nursery.config.storage",
              "nursery.config.repository", "nursery.scheduling.sequence_policy",
              "nursery.observability.stats")


def test_a_python_stub_starts_without_the_server_side() -> None:
    code = ("import sys, nursery.backends.python.triton_python_backend_stub\n"
            "print('\\n'.join(sorted(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True,
                          text=True, check=True)
    loaded = proc.stdout.split()
    found = sorted(m for m in loaded for never in STUB_NEVER
                   if m == never or m.startswith(never + "."))
    assert not found, f"a stub process loads server-side modules at its start: {found}"
