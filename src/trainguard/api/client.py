"""A small synchronous client of the HTTP API, for the CLIs' ``--server URL`` option.

The token comes from ``--token-file`` or the ``TRAINGUARD_TOKEN`` environment
variable. Errors carry the server's message, so a CLI can print it as is.
:class:`RemoteOperations` is the operations interface
(:class:`~trainguard.controller.operations.Operations`) over this client.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx

from trainguard.api.auth import read_token
from trainguard.controller.operations import (
    ErrorKind,
    Json,
    OperationError,
    Target,
    validation_body,
)

TOKEN_ENV = "TRAINGUARD_TOKEN"
SERVER_ENV = "TRAINGUARD_SERVER"


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def resolve_token(token_file: str | None) -> str | None:
    if token_file:
        return read_token(token_file)
    return os.environ.get(TOKEN_ENV) or None


class ApiClient:
    def __init__(self, server: str, token: str | None, *, timeout_s: float = 30.0) -> None:
        headers = {"User-Agent": "trainguard-cli"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.server = server.rstrip("/")
        self._http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _do(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ApiError(0, f"cannot reach {self.server}: {exc}") from exc
        if resp.status_code >= 400:
            try:
                detail = resp.json().get("detail")
            except ValueError:
                detail = resp.text[:300]
            if isinstance(detail, list):  # validation errors
                detail = "; ".join(
                    f"{'.'.join(str(p) for p in d.get('loc', ()))}: {d.get('msg')}" for d in detail
                )
            raise ApiError(resp.status_code, f"{self.server}: {resp.status_code}: {detail}")
        if resp.status_code == 204 or not resp.content:
            return None
        return resp.json()

    def get(self, path: str, **params: Any) -> Any:
        return self._do("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: dict[str, Any], **params: Any) -> Any:
        return self._do(
            "POST", path, json=body, params={k: v for k, v in params.items() if v is not None}
        )

    def delete(self, path: str, **params: Any) -> Any:
        return self._do("DELETE", path, params={k: v for k, v in params.items() if v is not None})

    def put(self, path: str, body: dict[str, Any]) -> Any:
        return self._do("PUT", path, json=body)

    def audit_all(self, **filters: Any) -> list[dict[str, Any]]:
        """Every audit record matching the filters, following the cursor."""
        out: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            page = self.get("/v1/audit", cursor=cursor, limit=1000, **filters)
            out.extend(page["events"])
            cursor = page.get("next_cursor")
            if not cursor:
                return out


_KINDS = {
    0: ErrorKind.UNAVAILABLE,
    400: ErrorKind.INVALID,
    401: ErrorKind.DENIED,
    403: ErrorKind.DENIED,
    404: ErrorKind.NOT_FOUND,
    409: ErrorKind.CONFLICT,
    422: ErrorKind.INVALID,
}


class RemoteOperations:
    """:class:`~trainguard.controller.operations.Operations` over the HTTP API.

    The actor is the token's holder (``operator:<name>``); the server's control
    plane does the rest, exactly as for a local one.
    """

    def __init__(self, client: ApiClient) -> None:
        self.client = client

    def _call(self, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self.client, method)(path, *args, **kwargs)
        except ApiError as exc:
            kind = _KINDS.get(exc.status, ErrorKind.UNAVAILABLE)
            raise OperationError(kind, str(exc)) from exc

    @staticmethod
    def _path(target: Target) -> str:
        return f"/v1/{target.kind}s/{quote(target.ident, safe='')}"

    def whoami(self) -> str:
        me = self._call("get", "/v1/whoami")
        return f"{me['role']}:{me['name']}"

    def devices(self, host: str | None = None) -> list[Json]:
        return list(self._call("get", "/v1/devices", host=host))

    def device(self, ident: str, host: str | None = None) -> Json:
        return dict(self._call("get", self._path(Target.device(ident)), host=host))

    def device_history(self, ident: str, host: str | None = None) -> list[Json]:
        return list(self._call("get", self._path(Target.device(ident)) + "/history", host=host))

    def approvals(self, state: str | None = "pending") -> list[Json]:
        return list(self._call("get", "/v1/approvals", state=state))

    def breaker(self) -> Json:
        return dict(self._call("get", "/v1/breaker"))

    def _post_to(self, target: Target, action: str, body: Json) -> Json:
        """Every action on a target: ``POST /v1/{devices|nodes}/IDENT/ACTION``."""
        return dict(self._call("post", f"{self._path(target)}/{action}", body, host=target.host))

    def release(self, target: Target, reason: str) -> Json:
        return self._post_to(target, "release", {"reason": reason})

    def request_validation(self, target: Target, reason: str) -> Json:
        return self._post_to(target, "validation", {"reason": reason})

    def record_validation(
        self,
        target: Target,
        passed: bool,
        details: Mapping[str, Any],
        *,
        inconclusive: bool = False,
        failures_to_retire: int | None = None,
    ) -> Json:
        body = validation_body(
            passed, details, inconclusive=inconclusive, failures_to_retire=failures_to_retire
        )
        return self._post_to(target, "validation", body)

    def request_retire(self, target: Target, reason: str) -> Json:
        return self._post_to(target, "retire", {"reason": reason})

    def approve(self, approval_id: int, reason: str) -> Json:
        path = f"/v1/approvals/{int(approval_id)}/approve"
        return dict(self._call("post", path, {"reason": reason}))

    def deny(self, approval_id: int, reason: str) -> Json:
        path = f"/v1/approvals/{int(approval_id)}/deny"
        return dict(self._call("post", path, {"reason": reason}))

    def set_mode(self, scope: str, mode: str | None, reason: str) -> Json | None:
        if mode is None:
            self._call("delete", "/v1/modes", scope=scope, reason=reason)
            return None
        body = {"scope": scope, "mode": mode, "reason": reason}
        return dict(self._call("put", "/v1/modes", body))

    def reset_breaker(self, reason: str) -> Json:
        return dict(self._call("post", "/v1/breaker/reset", {"reason": reason}))


__all__ = [
    "SERVER_ENV",
    "TOKEN_ENV",
    "ApiClient",
    "ApiError",
    "RemoteOperations",
    "report_node_down",
    "resolve_token",
]


def report_node_down(server: str, node: str, reason: str) -> str | None:
    """Ask the cluster-level trainguard (``serve``) to take ``node`` out of service, as
    its agent on that node would: a fatal node finding on ``POST
    /v1/agents/NODE/findings`` (token from ``TRAINGUARD_TOKEN``); its engine drains the
    node through its own scheduler (decision 0512). ``None`` when accepted, else the
    problem."""
    import time

    from trainguard.model.findings import Culprit, Domain, Finding, Severity

    finding = Finding(
        kind="node_down",
        domain=Domain.NODE,
        at=time.time(),
        source="allocation",
        message=reason[:240],
        severity=Severity.FATAL,
        culprit=Culprit(host=node),
        signature="allocation:node_out",
    )
    body = {"id": f"alloc-{node}-{int(finding.at * 1000)}", **finding.to_dict()}
    try:
        with ApiClient(server, resolve_token(None), timeout_s=10.0) as client:
            client.post(f"/v1/agents/{node}/findings", {"findings": [body]})
    except (ApiError, ValueError) as exc:
        return str(exc)
    return None
