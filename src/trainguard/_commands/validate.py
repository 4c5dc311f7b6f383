"""``trainguard validate ID``: run the pre-flight checks on a quarantined or repaired device.

The only way back to service for a device in repair (a quarantined one may also
be released by an operator, recorded). Steps, each recorded in the device's health
history and the audit log:

1. ``quarantined`` or ``repair`` -> ``validating`` (an interrupted validation
   leaves the device in ``validating``, unschedulable; running ``validate`` again
   resumes it);
2. the checks of ``--level`` (default ``standard``) run on the device; kernel events
   count from the moment the device entered the state it is validated from, and one
   healthy device of the same host joins the all-reduce (not judged itself);
3. an audit ``result`` record with the measurements, then ``validating -> healthy``
   when every check passed, else ``validating -> repair``;
4. after ``--max-failures`` failed validations in a row (default 3) the device is
   due for retirement: with ``--approve-retire`` it moves ``repair -> retired``;
   without it, it stays in repair and a pending retirement request is recorded
   (audit ``decision``; decision 0072).

Exit status: 0 the device passed (now healthy); 1 it failed or cannot be
validated; 2 usage error. :func:`validate_device` is the API behind the command.
"""

from __future__ import annotations

import argparse
import getpass
import socket
import sys
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from trainguard._commands._common import add_state_option, error, print_json
from trainguard._commands.preflight import (
    add_check_options,
    build_options,
    print_report,
    write_report,
)

if TYPE_CHECKING:
    from trainguard.model.records import DeviceRecord
    from trainguard.preflight import PreflightOptions, PreflightReport, ValidationOutcome
    from trainguard.store import Store


DESCRIPTION = """\
Validate a quarantined or repaired device: move it to validating, run the
pre-flight checks on it (default level standard; kernel events since it was taken
out of service; a healthy device of the same host joins the all-reduce), record
the measurements, then healthy when every check passed, else back to repair.
After --max-failures failed validations in a row (default 3) retirement is due:
with --approve-retire the device is retired, otherwise a pending retirement
request is recorded. A device left in validating by an interrupted run is resumed.
Exit status: 0 passed (healthy), 1 failed or cannot be validated, 2 usage error.
"""


def _default_actor() -> str:
    try:
        return f"operator:{getpass.getuser()}"
    except Exception:  # no user name in this environment (containers)
        return "operator"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "validate",
        help="run the checks on a quarantined/repaired device: pass -> healthy, fail -> repair",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("id", metavar="ID", help="device UUID, PCI bus id or index")
    add_state_option(p)
    p.add_argument("--host", default=None, help="host of an index ID (default: any)")
    p.add_argument("--actor", default=None, help="who validates (default: operator:<user>)")
    p.add_argument(
        "--max-failures",
        type=int,
        default=3,
        metavar="N",
        help="failed validations in a row before retirement is due (default 3)",
    )
    p.add_argument(
        "--approve-retire",
        action="store_true",
        help="approve retirement: a device failing its N-th validation becomes retired",
    )
    add_check_options(p, default_level="standard")
    p.set_defaults(func=handle)


@dataclass(frozen=True)
class ValidationResult:
    """What :func:`validate_device` did."""

    uuid: str
    previous_state: str
    state: str
    outcome: ValidationOutcome
    report: PreflightReport

    def to_json(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "previous_state": self.previous_state,
            "state": self.state,
            "passed": self.outcome.passed,
            "failures": self.outcome.failures,
            "retire_due": self.outcome.retire_due,
            "retire_pending": self.outcome.retire_pending,
            "report": self.report.to_json(),
        }


class CannotValidate(ValueError):
    """The device is in a state validation does not apply to, or on another host."""


def _window_start(store: Store, rec: DeviceRecord) -> float:
    """When the device entered the state it is validated from (kernel events count after)."""
    from trainguard.model.health import HealthState

    if rec.state is not HealthState.VALIDATING:
        return rec.since
    history = store.device_history(rec.uuid)
    for i in range(len(history) - 1, 0, -1):
        if history[i].new_state is HealthState.VALIDATING:
            return history[i - 1].at
    return rec.since


def validate_device(
    store: Store,
    uuid: str,
    options: PreflightOptions,
    *,
    actor: str,
    max_failures: int = 3,
    approve_retire: bool = False,
    clock: Any = time.time,
    local_hosts: frozenset[str] | None = None,
) -> ValidationResult:
    """Validate one device through the store (see the module docstring)."""
    from trainguard.model.health import HealthState
    from trainguard.model.records import AuditKind
    from trainguard.preflight import run_preflight, validation_outcome
    from trainguard.preflight.results import measurements
    from trainguard.preflight.validation import VALIDATABLE

    rec = store.get_device(uuid)
    previous = rec.state
    if previous not in VALIDATABLE:
        hint = (
            "it is in service; check it with `trainguard preflight`"
            if previous.schedulable
            else "a retired device does not return"
        )
        raise CannotValidate(
            f"device {uuid} is {previous.value}: only a quarantined or repair device is "
            f"validated ({hint})"
        )
    hosts = local_hosts or frozenset({"localhost", socket.gethostname()})
    if rec.device.host not in hosts:
        raise CannotValidate(
            f"device {uuid} is on host {rec.device.host!r}; run `trainguard validate` there"
        )
    since = _window_start(store, rec)
    if previous is not HealthState.VALIDATING:
        store.transition_device(
            uuid, HealthState.VALIDATING,
            f"validation requested (level {options.level}) by {actor}", actor, clock(),
        )  # fmt: skip
    history = store.device_history(uuid)
    if options.kernel_since is None:
        options = replace(options, kernel_since=since)
    if not options.peers:
        # One healthy device of the same host joins the all-reduce, so that the
        # device's collective path is exercised (the peer itself is not judged).
        peers = [
            r.device
            for r in store.list_devices(host=rec.device.host)
            if r.uuid != uuid and r.state is HealthState.HEALTHY
        ]
        options = replace(options, peers=tuple(peers[:1]))
    report = run_preflight([rec.device], replace(options, dry_run_command=()))
    passed = report.device_passed(uuid)
    outcome = validation_outcome(
        passed, history, max_failures=max_failures, approve_retire=approve_retire
    )
    now = clock()
    summary = report.summary(uuid)
    data = {
        "level": report.level,
        "passed": passed,
        "backend": report.backend,
        "host": report.host,
        "failures": [
            {"check": r.key, "reason": r.reason}
            for r in report.failures
            if r.device in (uuid, None)
        ],
        "measurements": measurements(report, uuid),
        "validation_failures": outcome.failures,
        "injected_faults": list(report.injected_faults),
        "notes": list(report.notes),
    }
    with store.transaction():
        store.append_audit(
            now, actor, AuditKind.RESULT, f"device:{uuid}",
            f"validation {'passed' if passed else 'failed'}: {summary}", data,
        )  # fmt: skip
        if passed:
            store.transition_device(uuid, HealthState.HEALTHY, f"passed validation: {summary}",
                                    actor, now)  # fmt: skip
        else:
            store.transition_device(
                uuid, HealthState.REPAIR,
                f"failed validation {outcome.failures} of {max_failures}: {summary}", actor, now,
            )  # fmt: skip
            if outcome.final_state is HealthState.RETIRED:
                store.transition_device(
                    uuid, HealthState.RETIRED,
                    f"retired after {outcome.failures} failed validations; approved by {actor}",
                    actor, now,
                )  # fmt: skip
            elif outcome.retire_pending:
                store.append_audit(
                    now, actor, AuditKind.DECISION, f"device:{uuid}",
                    f"retirement requested: {outcome.failures} failed validations (limit "
                    f"{max_failures}); pending approval (`trainguard validate {uuid} "
                    "--approve-retire`)",
                    {"request": "retire", "status": "pending_approval",
                     "failures": outcome.failures, "max_failures": max_failures},
                )  # fmt: skip
    final = store.get_device(uuid)
    return ValidationResult(uuid, previous.value, final.state.value, outcome, report)


def handle(args: argparse.Namespace) -> int:
    from trainguard.model.statemachine import IllegalTransition
    from trainguard.store import NotFound, Store, StoreError

    if args.max_failures < 1:
        return error("--max-failures must be at least 1", 2)
    try:
        options = build_options(args, now=time.time())
    except ValueError as exc:
        return error(str(exc), 2)
    try:
        store = Store.open_existing(args.state)
    except StoreError as exc:
        return error(str(exc))
    if store is None:
        return error(f"no device {args.id!r}: no state database at {args.state}")
    actor = args.actor or _default_actor()
    with store:
        try:
            rec = store.find_device(args.id, host=args.host)
            if not args.json:
                print(
                    f"validating device {rec.device.index} {rec.uuid} ({rec.device.pci_bus_id}),"
                    f" {rec.state.value}, level {args.level}",
                    file=sys.stderr,
                )
            result = validate_device(
                store, rec.uuid, options, actor=actor, max_failures=args.max_failures,
                approve_retire=args.approve_retire,
            )  # fmt: skip
        except (NotFound, CannotValidate, IllegalTransition) as exc:
            return error(str(exc))
    if args.report:
        try:
            write_report(args.report, result.report)
        except OSError as exc:
            print(f"trainguard: cannot write {args.report}: {exc}", file=sys.stderr)
    if args.json:
        print_json(result.to_json())
    else:
        print_report(result.report)
        o = result.outcome
        line = f"device {result.uuid}: {result.previous_state} -> validating -> {result.state}"
        if not o.passed:
            line += f" (failed validation {o.failures} of {args.max_failures})"
        if o.retire_pending:
            line += "; retirement due: pending approval (--approve-retire)"
        print(line)
    return 0 if result.outcome.passed else 1
