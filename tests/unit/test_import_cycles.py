"""No import cycles anywhere in src/trainguard, and api reaches the controller only
through the modules it needs (not the recovery drivers).

The graph is built from the source (every ``import`` statement, also those inside
functions and ``TYPE_CHECKING`` blocks: a lazy import hides a cycle, it does not
remove it). ``from pkg import name`` is an edge to ``pkg.name`` when that is a
module, else to ``pkg`` (its ``__init__``, where that name is defined).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PKG = SRC / "trainguard"

# The recovery drivers (`trainguard run`, the reconciler, slurm watch). The API builds
# the control plane through controller.service and uses a few leaf modules; it must
# not reach into a driver directly (issue 12: "api does not import drivers").
DRIVERS = {
    "trainguard.controller.local_driver",
    "trainguard.controller.reconcile",
    "trainguard.controller.slurm_watch",
}
API_MAY_IMPORT_FROM_CONTROLLER = {
    "trainguard.controller.service",
    "trainguard.controller.operations",  # the operations interface (0230)
    "trainguard.controller.breaker",
    "trainguard.controller.repair",
    "trainguard.controller.lease",
    "trainguard.controller.node_recovery",  # serve --bmc-config builds the node step (0306)
}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _edges(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                targets.add(sub if sub in modules else module)
    return {t for t in targets if t in modules and t != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _edges(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    # The checker itself: a cycle through three modules and a self-contained tail.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_lazy_imports() -> None:
    # The store's database opens PostgreSQL through a function-level import.
    graph = _graph()
    assert "trainguard.store.postgres" in graph["trainguard.store.database"]
    assert "trainguard.store.core" in graph["trainguard.store"]


def test_no_import_cycles_in_src() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_store_dialects_do_not_import_the_core() -> None:
    graph = _graph()
    for dialect in ("trainguard.store.sqlite", "trainguard.store.postgres"):
        assert not graph[dialect] & {"trainguard.store.core", "trainguard.store"}, dialect


def test_api_does_not_import_the_recovery_drivers() -> None:
    graph = _graph()
    violations = []
    for name, targets in graph.items():
        if not name.startswith("trainguard.api"):
            continue
        for target in sorted(targets):
            if target in DRIVERS or (
                target.startswith("trainguard.controller")
                and target not in API_MAY_IMPORT_FROM_CONTROLLER
            ):
                violations.append(f"{name} imports {target}")
    assert not violations, "\n".join(violations)
