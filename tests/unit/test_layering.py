"""The import rules of docs/architecture.md, checked on the source tree."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "trainguard"

ALLOWED: dict[str, set[str]] = {
    "model": set(),
    "checkpoints": {"model"},
    "train": {"model", "checkpoints"},
    "diagnose": {"model"},
    "policy": {"model", "diagnose"},
    "signals": {"model", "diagnose"},
    "store": {"model"},
    "schedulers": {"model", "signals", "diagnose"},
    "simulate": {"model", "policy", "checkpoints", "diagnose"},
    "preflight": {"model", "diagnose", "signals"},
    "agent": {"model", "diagnose", "signals"},
    "integrations": {"model", "train"},
}
HIGHER = {"api", "cli", "_commands"}


def _imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "trainguard" and len(parts) > 1:
                found.add(parts[1])
    return found


def _layers() -> list[str]:
    return sorted(p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists())


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_lower_layers_import_only_what_they_may(layer: str) -> None:
    pkg = SRC / layer
    if not pkg.exists():
        pytest.skip(f"{layer} not present")
    violations = []
    for path in pkg.rglob("*.py"):
        for imported in _imported_packages(path) - {layer}:
            if imported not in ALLOWED[layer] and imported != "__version__":
                violations.append(f"{path.relative_to(SRC)} imports trainguard.{imported}")
    assert not violations, "\n".join(violations)


def test_controller_does_not_import_the_command_line_or_api() -> None:
    violations = []
    for path in (SRC / "controller").rglob("*.py"):
        bad = _imported_packages(path) & HIGHER
        if bad:
            violations.append(f"{path.relative_to(SRC)} imports {sorted(bad)}")
    assert not violations, "\n".join(violations)


def test_every_module_has_a_docstring() -> None:
    missing = [
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if ast.get_docstring(ast.parse(p.read_text())) is None
    ]
    assert not missing, f"modules without a docstring: {missing}"


def test_diagnose_and_policy_read_no_clock_and_do_no_io() -> None:
    forbidden = ("time.time(", "time.monotonic(", "datetime.now(", "open(", "subprocess")
    violations = []
    for layer in ("diagnose", "policy"):
        for path in (SRC / layer).rglob("*.py"):
            text = path.read_text()
            violations += [f"{path.relative_to(SRC)}: {f}" for f in forbidden if f in text]
    assert not violations, "\n".join(violations)


# The recovery engine (controller/engine/, decision 0211) is what every mode drives;
# the drivers, the API and the concrete schedulers build on it, never the reverse.
ENGINE_MUST_NOT_IMPORT = (
    "trainguard.api",
    "trainguard.cli",
    "trainguard._commands",
    "trainguard.controller.local_driver",
    "trainguard.controller.reconcile",
    "trainguard.controller.slurm_watch",
    "trainguard.controller.service",
    "trainguard.schedulers.local",
    "trainguard.schedulers.procs",
    "trainguard.schedulers.slurm",
)


def _imported_modules(path: Path) -> set[str]:
    """Every ``trainguard`` module a file imports, ``from a import b`` as ``a.b`` too."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {m for m in found if m.startswith("trainguard.")}


def test_the_engine_imports_no_driver_no_api_and_no_concrete_scheduler() -> None:
    engine = SRC / "controller" / "engine"
    assert engine.is_dir()
    violations = []
    for path in engine.rglob("*.py"):
        for module in sorted(_imported_modules(path)):
            if any(module == bad or module.startswith(bad + ".") for bad in ENGINE_MUST_NOT_IMPORT):
                violations.append(f"{path.relative_to(SRC)} imports {module}")
    assert not violations, "\n".join(violations)


def test_the_step_function_is_pure_policy() -> None:
    imported = _imported_modules(SRC / "policy" / "step.py")
    assert all(m.split(".")[1] in {"model", "policy"} for m in imported), imported


ENGINE_CLASSES = {
    "Reconciler",
    "EngineCore",
    "EvidenceFollower",
    "HealthEnforcer",
    "AttemptSync",
    "SnapshotBuilder",
    "ActionRunner",
    "Executor",
}


def test_no_driver_subclasses_the_engine() -> None:
    """Scheduler specifics are traits the driver names (decision 0211), not a subclass
    overriding the engine's private methods (what SlurmReconciler was)."""
    engine = SRC / "controller" / "engine"
    violations = []
    for path in SRC.rglob("*.py"):
        if engine in path.parents or path == SRC / "controller" / "reconcile.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {
                    b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
                }
                if bases & ENGINE_CLASSES:
                    violations.append(f"{path.relative_to(SRC)}: class {node.name}")
    assert not violations, "\n".join(violations)
