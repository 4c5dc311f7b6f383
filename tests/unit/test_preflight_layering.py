"""The pre-flight package keeps its place: a signals-level layer, torch only inside checks."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "trainguard"
PREFLIGHT = SRC / "preflight"
ALLOWED = {"model", "diagnose", "signals", "preflight"}
# Parsers and rules tested with plain data: no I/O and no clock, like diagnose/.
PURE = ("nvsmi.py", "query.py", "results.py", "specs.py", "faults.py", "levels.py")


def _imports(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "trainguard" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_preflight_imports_only_lower_layers() -> None:
    bad = []
    for path in PREFLIGHT.rglob("*.py"):
        extra = _imports(ast.parse(path.read_text())) - ALLOWED
        if extra:
            bad.append(f"{path.name}: {sorted(extra)}")
    assert not bad, bad


def test_torch_is_never_imported_at_module_level() -> None:
    bad = []
    for path in PREFLIGHT.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:  # top-level statements only
            if isinstance(node, ast.Import | ast.ImportFrom):
                mod = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                if mod and mod.split(".")[0] == "torch":
                    bad.append(path.name)
    assert not bad, bad


def test_parsers_and_rules_do_no_io_and_read_no_clock() -> None:
    forbidden = ("time.time(", "time.monotonic(", "datetime.now(", "open(", "subprocess")
    bad = [
        f"{name}: {word}"
        for name in PURE
        for word in forbidden
        if word in (PREFLIGHT / name).read_text()
    ]
    assert not bad, bad


def test_control_plane_imports_preflight_and_its_commands_without_torch() -> None:
    code = (
        "import sys, trainguard.preflight, trainguard.preflight.runner, "
        "trainguard._commands.preflight, trainguard._commands.validate, trainguard.cli;"
        "trainguard.cli.build_parser();"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
