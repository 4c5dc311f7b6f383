"""Who may speak for what: the jobs' progress tokens, the scope of an agent's evidence,
and the audit of refused reports (decisions 0402, 0403).

* :class:`JobTokens` - the progress token of each managed job. ``submit`` issues one
  (:meth:`JobTokens.issue`); only its SHA-256 goes to the store, and this process
  keeps the live ones in memory so that the progress fast lane authenticates without
  a query. A token of another server (PostgreSQL, several ``serve``) is found by a
  refresh on a miss (at most once a second); a token stops counting once its job is
  over (the periodic refresh drops it).
* :func:`foreign_references` - what in an agent's finding names a card or a node of
  another host than the one its token speaks for: a culprit host, or a device uuid
  registered on another host. A uuid no inventory lists yet is taken (a finding may
  come before its host's inventory), recorded as the reporting host's; should another
  host's inventory list it later, the controller still ties the finding to no card of
  that host (it matches a finding's card against the finding's host).
* :class:`Refusals` - a refused report is audited with the token that sent it
  (role, holder, hash prefix; never the token) and counted; at most one record per
  token and subject every :data:`REFUSAL_AUDIT_EVERY_S` seconds, with the count of
  those in between, and at most :data:`REFUSAL_AUDITS_PER_TOKEN` per token in that
  time whatever the subjects, so a flood of forgeries cannot flood the audit log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from trainguard.api.auth import TOKEN_ID_LENGTH, Principal, Role, hash_token, new_token
from trainguard.model.findings import Finding
from trainguard.model.records import AuditKind

log = logging.getLogger("trainguard.api")

JOB_TOKEN_PREFIX = "tgj_"
REFRESH_ON_MISS_EVERY_S = 1.0
REFRESH_EVERY_S = 5.0
REFUSAL_AUDIT_EVERY_S = 10.0
REFUSAL_AUDITS_PER_TOKEN = 20  # in each REFUSAL_AUDIT_EVERY_S window, whatever the subjects
_MAX_REFUSAL_KEYS = 10_000


class JobTokenBackend(Protocol):
    """The job tokens' repository (``FleetStore.tokens``, :mod:`trainguard.store.job_tokens`)."""

    def add_job_token(self, token_hash: str, job_id: str, *, at: float, actor: str) -> None: ...

    def delete_job_token(self, token_hash: str) -> int: ...

    def live_job_tokens(self) -> dict[str, str]: ...


class JobTokens:
    """Job progress tokens: issued here, stored hashed, checked from memory."""

    def __init__(
        self, backend: JobTokenBackend, *, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.backend = backend
        self.monotonic = monotonic
        self._by_hash: dict[str, str] = {}
        self._issued_during_refresh: dict[str, str] = {}
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()  # one store read at a time
        self._refreshed_at = float("-inf")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def issue(self, job_id: str, *, at: float, actor: str) -> str:
        """A fresh token for ``job_id``: stored (hashed) before it is returned."""
        token = JOB_TOKEN_PREFIX + new_token()
        digest = hash_token(token)
        self.backend.add_job_token(digest, job_id, at=at, actor=actor)
        with self._lock:
            self._by_hash[digest] = job_id
            self._issued_during_refresh[digest] = job_id
        return token

    def revoke(self, token: str) -> None:
        """Forget ``token`` (its submit failed)."""
        digest = hash_token(token)
        self.backend.delete_job_token(digest)
        with self._lock:
            self._by_hash.pop(digest, None)
            self._issued_during_refresh.pop(digest, None)

    def lookup(self, token: str) -> Principal | None:
        """The job a token belongs to, from memory (no query)."""
        if not token.startswith(JOB_TOKEN_PREFIX):
            return None
        return self.by_hash(hash_token(token))

    def by_hash(self, digest: str) -> Principal | None:
        job_id = self._by_hash.get(digest)
        if job_id is None:
            return None
        return Principal(name=job_id, role=Role.JOB, token_id=digest[:TOKEN_ID_LENGTH])

    def refresh_due(self, token: str) -> bool:
        """Whether a miss of ``token`` is worth a store read now (a job token's shape,
        and no read in the last :data:`REFRESH_ON_MISS_EVERY_S`)."""
        return (
            token.startswith(JOB_TOKEN_PREFIX)
            and self.monotonic() - self._refreshed_at >= REFRESH_ON_MISS_EVERY_S
        )

    def refresh(self) -> None:
        """Load the live tokens from the store (a job that is over loses its token)."""
        with self._refresh_lock:
            self._refreshed_at = self.monotonic()
            with self._lock:
                self._issued_during_refresh = {}
            live = self.backend.live_job_tokens()
            with self._lock:
                # A token issued while the store was read may not be in what was read.
                live.update(self._issued_during_refresh)
                self._by_hash = live

    def start(self) -> JobTokens:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="job-tokens", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None

    def _run(self) -> None:
        while True:
            try:
                self.refresh()
            except Exception as exc:  # the store is away: keep the tokens known until it is back
                log.warning("job tokens not refreshed: %r", exc)
            if self._stop.wait(REFRESH_EVERY_S):
                return


# --- the scope of an agent's evidence ------------------------------------------------


DeviceHosts = Callable[[str], "str | None"]
"""Which host a device uuid is registered on (``None``: no inventory lists it)."""

_MAX_OWNERS = 1_000_000


class DeviceOwners:
    """Device uuid -> the host it is registered on, remembered once read: an inventory
    never moves a uuid to another host (it is refused), so an answer stays true."""

    def __init__(self, read: DeviceHosts) -> None:
        self.read = read
        self._host: dict[str, str] = {}

    def known(self, uuid: str) -> str | None:
        """From memory only (``None``: not known here yet)."""
        return self._host.get(uuid)

    def note(self, uuid: str, host: str) -> None:
        if len(self._host) >= _MAX_OWNERS:
            self._host.clear()
        self._host[uuid] = host

    def __call__(self, uuid: str) -> str | None:
        host = self._host.get(uuid)
        if host is None:
            host = self.read(uuid)  # a store read: call from a worker thread
            if host is not None:
                self.note(uuid, host)
        return host


def foreign_references(finding: Finding, host: str, device_host: DeviceHosts) -> list[str]:
    """Why ``finding``, reported for ``host``, names something of another host (empty:
    it does not). A culprit without a host or device is about ``host`` itself (its PCI
    bus id is resolved on ``host`` only)."""
    out: list[str] = []
    c = finding.culprit
    if c.host is not None and c.host != host:
        out.append(f"its culprit names host {c.host!r}")
    if c.device_uuid is not None:
        owner = device_host(c.device_uuid)
        if owner is not None and owner != host:
            out.append(f"its culprit names device {c.device_uuid!r} of host {owner!r}")
    return out


def foreign_gpus(uuids: Iterable[str], host: str, device_host: DeviceHosts) -> list[str]:
    """The uuids of a heartbeat's GPU figures that are registered on another host (a
    uuid no inventory lists yet is the host's own until an inventory says otherwise:
    heartbeats change no state)."""
    return [u for u in uuids if (owner := device_host(u)) is not None and owner != host]


# --- the audit of refusals -----------------------------------------------------------


class AuditSink(Protocol):
    """The audit log (``Store.audit``, :class:`trainguard.store.audit.AuditLog`)."""

    def append_audit(
        self,
        at: float,
        actor: str,
        kind: AuditKind | str,
        subject: str,
        message: str,
        data: dict[str, Any] | None = None,
        *,
        job_id: str | None = None,
        incident_id: int | None = None,
    ) -> int: ...


class Refusals:
    """Audit refused reports, naming the token; rate-limited per token and subject."""

    def __init__(
        self,
        audit: AuditSink,
        *,
        clock: Callable[[], float] = time.time,
        count: Callable[[], None] = lambda: None,
    ) -> None:
        self.audit = audit
        self.clock = clock
        self.count = count
        self._last: dict[tuple[str, str, str], tuple[float, int]] = {}
        self._budget: dict[tuple[str, str], tuple[float, int]] = {}  # window start, written
        self._lock = threading.Lock()
        self.refused = 0

    def due(self, who: Principal, subject: str) -> bool:
        """Whether :meth:`record` would write (else it only counts): lets an async
        route skip the thread hop for a suppressed record."""
        key = (who.role.value, who.name, subject)
        now = self.clock()
        with self._lock:
            last = self._last.get(key)
            start, written = self._budget.get(key[:2], (float("-inf"), 0))
        if now - start < REFUSAL_AUDIT_EVERY_S and written >= REFUSAL_AUDITS_PER_TOKEN:
            return False
        return last is None or now - last[0] >= REFUSAL_AUDIT_EVERY_S

    def record(
        self,
        who: Principal,
        subject: str,
        message: str,
        data: Mapping[str, Any] | None = None,
    ) -> bool:
        """Count a refusal and audit it unless one of the same token and subject was
        audited in the last :data:`REFUSAL_AUDIT_EVERY_S`; ``True`` when written."""
        now = self.clock()
        key = (who.role.value, who.name, subject)
        self.refused += 1
        self.count()
        with self._lock:
            at, suppressed = self._last.get(key, (float("-inf"), 0))
            start, written = self._budget.get(key[:2], (float("-inf"), 0))
            if now - start >= REFUSAL_AUDIT_EVERY_S:
                start, written = now, 0
            # One record per token and subject in a window, and a few per token whatever
            # the subjects (a forger can name any number of hosts): the rest are counted.
            if now - at < REFUSAL_AUDIT_EVERY_S or written >= REFUSAL_AUDITS_PER_TOKEN:
                self._last[key] = (at, suppressed + 1)
                return False
            if len(self._last) >= _MAX_REFUSAL_KEYS:
                self._last.clear()
                self._budget.clear()
            self._last[key] = (now, 0)
            self._budget[key[:2]] = (start, written + 1)
        record = {
            "refused": True,
            "token": who.describe(),
            **dict(data or {}),
            "suppressed_since_last": suppressed,
        }
        try:
            self.audit.append_audit(
                now,
                who.actor,
                AuditKind.NOTE,
                subject,
                f"refused: {message}"[:500],
                record,
            )
        except Exception as exc:  # the answer is a refusal either way; the log keeps it
            log.warning("refusal not audited (%r): %s %s", exc, who.actor, message)
            return False
        return True


__all__ = [
    "JOB_TOKEN_PREFIX",
    "REFUSAL_AUDITS_PER_TOKEN",
    "REFUSAL_AUDIT_EVERY_S",
    "DeviceOwners",
    "JobTokens",
    "Refusals",
    "foreign_gpus",
    "foreign_references",
]
