"""One interface for operator actions, whoever carries them out (decision 0230).

:class:`Operations` is what the CLI's operator commands (``devices release``,
``validate``, ``approve``, ``mode``, ``breaker``) call. It has two implementations:

* :class:`LocalOperations`, on a state database: the :class:`ControlPlane`
  methods the HTTP API's routes call too (the routes themselves go through this
  class), so a local release closes the repair record exactly as the API's does;
* ``RemoteOperations`` (:mod:`trainguard.api.client`), over the HTTP API with a
  token (``--server URL``).

Both speak the API's JSON (the records' ``to_json()``) and raise one error type,
:class:`OperationError`, whose :class:`ErrorKind` is what the API's status code
says (404 not found, 409 conflict, 422 invalid...). The actor is fixed when an
implementation is built: a local one is given a name, a remote one acts as its
token's holder.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from trainguard.controller.service import ControlPlane

Json = dict[str, Any]
ResourceKind = Literal["device", "node"]


@dataclass(frozen=True)
class Target:
    """A device (UUID, PCI bus id in any spelling, or index with ``host``) or a node."""

    kind: ResourceKind
    ident: str
    host: str | None = None  # only for a device index that several hosts have

    @classmethod
    def device(cls, ident: str, host: str | None = None) -> Target:
        return cls("device", ident, host)

    @classmethod
    def node(cls, name: str) -> Target:
        return cls("node", name)


class ErrorKind(enum.StrEnum):
    NOT_FOUND = "not_found"  # no such device, node, approval (HTTP 404)
    CONFLICT = "conflict"  # the state does not allow it, e.g. a decided approval (409)
    INVALID = "invalid"  # a bad request: empty reason, unknown mode (400/422)
    DENIED = "denied"  # the token may not do this (401/403)
    UNAVAILABLE = "unavailable"  # no controller, no server, store down (503, no answer)


class OperationError(Exception):
    """An operation was refused or failed; the message is ready to show a person."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Operations(Protocol):
    """Operator actions and the reads they need; JSON in the API's shapes."""

    def whoami(self) -> str:
        """The actor the audit log records for these operations (``operator:alice``)."""
        ...

    def devices(self, host: str | None = None) -> list[Json]: ...

    def device(self, ident: str, host: str | None = None) -> Json: ...

    def device_history(self, ident: str, host: str | None = None) -> list[Json]: ...

    def approvals(self, state: str | None = "pending") -> list[Json]: ...

    def release(self, target: Target, reason: str) -> Json:
        """quarantined | suspect -> healthy; closes the open repair record (``released``).
        Returns the device (or node)."""
        ...

    def request_validation(self, target: Target, reason: str) -> Json:
        """quarantined | repair -> validating (idempotent in validating); the repair record."""
        ...

    def record_validation(
        self,
        target: Target,
        passed: bool,
        details: Mapping[str, Any],
        *,
        inconclusive: bool = False,
        failures_to_retire: int | None = None,
    ) -> Json:
        """The checks' result for a resource in validating (audited as a ``result``);
        the repair record."""
        ...

    def request_retire(self, target: Target, reason: str) -> Json:
        """A pending ``retire`` approval (one per resource)."""
        ...

    def approve(self, approval_id: int, reason: str) -> Json: ...

    def deny(self, approval_id: int, reason: str) -> Json: ...

    def set_mode(self, scope: str, mode: str | None, reason: str) -> Json | None:
        """``observe``/``act`` on ``cluster``, ``partition:P`` or ``job:ID``; ``None``
        clears it (the scope inherits again) and returns ``None``."""
        ...

    def breaker(self) -> Json: ...

    def reset_breaker(self, reason: str) -> Json: ...


def validation_body(
    passed: bool,
    details: Mapping[str, Any],
    *,
    inconclusive: bool = False,
    failures_to_retire: int | None = None,
) -> Json:
    """``record_validation``'s arguments as the API's JSON (``ValidationIn``): the one
    mapping, which the remote side posts and the API's route reads back."""
    return {
        "passed": passed,
        "details": dict(details),
        "inconclusive": inconclusive,
        "failures_to_retire": failures_to_retire,
    }


@contextmanager
def _refusals() -> Iterator[None]:
    """The control plane's exceptions as :class:`OperationError` (as the API maps them)."""
    from trainguard.model.statemachine import IllegalTransition
    from trainguard.store import NotFound, StoreError

    try:
        yield
    except NotFound as exc:
        raise OperationError(ErrorKind.NOT_FOUND, str(exc).strip("'\"")) from exc
    except IllegalTransition as exc:
        raise OperationError(ErrorKind.CONFLICT, str(exc)) from exc
    except ValueError as exc:
        raise OperationError(ErrorKind.INVALID, str(exc)) from exc
    except StoreError as exc:
        raise OperationError(ErrorKind.UNAVAILABLE, f"state store: {exc}") from exc


class LocalOperations:
    """:class:`Operations` on a control plane in this process, acting as ``actor``.

    The API's operator routes use this class too, with the token holder as actor:
    one code path for both.
    """

    def __init__(self, control: ControlPlane, actor: str) -> None:
        self.control = control
        self.actor = actor

    # --- reads -------------------------------------------------------------------------

    def whoami(self) -> str:
        return self.actor

    def devices(self, host: str | None = None) -> list[Json]:
        with _refusals():
            return [d.to_json() for d in self.control.store.devices.list_devices(host=host)]

    def device(self, ident: str, host: str | None = None) -> Json:
        with _refusals():
            return self.control.store.devices.find_device(ident, host=host).to_json()

    def device_history(self, ident: str, host: str | None = None) -> list[Json]:
        with _refusals():
            dev = self.control.store.devices.find_device(ident, host=host)
            return [h.to_json() for h in self.control.store.devices.device_history(dev.uuid)]

    def approvals(self, state: str | None = "pending") -> list[Json]:
        with _refusals():
            return [a.to_json() for a in self.control.approvals(state)]

    def breaker(self) -> Json:
        with _refusals():
            return self.control.breaker().to_json()

    # --- actions -----------------------------------------------------------------------

    def resource(self, target: Target) -> str:
        """``device:UUID`` or ``node:NAME``, resolved (``NotFound`` as an error)."""
        with _refusals():
            if target.kind == "device":
                dev = self.control.store.devices.find_device(target.ident, host=target.host)
                return f"device:{dev.uuid}"
            return f"node:{self.control.fleet.nodes.get_node(target.ident).name}"

    def _view(self, resource: str) -> Json:
        kind, _, ident = resource.partition(":")
        if kind == "device":
            return self.control.store.devices.get_device(ident).to_json()
        return dict(self.control.fleet.nodes.get_node(ident).to_json())

    def _on(self, target: Target, act: Callable[[str], Json]) -> Json:
        """``act`` on the resolved resource (``device:UUID`` / ``node:NAME``), the control
        plane's refusals as :class:`OperationError`: every action on a target."""
        resource = self.resource(target)
        with _refusals():
            return act(resource)

    def release(self, target: Target, reason: str) -> Json:
        def act(resource: str) -> Json:
            self.control.release(resource, self.actor, reason)
            return self._view(resource)

        return self._on(target, act)

    def request_validation(self, target: Target, reason: str) -> Json:
        return self._on(
            target, lambda r: self.control.request_validation(r, self.actor, reason).to_json()
        )

    def record_validation(
        self,
        target: Target,
        passed: bool,
        details: Mapping[str, Any],
        *,
        inconclusive: bool = False,
        failures_to_retire: int | None = None,
    ) -> Json:
        return self._on(
            target,
            lambda r: self.control.record_validation(
                r,
                passed,
                self.actor,
                details=details,
                inconclusive=inconclusive,
                failures_to_retire=failures_to_retire,
            ).to_json(),
        )

    def request_retire(self, target: Target, reason: str) -> Json:
        return self._on(
            target, lambda r: self.control.request_retire(r, self.actor, reason).to_json()
        )

    def _decide(self, approval_id: int, approve: bool, reason: str) -> Json:
        from trainguard.model.fleet import ApprovalState

        with _refusals():
            current = self.control.approval(approval_id)
            if current.state is not ApprovalState.PENDING:
                raise OperationError(
                    ErrorKind.CONFLICT,
                    f"approval {approval_id} is already {current.state.value}"
                    + (f" by {current.decided_by}" if current.decided_by else ""),
                )
            verb = self.control.approve if approve else self.control.deny
            return verb(approval_id, self.actor, reason).to_json()

    def approve(self, approval_id: int, reason: str) -> Json:
        return self._decide(approval_id, True, reason)

    def deny(self, approval_id: int, reason: str) -> Json:
        return self._decide(approval_id, False, reason)

    def set_mode(self, scope: str, mode: str | None, reason: str) -> Json | None:
        if not reason or not reason.strip():
            raise OperationError(ErrorKind.INVALID, "changing a mode needs a reason")
        with _refusals():
            result = self.control.set_mode(scope, mode, self.actor, reason=reason)
            return None if result is None else dict(result.to_json())

    def reset_breaker(self, reason: str) -> Json:
        with _refusals():
            return self.control.reset_breaker(self.actor, reason).to_json()


__all__ = [
    "ErrorKind",
    "Json",
    "LocalOperations",
    "OperationError",
    "Operations",
    "Target",
    "validation_body",
]
