"""``trainguard validate ID``: run the pre-flight checks on a quarantined or repaired device.

The way back to service for a device in repair (a quarantined one may also be
released by an operator, on record). It goes through the operations interface
(:mod:`trainguard.controller.operations`: the control plane on ``--state``, or its
HTTP API with ``--server URL``, the same code either way), so the repair record,
the health history, the audit log and approvals stay one story:

1. ``request_validation``: ``quarantined`` or ``repair`` -> ``validating``, the
   repair record follows (a device left in ``validating`` by an interrupted run is
   resumed: it stays unschedulable until then);
2. the checks of ``--level`` (default ``standard``) run on the device; kernel events
   count from the moment the device entered the state it is validated from, and one
   healthy device of the same host joins the all-reduce (not judged itself);
3. ``record_validation``, in one transaction: an audit ``result`` record with the
   measurements, and
   ``validating -> healthy`` (repair closed, ``validated``) or ``validating ->
   repair`` (the measurements kept in the repair record);
4. after ``--max-failures`` failed validations of one repair (the control plane's
   default, 2) a ``retire`` approval is requested; retiring happens only when a
   person approves it (``trainguard approve ID --reason ...``; decision 0072).

When the checks that judge the GPU could not run (the CPU stand-in, no NVIDIA
driver, no DCGM), passing checks are *inconclusive*: the device goes back to
``repair`` (not counted as a failure) unless ``--accept-partial`` is given, and the
output says what was and was not checked.

Exit status: 0 the device passed (now healthy); 1 it failed, was inconclusive or
cannot be validated; 2 usage error. :func:`validate_device` is the API behind the command.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from trainguard._commands._common import add_state_option, error, print_json
from trainguard._commands._remote import NoDatabase, RemoteError, add_server_option, operations
from trainguard._commands.preflight import (
    add_check_options,
    build_options,
    checks_bar,
    print_report,
    write_report,
)
from trainguard.controller.operations import OperationError

if TYPE_CHECKING:
    from trainguard.controller.operations import Json, Operations
    from trainguard.model.devices import Device
    from trainguard.preflight import PreflightOptions, PreflightReport

DESCRIPTION = """\
Validate a quarantined or repaired device: move it to validating, run the
pre-flight checks on it (default level standard; kernel events since it was taken
out of service; a healthy device of the same host joins the all-reduce), record
the measurements, then healthy when every check passed, else back to repair.
After --max-failures failed validations of one repair (default: the control
plane's, 2) a retire approval is requested; `trainguard approve ID --reason ...`
retires the device. A device left in validating by an interrupted run is resumed.
When the GPU checks could not run here (CPU stand-in, no driver), passing checks
are inconclusive: the device stays in repair unless --accept-partial is given.
Exit status: 0 passed (healthy), 1 failed, inconclusive or cannot be validated,
2 usage error.
"""

# States validation starts from (validating: an interrupted validation, resumed).
VALIDATABLE = ("quarantined", "repair", "validating")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "validate",
        help="run the checks on a quarantined/repaired device: pass -> healthy, fail -> repair",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("id", metavar="ID", help="device UUID, PCI bus id or index")
    add_state_option(p)
    add_server_option(p)
    p.add_argument("--host", default=None, help="host of an index ID (default: any)")
    p.add_argument(
        "--actor",
        default=None,
        help="who validates on --state (default: operator:<user>; with --server: the "
        "token's holder)",
    )
    p.add_argument(
        "--max-failures",
        type=int,
        default=None,
        metavar="N",
        help="failed validations of one repair before a retire approval is requested "
        "(default: the control plane's, 2)",
    )
    p.add_argument(
        "--accept-partial",
        action="store_true",
        help="return the device to service even when the GPU checks could not run here "
        "(CPU stand-in, no NVIDIA driver, no DCGM); without it such a validation is "
        "inconclusive and the device stays in repair",
    )
    add_check_options(p, default_level="standard")
    p.set_defaults(func=handle)


@dataclass(frozen=True)
class ValidationResult:
    """What :func:`validate_device` did."""

    uuid: str
    previous_state: str
    state: str
    passed: bool
    failures: int  # failed validations of the device's current repair record
    repair_id: int | None
    retire_approval: int | None  # a pending ``retire`` approval, when one was requested
    report: PreflightReport
    not_checked: tuple[str, ...] = ()  # what the checks could not look at (partial evidence)
    inconclusive: bool = False  # the checks passed, but on partial evidence not accepted

    def to_json(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "previous_state": self.previous_state,
            "state": self.state,
            "passed": self.passed,
            "failures": self.failures,
            "repair_id": self.repair_id,
            "retire_approval": self.retire_approval,
            "not_checked": list(self.not_checked),
            "inconclusive": self.inconclusive,
            "report": self.report.to_json(),
        }


def not_checked(report: PreflightReport, uuid: str) -> tuple[str, ...]:
    """What about the device the checks could not look at. Evidence from the CPU stand-in
    or without the driver says nothing about the GPU that had the XID."""
    from trainguard.preflight.results import CheckStatus

    out: list[str] = []
    if report.backend == "cpu":
        out.append("the GPU itself (compute and memory checks ran on the CPU stand-in)")
    for r in report.results:
        if r.device in (uuid, None) and r.status is CheckStatus.NOT_APPLICABLE:
            if r.check == "device_query":
                out.append(f"the device's error counters (ECC, remapped rows): {r.reason}")
            elif r.check == "dcgm":
                out.append(f"DCGM diagnostics: {r.reason}")
    return tuple(out)


class CannotValidate(ValueError):
    """The device is in a state validation does not apply to, or on another host."""


def _window_start(ops: Operations, dev: Json) -> float:
    """When the device entered the state it is validated from (kernel events count after)."""
    from trainguard.model.records import parse_iso_utc

    if dev["state"] != "validating":
        return parse_iso_utc(dev["since"])
    history = ops.device_history(dev["uuid"])
    for i in range(len(history) - 1, 0, -1):
        if history[i]["new_state"] == "validating":
            return parse_iso_utc(history[i - 1]["at"])
    return parse_iso_utc(dev["since"])


def _device(d: Json) -> Device:
    from trainguard.model.devices import Device

    return Device(
        int(d["index"]), d["uuid"], d["pci_bus_id"], d["model"], int(d["memory_mb"]), d["host"]
    )


def validate_device(
    ops: Operations,
    uuid: str,
    options: PreflightOptions,
    *,
    max_failures: int | None = None,
    local_hosts: frozenset[str] | None = None,
    accept_partial: bool = False,
    on_results: Callable[[Sequence[Any]], None] | None = None,
) -> ValidationResult:
    """Validate one device through the operations interface (see the module docstring):
    on a state database or through ``--server``, the same control-plane code."""
    from trainguard.controller.operations import Target
    from trainguard.model.health import HealthState
    from trainguard.preflight import run_preflight
    from trainguard.preflight.results import measurements

    rec = ops.device(uuid)
    previous = str(rec["state"])
    if previous not in VALIDATABLE:
        hint = (
            "it is in service; check it with `trainguard preflight`"
            if HealthState(previous).schedulable
            else "a retired device does not return"
        )
        raise CannotValidate(
            f"device {uuid} is {previous}: only a quarantined or repair device is "
            f"validated ({hint})"
        )
    hosts = local_hosts or frozenset({"localhost", socket.gethostname()})
    if rec["host"] not in hosts:
        raise CannotValidate(
            f"device {uuid} is on host {rec['host']!r}; run `trainguard validate` there"
        )
    target = Target.device(uuid)
    actor = ops.whoami()
    since = _window_start(ops, rec)
    # Idempotent in validating: a validation interrupted half-way is resumed (and a device
    # put there by hand gets its repair record).
    ops.request_validation(target, f"validation requested (level {options.level}) by {actor}")
    if options.kernel_since is None:
        options = replace(options, kernel_since=since)
    if not options.peers:
        # One healthy device of the same host joins the all-reduce, so that the
        # device's collective path is exercised (the peer itself is not judged).
        peers = [
            _device(d)
            for d in ops.devices(host=rec["host"])
            if d["uuid"] != uuid and d["state"] == "healthy"
        ]
        options = replace(options, peers=tuple(peers[:1]))
    report = run_preflight(
        [_device(rec)], replace(options, dry_run_command=()), on_results=on_results
    )
    checks_passed = report.device_passed(uuid)
    missing = not_checked(report, uuid)
    # Passing checks that could not see the GPU do not return it (the XID it had may be
    # the GPU's own); an operator may accept that evidence, on record.
    inconclusive = checks_passed and bool(missing) and not accept_partial
    passed = checks_passed and not inconclusive
    summary = report.summary(uuid)
    if inconclusive:
        summary = f"inconclusive: checks passed, but not checked: {'; '.join(missing)}"
    elif checks_passed and missing:
        summary += f" (partial evidence accepted by {actor}; not checked: {'; '.join(missing)})"
    data = {
        "level": report.level,
        "passed": passed,
        "inconclusive": inconclusive,
        "not_checked": list(missing),
        "summary": summary,
        "backend": report.backend,
        "host": report.host,
        "failures": [
            {"check": r.key, "reason": r.reason}
            for r in report.failures
            if r.device in (uuid, None)
        ],
        "measurements": measurements(report, uuid),
        "injected_faults": list(report.injected_faults),
        "notes": list(report.notes),
    }
    # The control plane keeps the result (an audit ``result`` record with ``data``) and
    # moves the device and its repair record on, in one transaction.
    repair = ops.record_validation(
        target, passed, data, inconclusive=inconclusive, failures_to_retire=max_failures
    )
    approval = next(
        (
            a["id"]
            for a in ops.approvals("pending")
            if a["kind"] == "retire" and a["subject"] == f"device:{uuid}"
        ),
        None,
    )
    final = ops.device(uuid)
    return ValidationResult(
        uuid, previous, str(final["state"]), passed,
        0 if passed else int(repair["failed_validations"]), int(repair["id"]), approval,
        report, missing, inconclusive,
    )  # fmt: skip


def _checked_text(report: PreflightReport, uuid: str) -> str:
    from trainguard.preflight.results import CheckStatus

    done = sorted(
        {
            f"{r.check}/{r.name}"
            for r in report.results
            if r.device in (uuid, None) and r.status is not CheckStatus.NOT_APPLICABLE
        }
    )
    where = " on the CPU stand-in" if report.backend == "cpu" else ""
    return (", ".join(done) or "nothing") + where


def handle(args: argparse.Namespace) -> int:
    if args.max_failures is not None and args.max_failures < 1:
        return error("--max-failures must be at least 1", 2)
    try:
        options = build_options(args, now=time.time())
    except ValueError as exc:
        return error(str(exc), 2)
    try:
        with operations(args, args.actor) as ops:
            rec = ops.device(args.id, host=args.host)
            if not args.json:
                print(
                    f"validating device {rec['index']} {rec['uuid']} ({rec['pci_bus_id']}),"
                    f" {rec['state']}, level {args.level}",
                    file=sys.stderr,
                )
            with checks_bar(args, f"validating {rec['uuid']}") as on_results:
                result = validate_device(
                    ops,
                    rec["uuid"],
                    options,
                    max_failures=args.max_failures,
                    accept_partial=args.accept_partial,
                    on_results=on_results,
                )
    except NoDatabase as exc:
        return error(f"no device {args.id!r}: {exc}")
    except (RemoteError, OperationError, CannotValidate) as exc:
        return error(str(exc))
    if args.report:
        try:
            write_report(args.report, result.report)
        except OSError as exc:
            print(f"trainguard: cannot write {args.report}: {exc}", file=sys.stderr)
    if args.json:
        print_json(result.to_json())
    else:
        print_report(result.report, verdict="PARTIAL" if result.not_checked else None)
        line = f"device {result.uuid}: {result.previous_state} -> validating -> {result.state}"
        if result.not_checked:
            print("checked: " + _checked_text(result.report, result.uuid))
            print("not checked: " + "; ".join(result.not_checked))
        if result.inconclusive:
            line += (
                " (INCONCLUSIVE: the checks passed, but could not see the GPU; it stays out "
                "of service. Validate it on its host with the NVIDIA driver, or give "
                "--accept-partial to return it on this evidence)"
            )
        elif not result.passed:
            line += f" (failed validation {result.failures} of repair {result.repair_id})"
        if result.retire_approval is not None:
            line += (
                f"; retirement requested: approval {result.retire_approval} pending "
                f"(`trainguard approve {result.retire_approval} --reason ...`)"
            )
        print(line)
    return 0 if result.passed else 1
