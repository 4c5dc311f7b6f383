"""Out-of-band access to a node through its BMC, over Redfish (decision 0240).

The one place trainguard talks to baseboard management controllers. It reads a
node's power state, health roll-up, thermal/power sensors and system event log
(:meth:`RedfishBmc.read`, a :class:`~trainguard.model.bmc.BmcReading`; an
unreachable BMC or refused credentials is a reading with ``reachable=False``
and the reason) and carries out power actions (:meth:`RedfishBmc.act`):
``graceful_restart``, ``force_restart``, ``power_cycle`` and ``power_off``.

The client is the OpenStack ``sushy`` library (optional extra ``bmc``; importing
this module does not need it, reading a BMC does). The SEL has no sushy
resource, so it is read through sushy's own authenticated connection, following
the system's ``LogServices`` link.

Configuration is per node (:func:`load_bmc_config`, a TOML file)::

    [nodes.n1]
    address = "https://10.0.0.11"       # the BMC's base URL
    credentials = "bmc/n1.cred"         # relative to the config file; mode 0600
    verify = true                       # TLS verification (default); or a CA bundle path
    system = "1"                        # optional: the system id when there are several

A credentials file holds the user name on its first line and the password on
its second; one readable by group or others is refused (:class:`BmcConfigError`).

Actions are keyed and exactly once across servers and crashes (decision 0414): the
caller passes an :class:`ActionJournal` (the shared store's power-action ledger,
written under the leader's fencing token) and every reset request is recorded there
as intended *before* it goes out and as sent once the BMC accepted it. A journal that
already holds requests is resumed, never started again (:meth:`RedfishBmc._resume`):
a power cycle on a BMC without ``PowerCycle`` is ``ForceOff``, a verified off, then
``On``, and a crash between the two ends with the node switched on, not left off.
Every action is verified from fresh reads until its effect shows (power off: off; the
restarts and the cycle: on again) or ``action_timeout`` passes (``verified=False``).
The client keeps no state of its own.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from trainguard.model.bmc import (
    BmcActionResult,
    BmcHealth,
    BmcReading,
    PowerState,
    SelEntry,
    SensorReading,
)
from trainguard.schedulers.base import SchedulerError

ACTIONS = ("graceful_restart", "force_restart", "power_cycle", "power_off")
# The Redfish reset requests an action is made of, by the names the journal records.
_RESET = {
    "ForceOff": "FORCE_OFF",
    "On": "ON",
    "PowerCycle": "POWER_CYCLE",
    "GracefulRestart": "GRACEFUL_RESTART",
    "ForceRestart": "FORCE_RESTART",
}
_MAX_EVENTS = 200  # the newest SEL entries kept per reading (a SEL can hold thousands)


class BmcConfigError(SchedulerError):
    """The BMC configuration or a credentials file is unusable (missing, too open, malformed)."""


class BmcError(SchedulerError):
    """A BMC could not carry out an action (unreachable, refused, unsupported)."""


@dataclass(frozen=True)
class BmcEndpoint:
    """How to reach one node's BMC."""

    node: str
    address: str
    credentials: Path
    verify: bool | str = True
    system: str | None = None
    timeout: float = 10.0


def read_credentials(path: str | os.PathLike[str]) -> tuple[str, str]:
    """``(user, password)`` from a 0600 file; a file others may read is refused."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise BmcConfigError(f"BMC credentials file {p}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise BmcConfigError(f"BMC credentials file {p} is not a regular file")
    if st.st_mode & 0o077:
        raise BmcConfigError(
            f"BMC credentials file {p} has mode {stat.S_IMODE(st.st_mode):04o}: it must be "
            f"readable by its owner only (chmod 600 {p})"
        )
    try:
        lines = p.read_bytes().decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise BmcConfigError(f"BMC credentials file {p}: unreadable ({exc})") from None
    if len(lines) < 2 or not lines[0].strip():
        raise BmcConfigError(
            f"BMC credentials file {p}: expected the user on line 1, the password on line 2"
        )
    return lines[0].strip(), lines[1]


def load_bmc_config(path: str | os.PathLike[str]) -> dict[str, BmcEndpoint]:
    """The per-node BMC endpoints of a TOML file (see the module docstring)."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise BmcConfigError(f"BMC config {p}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise BmcConfigError(f"BMC config {p}: not a UTF-8 text (TOML) file") from None
    except tomllib.TOMLDecodeError as exc:
        raise BmcConfigError(f"BMC config {p}: not valid TOML: {exc}") from None
    nodes = data.get("nodes")
    if not isinstance(nodes, dict) or not nodes:
        raise BmcConfigError(f"BMC config {p}: no [nodes.<name>] tables")
    out: dict[str, BmcEndpoint] = {}
    for name, table in nodes.items():
        if not isinstance(table, dict) or "address" not in table or "credentials" not in table:
            raise BmcConfigError(f"BMC config {p}: node {name!r} needs address and credentials")
        verify = table.get("verify", True)
        if not isinstance(verify, bool | str):
            raise BmcConfigError(f"BMC config {p}: node {name!r}: verify is true/false/a path")
        cred = Path(str(table["credentials"]))
        out[str(name)] = BmcEndpoint(
            node=str(name),
            address=str(table["address"]).rstrip("/"),
            credentials=cred if cred.is_absolute() else p.parent / cred,
            verify=verify,
            system=None if table.get("system") is None else str(table["system"]),
            timeout=float(table.get("timeout", 10.0)),
        )
    return out


_POWER = {
    "on": PowerState.ON,
    "off": PowerState.OFF,
    "powering on": PowerState.POWERING_ON,
    "powering off": PowerState.POWERING_OFF,
}


def _power(value: Any) -> PowerState:
    text = str(getattr(value, "value", value) or "").lower()
    return _POWER.get(text, PowerState.UNKNOWN)


def _health(value: Any) -> BmcHealth:
    text = str(getattr(value, "value", value) or "").lower()
    try:
        return BmcHealth(text)
    except ValueError:
        return BmcHealth.UNKNOWN


def _sushy() -> Any:
    """The sushy package, or :class:`BmcError` saying how to install it."""
    try:
        import sushy
        import sushy.auth
        import sushy.connector
        import sushy.exceptions
    except ImportError:
        raise BmcError(
            "talking to a BMC needs the sushy library: pip install 'trainguard[bmc]'"
        ) from None
    return sushy


class ActionJournal(Protocol):
    """Where one keyed power action's requests are recorded (the shared store's
    power-action ledger, decision 0414). ``intend`` is called before a request goes out
    and must raise when the caller may no longer act (a deposed leader): then nothing
    is sent. ``requests`` is what was recorded before, by this process or another."""

    def requests(self) -> list[tuple[str, str]]: ...  # [(request, "intended" | "sent")]

    def intend(self, request: str) -> None: ...

    def sent(self, request: str) -> None: ...


class RedfishBmc:
    """One node's BMC; ``clock``/``sleep`` are injected. It keeps no state: what was
    sent is the caller's :class:`ActionJournal`."""

    def __init__(
        self,
        endpoint: BmcEndpoint,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        poll: float = 0.5,
        action_timeout: float = 120.0,
    ) -> None:
        self.endpoint = endpoint
        self.clock = clock
        self.sleep = sleep
        self.poll = poll
        self.action_timeout = action_timeout

    # --- connection ------------------------------------------------------------------

    def _client(self) -> Any:
        sushy = _sushy()
        user, password = read_credentials(self.endpoint.credentials)
        base = self.endpoint.address + "/redfish/v1"
        conn = sushy.connector.Connector(
            base,
            verify=self.endpoint.verify,
            default_request_timeout=self.endpoint.timeout,
            connect_timeout=min(self.endpoint.timeout, 5.0),
        )
        # Basic auth on every request: no session to leak or expire mid-recovery.
        return sushy.Sushy(
            base,
            verify=self.endpoint.verify,
            auth=sushy.auth.BasicAuth(user, password),
            connector=conn,
        )

    def _system(self, client: Any) -> Any:
        if self.endpoint.system is not None:
            ident = self.endpoint.system
            if not ident.startswith("/"):
                ident = f"/redfish/v1/Systems/{ident}"
            return client.get_system(ident)
        members = sorted(client.get_system_collection().members_identities)
        if not members:
            raise BmcError(f"the BMC of {self.endpoint.node} reports no system")
        return client.get_system(members[0])

    def _explain(self, exc: Exception) -> str:
        """One clear sentence for a failed BMC call (no traceback reaches the operator)."""
        sx = _sushy().exceptions

        where = f"the BMC of {self.endpoint.node} at {self.endpoint.address}"
        if isinstance(exc, sx.AccessError):
            return (
                f"{where} refused the credentials in {self.endpoint.credentials} "
                f"(HTTP {exc.status_code}): check the user and password"
            )
        if isinstance(exc, sx.ConnectionError):
            return f"{where} is unreachable: {str(exc).splitlines()[0][:200]}"
        return f"{where}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"

    # --- reads -----------------------------------------------------------------------

    def read(self) -> BmcReading:
        """A fresh reading; never raises for a BMC that cannot be read (see ``error``).
        Raises :class:`BmcConfigError` for unusable credentials and :class:`BmcError`
        when sushy is not installed: those are this side's faults, not the node's."""
        sx = _sushy().exceptions

        try:
            client = self._client()
            system = self._system(client)
            sensors = self._sensors(client)
            events = self._events(client, system)
        except (sx.SushyError, BmcError) as exc:
            detail = str(exc) if isinstance(exc, BmcError) else self._explain(exc)
            return BmcReading(
                node=self.endpoint.node, at=self.clock(), reachable=False, error=detail
            )
        status = system.status
        return BmcReading(
            node=self.endpoint.node,
            at=self.clock(),
            reachable=True,
            power=_power(system.power_state),
            health=_health(getattr(status, "health", None)),
            health_rollup=_health(getattr(status, "health_rollup", None)),
            sensors=sensors,
            events=events,
        )

    def power(self) -> PowerState:
        """Only the power state (the verification loop's fresh read)."""
        sx = _sushy().exceptions

        try:
            return _power(self._system(self._client()).power_state)
        except sx.SushyError as exc:
            raise BmcError(self._explain(exc)) from None

    def _sensors(self, client: Any) -> tuple[SensorReading, ...]:
        sx = _sushy().exceptions

        out: list[SensorReading] = []
        for chassis in client.get_chassis_collection().get_members():
            with contextlib.suppress(sx.MissingAttributeError, sx.ResourceNotFoundError):
                for t in chassis.thermal.temperatures or ():
                    out.append(
                        SensorReading(
                            name=str(t.name),
                            kind="temperature",
                            reading=t.reading_celsius,
                            units="Cel",
                            health=_health(getattr(t.status, "health", None)).value,
                            critical=t.upper_threshold_critical,
                        )
                    )
            with contextlib.suppress(sx.MissingAttributeError, sx.ResourceNotFoundError):
                for ps in chassis.power.power_supplies or ():
                    out.append(
                        SensorReading(
                            name=str(ps.name or ps.identity),
                            kind="power",
                            reading=ps.last_power_output_watts,
                            units="W",
                            health=_health(getattr(ps.status, "health", None)).value,
                        )
                    )
        return tuple(out)

    def _events(self, client: Any, system: Any) -> tuple[SelEntry, ...]:
        """The system's event log entries, newest last (every LogService the system links)."""
        sx = _sushy().exceptions

        conn = client._conn  # sushy's authenticated connection: the SEL has no resource class
        link = (system.json.get("LogServices") or {}).get("@odata.id")
        if not link:
            return ()
        out: list[SelEntry] = []
        try:
            services = conn.get(link).json().get("Members") or []
            for svc in services:
                service = conn.get(svc["@odata.id"]).json()
                entries_link = (service.get("Entries") or {}).get("@odata.id")
                if not entries_link:
                    continue
                for e in conn.get(entries_link).json().get("Members") or []:
                    out.append(
                        SelEntry(
                            id=f"{service.get('Id', '')}/{e.get('Id', '')}",
                            message=str(e.get("Message") or ""),
                            severity=str(e.get("Severity") or "OK"),
                            message_id=e.get("MessageId"),
                            created=e.get("Created"),
                            sensor_type=e.get("SensorType"),
                        )
                    )
        except (sx.ResourceNotFoundError, KeyError, ValueError):
            return tuple(out[-_MAX_EVENTS:])
        return tuple(out[-_MAX_EVENTS:])

    # --- actions ---------------------------------------------------------------------

    def act(self, action: str, *, key: str, journal: ActionJournal) -> BmcActionResult:
        """Carry out ``action`` (one of :data:`ACTIONS`) for ``key`` to its end, resuming
        from what ``journal`` holds: a request recorded before is never sent again, except
        ``On``, which is idempotent (see :meth:`_resume`)."""
        if action not in ACTIONS:
            raise BmcError(f"unknown BMC action {action!r} (one of {', '.join(ACTIONS)})")
        before = journal.requests()
        if before:
            detail = self._resume(action, dict(before), journal)
        else:
            detail = self._send(action, journal)
        sent = [r for r, st in journal.requests() if st == "sent"]
        detail["sent"] = sent
        if "verified" in detail:  # the resume already knows it cannot be verified
            verified, power_after = bool(detail.pop("verified")), self._power_or_unknown()
        else:
            verified, power_after = self._verify(action)
        return BmcActionResult(
            node=self.endpoint.node,
            action=action,
            key=key,
            applied=len(sent) > len([r for r, st in before if st == "sent"]),
            verified=verified,
            power_after=power_after,
            detail=detail,
        )

    def _request(self, system: Any, request: str, journal: ActionJournal) -> None:
        """One reset request, written ahead (``intend`` raises for a deposed leader: then
        nothing is sent) and marked sent once the BMC accepted it."""
        journal.intend(request)
        system.reset_system(getattr(_sushy().ResetType, _RESET[request]))
        journal.sent(request)

    def _send(self, action: str, journal: ActionJournal) -> dict[str, Any]:
        sushy = _sushy()
        sx = sushy.exceptions

        try:
            system = self._system(self._client())
            allowed = set(system.get_allowed_reset_system_values())
            before = _power(system.power_state)
            if action == "power_off":
                if before is not PowerState.OFF:
                    self._request(system, "ForceOff", journal)
                return {}
            if before is PowerState.OFF:  # nothing to restart: switch it on
                self._request(system, "On", journal)
                return {"was": "off"}
            if action == "graceful_restart":
                self._request(system, "GracefulRestart", journal)
                return {}
            if action == "force_restart":
                self._request(system, "ForceRestart", journal)
                return {}
            if sushy.ResetType.POWER_CYCLE in allowed:
                self._request(system, "PowerCycle", journal)
                return {}
            self._request(system, "ForceOff", journal)
            return self._switch_on_after_off(journal)
        except sx.SushyError as exc:
            raise BmcError(self._explain(exc)) from None

    def _switch_on_after_off(self, journal: ActionJournal) -> dict[str, Any]:
        """The second half of a cycle without ``PowerCycle``: a verified off, then ``On``."""
        if not self._wait_for(PowerState.OFF):
            raise BmcError(
                f"power cycle of {self.endpoint.node}: the BMC did not report it off "
                f"within {self.action_timeout:.0f}s; not switching it on yet"
            )
        sx = _sushy().exceptions
        try:
            self._request(self._system(self._client()), "On", journal)
        except sx.SushyError as exc:
            raise BmcError(self._explain(exc)) from None
        return {}

    def _resume(self, action: str, done: dict[str, str], journal: ActionJournal) -> dict[str, Any]:
        """Finish an action a crash (or a deposed leader) left half-way, from its journal.

        * ``On`` recorded: power on is idempotent, so it is sent again unless the BMC
          already reports the node on or powering on;
        * ``ForceOff`` of a cycle recorded, no ``On``: wait for the off, then ``On`` —
          the cycle completes instead of leaving the server off. When the node never goes
          off, the ForceOff is not sent a second time: the result is "not verified";
        * a single-request action (``PowerCycle``, a restart, a power off): never sent
          again, only verified.
        """
        sx = _sushy().exceptions
        out: dict[str, Any] = {"resumed": [f"{r}:{st}" for r, st in done.items()]}
        try:
            if "On" in done:
                system = self._system(self._client())
                if _power(system.power_state) not in (PowerState.ON, PowerState.POWERING_ON):
                    self._request(system, "On", journal)
                return out
            if action == "power_cycle" and set(done) == {"ForceOff"}:
                if self._wait_for(PowerState.OFF):
                    out.update(self._switch_on_after_off(journal))
                    return out
                out["verified"] = False
                out["why"] = (
                    "the ForceOff "
                    + ("was accepted" if done["ForceOff"] == "sent" else "may never have arrived")
                    + " but the BMC never reported the node off; it is not sent again"
                )
                return out
        except sx.SushyError as exc:
            raise BmcError(self._explain(exc)) from None
        return out

    def _power_or_unknown(self) -> PowerState:
        try:
            return self.power()
        except BmcError:
            return PowerState.UNKNOWN

    def _wait_for(self, want: PowerState) -> bool:
        deadline = self.clock() + self.action_timeout
        while True:
            try:
                if self.power() is want:
                    return True
            except BmcError:
                pass  # a BMC busy with the reset may not answer for a moment
            if self.clock() >= deadline:
                return False
            self.sleep(self.poll)

    def _verify(self, action: str) -> tuple[bool, PowerState]:
        want = PowerState.OFF if action == "power_off" else PowerState.ON
        ok = self._wait_for(want)
        try:
            return ok, self.power()
        except BmcError:
            return False, PowerState.UNKNOWN


def bmcs_from_config(config: Mapping[str, BmcEndpoint], **kwargs: Any) -> dict[str, RedfishBmc]:
    """One :class:`RedfishBmc` per configured node."""
    return {name: RedfishBmc(ep, **kwargs) for name, ep in config.items()}


__all__ = [
    "ACTIONS",
    "ActionJournal",
    "BmcConfigError",
    "BmcEndpoint",
    "BmcError",
    "RedfishBmc",
    "bmcs_from_config",
    "load_bmc_config",
    "read_credentials",
]
