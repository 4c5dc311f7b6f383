"""The agent is a signals-level client: it may import model, diagnose and signals only."""

from __future__ import annotations

import ast
from pathlib import Path

AGENT = Path(__file__).resolve().parents[2] / "src" / "trainguard" / "agent"
ALLOWED = {"agent", "model", "diagnose", "signals"}


def test_agent_imports_only_lower_layers() -> None:
    bad = []
    for path in AGENT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                parts = name.split(".")
                if parts[0] == "trainguard" and len(parts) > 1 and parts[1] not in ALLOWED:
                    bad.append(f"{path.name} imports {name}")
    assert not bad, bad
