"""A bounded property-based run of the whole HTTP API against its published schema.

Schemathesis generates requests for every operation of ``/v1/openapi.json`` (valid and
deliberately invalid ones: wrong types, out-of-range numbers, odd strings) and sends
them to the real application in-process (ASGI), over a real SQLite store and a real
``ControlPlane``, with a token of the role each operation needs. Every answer must be
a non-5xx response whose body matches the schema the API publishes for that status
(422 included). A few examples per operation and a deadline keep it under a minute.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi import FastAPI

from trainguard.api.app import create_app  # noqa: E402
from trainguard.api.auth import TokenTable  # noqa: E402
from trainguard.api.context import build_context  # noqa: E402
from trainguard.controller.service import ControlPlane  # noqa: E402
from trainguard.store import Store  # noqa: E402

T0 = 1_764_400_000.0
OP = "operator-token-0123456789"
AGENT = "agent-token-any-012345678"
# Per operation and mode (valid, invalid). Every operation is still exercised in both
# modes; 4 rather than 6 sends two thirds of the requests and still clears the totals
# asserted below with a wide margin (measured: 418 answers for 54 operations, 145 of them
# 2xx, 97 of them 422).
EXAMPLES_PER_OPERATION = 4
TIME_LIMIT_S = 90.0  # measured 16-25 s (about 600 requests) on the 2 shared cores


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastAPI]:
    tmp: Path = tmp_path_factory.mktemp("schemathesis")
    store = Store.open(tmp / "state.db", at=T0)
    control = ControlPlane(store, None, lambda: T0, identity="schemathesis")
    tokens = TokenTable.from_mapping(
        {OP: {"role": "operator", "name": "alice"}, AGENT: {"role": "agent", "name": "*"}}
    )
    ctx = build_context(store, tokens, control=control, clock=lambda: T0)
    ctx.start()
    yield create_app(ctx)
    ctx.stop()
    store.close()


@pytest.fixture(scope="module")
def api_schema(app: FastAPI) -> Any:
    return schemathesis.openapi.from_asgi("/v1/openapi.json", app)


def _token(path: str) -> str:
    # Ingestion takes an agent token, everything else an operator's (who may read too).
    if path.startswith("/v1/agents/") or path.endswith("/progress"):
        return AGENT
    return OP


CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance]


SENT: dict[int, int] = {}  # answers by status, over the whole run


def _run(operation: Any, mode: GenerationMode) -> list[str]:
    """Up to EXAMPLES_PER_OPERATION requests of one operation; the failures, as text."""
    failures: list[str] = []
    token = _token(operation.path)

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,  # the same requests every run: a failure reproduces
        database=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: report, do not minimise
    )
    def run(case: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {token}"}
        try:
            response = case.call_and_validate(checks=CHECKS)
            SENT[response.status_code] = SENT.get(response.status_code, 0) + 1
        except Exception as exc:  # collect every operation's failure, not only the first
            failures.append(f"{operation.method.upper()} {operation.path} [{mode}]: {exc}"[:2000])

    with contextlib.suppress(Unsatisfiable):  # nothing to make invalid (no parameters or body)
        run()
    return failures


def test_no_server_error_and_every_answer_matches_the_schema(api_schema: Any) -> None:
    started = time.monotonic()
    failures: list[str] = []
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) > 40  # the whole API, not a part of it
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            failures += _run(operation, mode)
    assert not failures, "\n\n".join(failures[:20])
    # It exercised the routes, not only the refusals in front of them.
    assert sum(SENT.values()) > 4 * len(operations)
    assert sum(n for status, n in SENT.items() if status < 300) > len(operations)
    assert SENT.get(422, 0) > len(operations)
    assert time.monotonic() - started < TIME_LIMIT_S
