"""The agent's HTTP client for the control plane's ``/v1/agents/{host}/...`` endpoints.

Failures are sorted by what the agent should do about them:

* :class:`Unreachable` - connection refused or reset, a timeout, 5xx, 429: the
  server is down or busy; keep everything and retry with backoff;
* :class:`Refused` - 401/403: the token is wrong; keep everything, retry slowly,
  and say so loudly (an operator must fix the token file);
* :class:`Rejected` - any other 4xx: the server will never take *this* request
  (malformed, too large); the agent sets the records aside instead of retrying
  them forever.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import yaml


class AgentError(Exception):
    pass


class Unreachable(AgentError):
    """The server is down or busy; ``retry_after``: the seconds a 429 or 503 asked for."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta seconds); ``None`` when absent or a date."""
    try:
        return None if value is None else min(max(float(value), 0.0), 300.0)
    except ValueError:
        return None


class Refused(AgentError):
    pass


class Rejected(AgentError):
    pass


def read_token_file(path: str | Path) -> str:
    """The token from a file holding it alone (first non-comment line), or from a serve-style
    token file with exactly one plain token."""
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    lines = [
        ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")
    ]
    if len(lines) == 1 and ":" not in lines[0] and "{" not in lines[0]:
        return lines[0]
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    if isinstance(data, dict):
        plain = [k for k in data if isinstance(k, str) and not k.startswith("sha256:")]
        if len(plain) == 1:
            return plain[0]
    raise AgentError(f"{p}: expected the token alone on one line")


class ServerClient:
    """One keep-alive connection to the server; not thread-safe (the sender thread owns it)."""

    def __init__(self, server: str, token: str, host: str, *, timeout_s: float = 10.0) -> None:
        self.host = host
        self._http = httpx.Client(
            base_url=server.rstrip("/"),
            headers={"Authorization": f"Bearer {token}", "User-Agent": "trainguard-agent"},
            timeout=httpx.Timeout(timeout_s, connect=min(3.0, timeout_s)),
        )

    def close(self) -> None:
        self._http.close()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            resp = self._http.post(path, json=body)
        except httpx.HTTPError as exc:
            raise Unreachable(f"{type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 500 or resp.status_code == 429:
            raise Unreachable(
                f"server answered {resp.status_code}",
                retry_after(resp.headers.get("Retry-After")),
            )
        try:
            data = resp.json()
        except ValueError:
            data = {"detail": resp.text[:500]}
        if resp.status_code in (401, 403):
            raise Refused(f"{resp.status_code}: {data.get('detail')}")
        if resp.status_code >= 400:
            raise Rejected(f"{resp.status_code}: {data.get('detail')}")
        return dict(data)

    def inventory(self, devices: list[dict[str, Any]], source: str, message: str) -> dict[str, Any]:
        return self._post(
            f"/v1/agents/{self.host}/inventory",
            {"devices": devices, "source": source, "message": message[:4000]},
        )

    def heartbeat(
        self, seq: int, at: float, buffered: int, gpus: dict[str, dict[str, float | None]]
    ) -> dict[str, Any]:
        return self._post(
            f"/v1/agents/{self.host}/heartbeat",
            {"seq": seq, "at": at, "buffered": buffered, "gpus": gpus},
        )

    def findings(self, findings: list[dict[str, Any]]) -> dict[str, Any]:
        return self._post(f"/v1/agents/{self.host}/findings", {"findings": findings})


__all__ = [
    "AgentError",
    "Refused",
    "Rejected",
    "ServerClient",
    "Unreachable",
    "read_token_file",
]
