"""The package layout docs/ARCHITECTURE.md describes: dependencies point down (tuner, eval,
training -> envs -> models -> agent -> proto) and no module imports itself round a cycle.
Every import counts, those inside functions too: they are dependencies all the same."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("proto", "agent", "models", "envs", "eval", "training", "tuner")
# What each package may import from the others (the layers below it; the top layer's
# packages may also use one another).
ALLOWED = {
    "proto": set(),
    "agent": {"proto"},
    "models": {"agent", "proto"},
    "envs": {"models", "agent", "proto"},
    "eval": {"training", "tuner", "envs", "models", "agent", "proto"},
    "training": {"eval", "tuner", "envs", "models", "agent", "proto"},
    "tuner": {"eval", "training", "envs", "models", "agent", "proto"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue  # generated
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(filter(None, (_resolve(a.name) for a in node.names)))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                target = _resolve(f"{node.module}.{a.name}") or _resolve(node.module)
                if target:
                    found.add(target)
    return found


GRAPH = {name: _imports(path) - {name} for name, path in MODULES.items()}


def test_dependencies_point_down() -> None:
    wrong = [
        f"{m} imports {t}"
        for m, targets in GRAPH.items()
        for t in targets
        if (a := m.split(".")[0]) != (b := t.split(".")[0]) and b not in ALLOWED[a]
    ]
    assert not wrong, wrong


def test_no_import_cycles() -> None:
    """Tarjan's strongly connected components of the module graph: all of size one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
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

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not cycles, cycles
