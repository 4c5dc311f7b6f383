"""The OpenAPI schema is the contract: docs/openapi.json must match the code."""

from __future__ import annotations

import json
from pathlib import Path

from trainguard.api.app import openapi_document, openapi_text

DOC = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def test_committed_schema_matches_the_application() -> None:
    assert DOC.read_text(encoding="utf-8") == openapi_text(), (
        "docs/openapi.json is out of date: run .venv/bin/python scripts/gen-openapi.py"
    )


def test_every_operation_is_versioned_documented_and_guarded() -> None:
    doc = openapi_document()
    open_paths = {"/healthz", "/metrics"}
    for path, ops in doc["paths"].items():
        assert path.startswith("/v1/") or path in open_paths, path
        for method, op in ops.items():
            assert op.get("responses"), f"{method} {path} documents no response"
            if path in open_paths:
                continue
            # Every /v1 operation names the bearer scheme: none is reachable without a role.
            assert op.get("security") == [{"HTTPBearer": []}], f"{method} {path} is not guarded"
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    json.dumps(doc)  # serialisable as committed
