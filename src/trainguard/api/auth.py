"""Bearer tokens with roles: who may read, steer, or report to the control plane.

A token file (YAML or JSON) maps each token to a role and a name::

    # .trainguard/tokens.yaml
    "k3x...":          {role: operator, name: alice}
    "sha256:9f86d0...": {role: viewer, name: grafana}      # the hash, not the token
    "q7a...":          {role: agent, name: gpu-node-017}    # per-host agent token
    "z1c...":          {role: agent, name: "*"}             # any host (a fleet proxy)

Roles (decision 0091):

* ``viewer`` reads everything (``GET``);
* ``operator`` reads and steers: approve/deny, modes, breaker reset, release, jobs;
* ``agent`` reports: inventory, heartbeats and findings for the host named by the
  token (``*``: any host), and job progress. An agent token reads nothing.

Only the SHA-256 of each token is kept in memory; a file may list the hash
itself (``sha256:<hex>``) so that the plain token lives only with its holder.
Lookup hashes the presented token, so comparison time does not depend on how
much of a guessed token is right.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger("trainguard.auth")


class Role(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    AGENT = "agent"


# What each role may do. An operator can do everything a viewer can; an agent only reports.
READ_ROLES = frozenset({Role.VIEWER, Role.OPERATOR})
OPERATE_ROLES = frozenset({Role.OPERATOR})
REPORT_ROLES = frozenset({Role.AGENT})

ANY_HOST = "*"
HASH_PREFIX = "sha256:"
MIN_TOKEN_LENGTH = 16


class TokenFileError(ValueError):
    """The token file is malformed; the message names the file and the entry."""


@dataclass(frozen=True)
class Principal:
    """Who made a request: the name and role of the token presented."""

    name: str
    role: Role

    def may_report_for(self, host: str) -> bool:
        return self.role is Role.AGENT and self.name in (ANY_HOST, host)

    @property
    def actor(self) -> str:
        """How the audit log names this principal (``operator:alice``)."""
        return f"{self.role.value}:{self.name}"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class TokenTable:
    """Token hashes -> principals. Build with :meth:`load` or :meth:`from_mapping`."""

    def __init__(self, entries: Mapping[str, Principal], source: str = "<memory>") -> None:
        self._by_hash = dict(entries)
        self.source = source

    def __len__(self) -> int:
        return len(self._by_hash)

    def authenticate(self, token: str) -> Principal | None:
        if not token:
            return None
        return self._by_hash.get(hash_token(token))

    def roles(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for p in self._by_hash.values():
            counts[p.role.value] = counts.get(p.role.value, 0) + 1
        return counts

    @classmethod
    def from_mapping(cls, data: Any, source: str = "<memory>") -> TokenTable:
        """Validate a parsed token file (``{token: {role, name}}``)."""
        if isinstance(data, Mapping) and "tokens" in data and isinstance(data["tokens"], Mapping):
            data = data["tokens"]
        if not isinstance(data, Mapping):
            raise TokenFileError(f"{source}: expected a mapping of token -> {{role, name}}")
        entries: dict[str, Principal] = {}
        for i, (key, value) in enumerate(data.items(), start=1):
            where = f"{source}: entry {i}"
            if not isinstance(key, str) or not key:
                raise TokenFileError(f"{where}: the token must be a non-empty string")
            if not isinstance(value, Mapping):
                raise TokenFileError(f"{where}: expected {{role: ..., name: ...}}")
            role_raw = value.get("role")
            try:
                role = Role(str(role_raw))
            except ValueError:
                allowed = ", ".join(r.value for r in Role)
                raise TokenFileError(
                    f"{where}: role {role_raw!r} is not one of {allowed}"
                ) from None
            name = value.get("name")
            if not isinstance(name, str) or not name.strip():
                raise TokenFileError(f"{where}: 'name' is required (who holds the token)")
            if key.startswith(HASH_PREFIX):
                digest = key[len(HASH_PREFIX) :].lower()
                if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                    raise TokenFileError(
                        f"{where}: {HASH_PREFIX} must be followed by 64 hex digits"
                    )
            else:
                if len(key) < MIN_TOKEN_LENGTH:
                    raise TokenFileError(
                        f"{where}: token shorter than {MIN_TOKEN_LENGTH} characters"
                    )
                digest = hash_token(key)
            if digest in entries:
                raise TokenFileError(f"{where}: the same token is listed twice")
            entries[digest] = Principal(name=name.strip(), role=role)
        return cls(entries, source)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TokenTable:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise TokenFileError(f"token file {p} is not a text (UTF-8) file") from exc
        except OSError as exc:
            raise TokenFileError(f"cannot read token file {p}: {exc.strerror or exc}") from exc
        try:
            data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise TokenFileError(
                f"{p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {exc}"
            ) from exc
        return cls.from_mapping(data or {}, str(p))


def token_file_warning(path: str | os.PathLike[str]) -> str | None:
    """A warning when users other than the owner may read the token file (``None`` if not).

    Like ssh with a private key: a token file holds credentials, so any permission for
    the group or others is worth saying (the file is still used: refusing would stop a
    control plane over a chmod).
    """
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None
    if mode & 0o077 == 0:
        return None
    return (
        f"warning: token file {path} is readable by other users (mode {mode:04o}); "
        f"restrict it: chmod 600 {path}"
    )


def new_token() -> str:
    return secrets.token_urlsafe(24)


def create_token_file(path: str | os.PathLike[str]) -> dict[str, str]:
    """Write a token file with one fresh token per role (mode 0600); returns role -> token.

    Used by ``trainguard serve`` when no token file exists yet, so that a fresh
    control plane is never open to anyone who can reach its port.
    """
    p = Path(path)
    p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tokens = {r.value: new_token() for r in Role}
    names = {Role.OPERATOR.value: "admin", Role.VIEWER.value: "viewer", Role.AGENT.value: ANY_HOST}
    lines = ["# trainguard tokens: token -> role and name (docs/api.md#authentication)"]
    for role, token in tokens.items():
        lines.append(f'"{token}": {{role: {role}, name: "{names[role]}"}}')
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return tokens


def read_token(path: str | os.PathLike[str]) -> str:
    """The token a client presents, from a file holding just the token (first line).

    Also accepts a token file of the serve format with exactly one plain token, so a
    test or a single-user set-up can point client and server at the same file.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TokenFileError(f"token file {p} is not a text (UTF-8) file") from exc
    except OSError as exc:
        raise TokenFileError(f"cannot read token file {p}: {exc.strerror or exc}") from exc
    if (warning := token_file_warning(p)) is not None:
        log.warning("%s", warning)  # stderr, also when logging is not configured
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    if len(lines) == 1 and ":" not in lines[0] and "{" not in lines[0]:
        return lines[0]
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    if isinstance(data, Mapping):
        plain = [k for k in data if isinstance(k, str) and not k.startswith(HASH_PREFIX)]
        if len(plain) == 1:
            return plain[0]
    raise TokenFileError(
        f"{p}: expected the token alone on the first line (or a token file with one token)"
    )


__all__ = [
    "ANY_HOST",
    "OPERATE_ROLES",
    "READ_ROLES",
    "REPORT_ROLES",
    "Principal",
    "Role",
    "TokenFileError",
    "TokenTable",
    "create_token_file",
    "hash_token",
    "new_token",
    "read_token",
]
