"""A small synchronous client of the HTTP API, for the CLIs' ``--server URL`` option.

The token comes from ``--token-file`` or the ``TRAINGUARD_TOKEN`` environment
variable. Errors carry the server's message, so a CLI can print it as is.
"""

from __future__ import annotations

import os
from typing import Any

import httpx

from trainguard.api.auth import read_token

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

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self._do("POST", path, json=body)

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


__all__ = ["SERVER_ENV", "TOKEN_ENV", "ApiClient", "ApiError", "resolve_token"]
