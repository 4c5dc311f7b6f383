"""The store's layout stays by concept (decision 0200): small modules, SQL in one place,
the control plane over the core's public methods, the dialects below the core.

Read from the source (``ast``), so the test names the file and line that broke a rule.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

STORE = Path(__file__).resolve().parents[2] / "src" / "trainguard" / "store"
# sql.py (queries) and schema.py (migrations); a dialect keeps only what cannot be shared
# (its transaction start, PostgreSQL's write lock).
SQL_HOMES = {"sql.py", "schema.py", "sqlite.py", "postgres.py"}
# SQL of a concept, in capitals as the store writes it (transaction control, BEGIN,
# SAVEPOINT, COMMIT, is the Database's own business).
_SQL = re.compile(r"^\s*(SELECT\s|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|CREATE\s|ALTER\s)")


def _modules() -> list[Path]:
    return sorted(p for p in STORE.glob("*.py"))


def test_every_store_module_is_under_800_lines() -> None:
    long = {p.name: n for p in _modules() if (n := len(p.read_text().splitlines())) >= 800}
    assert long == {}


def test_sql_text_lives_only_in_sql_and_schema() -> None:
    found = []
    for path in _modules():
        if path.name in SQL_HOMES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and _SQL.match(node.value)
            ):
                found.append(f"{path.name}:{node.lineno}: {node.value[:40]!r}")
    assert found == []


def test_no_store_module_touches_a_private_member_of_another_object() -> None:
    # self._x (db._x: an instance the classmethod made) is a class's own business;
    # other._x (store.db._conn, fleet._one) is not.
    found = []
    for path in _modules():
        if path.name in {"postgres.py", "sqlite.py"}:  # the dialects wrap a driver object
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (
                    isinstance(node.value, ast.Name) and node.value.id in {"self", "cls", "db"}
                )
            ):
                found.append(f"{path.name}:{node.lineno}: .{node.attr}")
    assert found == []


def test_the_dialects_and_the_database_do_not_import_the_concepts() -> None:
    below = {"database.py", "sqlite.py", "postgres.py", "backend.py", "errors.py", "schema.py"}
    concepts = {p.stem for p in _modules()} - {Path(b).stem for b in below} - {"__init__"}
    found = []
    for name in below:
        tree = ast.parse((STORE / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                mods = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                for m in mods:
                    if m.startswith("trainguard.store.") and m.split(".")[2] in concepts:
                        found.append(f"{name}: {m}")
    assert found == []
