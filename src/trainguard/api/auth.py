"""Bearer tokens with roles: who may read, steer, or report to the control plane.

A token file (YAML or JSON) maps each token to a role and a name::

    # .trainguard/tokens.yaml
    "k3x...":          {role: operator, name: alice}
    "sha256:9f86d0...": {role: viewer, name: grafana}      # the hash, not the token
    "q7a...":          {role: agent, name: gpu-node-017}    # one host's agent
    "z1c...":          {role: agent, name: "*"}             # a fleet proxy (by hand only)

Roles (decision 0091):

* ``viewer`` reads everything (``GET``);
* ``operator`` reads and steers: approve/deny, modes, breaker reset, release, jobs;
* ``agent`` reports inventory, heartbeats and findings for the one host named by the
  token, and nothing about another host: a culprit, device or GPU figure of another
  host's card is refused (decision 0402). An agent token reads nothing and posts no
  job's progress.
* ``job`` (never in a token file): the progress token ``POST /v1/jobs/submit`` issues
  to one job, stored hashed in the store (:mod:`trainguard.api.job_tokens`); it posts
  that job's progress and nothing else (decision 0403).

The any-host agent token (name ``*``, a *fleet proxy*) is an explicit opt-in an
operator writes by hand: it reports for any host (each report still only about the
host in its path) and may post any job's progress. ``serve`` never creates one, and
``trainguard tokens add`` refuses to (decision 0402).

Only the SHA-256 of each token is kept in memory; a file may list the hash
itself (``sha256:<hex>``) so that the plain token lives only with its holder.
Lookup hashes the presented token, so comparison time does not depend on how
much of a guessed token is right. The audit names a token by its role and
holder and the first characters of its hash (:attr:`Principal.token_id`), never
by the token.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger("trainguard.auth")


class Role(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    AGENT = "agent"
    JOB = "job"  # a job's own progress token: issued by submit, never in a token file


# What each role may do. An operator can do everything a viewer can; an agent only reports.
READ_ROLES = frozenset({Role.VIEWER, Role.OPERATOR})
OPERATE_ROLES = frozenset({Role.OPERATOR})
REPORT_ROLES = frozenset({Role.AGENT})
PROGRESS_ROLES = frozenset({Role.AGENT, Role.JOB})
FILE_ROLES = (Role.OPERATOR, Role.VIEWER, Role.AGENT)

ANY_HOST = "*"
HASH_PREFIX = "sha256:"
MIN_TOKEN_LENGTH = 16
TOKEN_ID_LENGTH = 12


class TokenFileError(ValueError):
    """The token file is malformed; the message names the file and the entry."""


@dataclass(frozen=True)
class Principal:
    """Who made a request: the name and role of the token presented; ``token_id``: the
    first hex digits of the token's hash, which tell two tokens of one name apart in
    the audit without saying anything of the token."""

    name: str
    role: Role
    token_id: str = field(default="", compare=False)

    @property
    def fleet_proxy(self) -> bool:
        """The hand-written any-host agent token (``name: "*"``)."""
        return self.role is Role.AGENT and self.name == ANY_HOST

    def may_report_for(self, host: str) -> bool:
        return self.role is Role.AGENT and self.name in (ANY_HOST, host)

    def may_post_progress(self, job_id: str) -> bool:
        """A job's own token for that job; a fleet proxy for any job; nobody else."""
        return (self.role is Role.JOB and self.name == job_id) or self.fleet_proxy

    def describe(self) -> dict[str, str]:
        """The token as the audit records it: role, holder, hash prefix; never the token."""
        return {"role": self.role.value, "name": self.name, "token_id": self.token_id}

    @property
    def actor(self) -> str:
        """How the audit log names this principal (``operator:alice``)."""
        return f"{self.role.value}:{self.name}"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class TokenTable:
    """Token hashes -> principals. Build with :meth:`load` or :meth:`from_mapping`."""

    RELOAD_EVERY_S = 1.0

    def __init__(self, entries: Mapping[str, Principal], source: str = "<memory>") -> None:
        self._by_hash = dict(entries)
        self.source = source
        self.path: Path | None = None  # set by load(): the file reload_if_changed() watches
        self._stamp: tuple[int, int] | None = None
        self._checked_at = 0.0

    def __len__(self) -> int:
        return len(self._by_hash)

    def authenticate(self, token: str) -> Principal | None:
        if not token:
            return None
        return self._by_hash.get(hash_token(token))

    def by_hash(self, digest: str) -> Principal | None:
        """The holder of the token whose SHA-256 (hex) is ``digest``."""
        return self._by_hash.get(digest)

    def holders(self) -> list[dict[str, str]]:
        """Each token's role, holder and hash prefix (never the token)."""
        return [p.describe() for p in self._by_hash.values()]

    def agent_hosts(self) -> set[str]:
        return {p.name for p in self._by_hash.values() if p.role is Role.AGENT}

    def reload_if_changed(self, now: float | None = None) -> bool:
        """Read the token file again when it changed (at most once a second); ``True``
        when the table changed. Called on an unknown token, so a token added by
        ``trainguard tokens add`` works without a restart. A file that became invalid
        keeps the table as it was (and says why)."""
        now = time.monotonic() if now is None else now
        if self.path is None or now - self._checked_at < self.RELOAD_EVERY_S:
            return False
        self._checked_at = now
        stamp = _stamp(self.path)
        if stamp is None or stamp == self._stamp:
            return False
        try:
            fresh = TokenTable.load(self.path)
        except TokenFileError as exc:
            log.warning("token file changed but cannot be used (%s); the old tokens stay", exc)
            self._stamp = stamp
            return False
        self._by_hash = fresh._by_hash
        self._stamp = stamp
        log.info("token file %s reloaded (%d tokens)", self.path, len(self._by_hash))
        return True

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
                role: Role | None = Role(str(role_raw))
            except ValueError:
                role = None
            if role is None or role not in FILE_ROLES:
                allowed = ", ".join(r.value for r in FILE_ROLES)
                raise TokenFileError(
                    f"{where}: role {role_raw!r} is not one of {allowed}"
                    + (" (job tokens are issued by submit)" if role is Role.JOB else "")
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
            entries[digest] = Principal(
                name=name.strip(), role=role, token_id=digest[:TOKEN_ID_LENGTH]
            )
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
        table = cls.from_mapping(data or {}, str(p))
        table.path = p
        table._stamp = _stamp(p)
        return table


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


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


def _token_line(token: str, role: Role, name: str) -> str:
    return f"{json.dumps(token)}: {{role: {role.value}, name: {json.dumps(name)}}}"


def create_token_file(path: str | os.PathLike[str]) -> dict[str, str]:
    """Write a token file with a fresh operator and viewer token (mode 0600); returns
    role -> token.

    Used by ``trainguard serve`` when no token file exists yet, so that a fresh
    control plane is never open to anyone who can reach its port. It holds no agent
    token: each host gets its own (``trainguard tokens add --role agent --name HOST``,
    :func:`add_token`), and an any-host token is written by hand (decision 0402).
    """
    p = Path(path)
    p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tokens = {Role.OPERATOR.value: new_token(), Role.VIEWER.value: new_token()}
    names = {Role.OPERATOR.value: "admin", Role.VIEWER.value: "viewer"}
    lines = ["# trainguard tokens: token -> role and name (docs/api.md#authentication)"]
    for role, token in tokens.items():
        lines.append(_token_line(token, Role(role), names[role]))
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return tokens


def add_token(path: str | os.PathLike[str], role: Role, name: str) -> str:
    """Append a fresh token for ``role`` held by ``name`` to the token file at ``path``
    (created 0600 when missing, made 0600 when others could read it); returns the
    token. A running ``serve`` picks it up at the token's first use
    (:meth:`TokenTable.reload_if_changed`).

    Refuses the any-host agent name ``*`` (a fleet proxy is written by hand) and a
    JSON token file (edit that one by hand too).
    """
    if role not in FILE_ROLES:
        raise TokenFileError(f"role {role.value!r} is not written in a token file")
    name = name.strip()
    if not name:
        raise TokenFileError("a token needs a holder name (for an agent: its host)")
    if role is Role.AGENT and name == ANY_HOST:
        raise TokenFileError(
            "an any-host agent token (a fleet proxy) is not issued by trainguard: if you "
            'need one, write it into the token file by hand ({role: agent, name: "*"})'
        )
    p = Path(path)
    if p.suffix == ".json":
        raise TokenFileError(f"{p}: a JSON token file is edited by hand")
    existing = TokenTable.load(p) if p.exists() else None  # a broken file is said now
    if existing is not None and role is Role.AGENT and name in existing.agent_hosts():
        log.warning("%s already holds an agent token for %s; adding another", p, name)
    token = new_token()
    p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    if stat.S_IMODE(os.fstat(fd).st_mode) & 0o077:
        # A credential goes in: nobody but the owner reads the file from now on.
        log.warning("%s was readable by other users; now mode 0600", p)
        os.fchmod(fd, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        if existing is None:
            fh.write("# trainguard tokens: token -> role and name (docs/api.md#authentication)\n")
        elif not p.read_text(encoding="utf-8").endswith("\n"):
            fh.write("\n")
        fh.write(_token_line(token, role, name) + "\n")
    return token


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
    "FILE_ROLES",
    "OPERATE_ROLES",
    "PROGRESS_ROLES",
    "READ_ROLES",
    "REPORT_ROLES",
    "Principal",
    "Role",
    "TokenFileError",
    "TokenTable",
    "add_token",
    "create_token_file",
    "hash_token",
    "new_token",
    "read_token",
]
