"""``trainguard devices``: device health as the state database (or ``--server``) records it.

* ``trainguard devices [--json]`` lists every device with its health state;
* ``trainguard devices release ID --reason TEXT`` returns a quarantined or
  suspect device to service (recorded in its health history and the audit log;
  its open repair record is closed, outcome ``released``);
* ``trainguard devices retire ID --reason TEXT`` asks to retire a device for good
  (a ``retire`` approval; ``trainguard approve`` decides it);
* ``trainguard devices history ID [--json]`` shows a device's health history.

ID is a device UUID, a PCI bus id (any spelling: ``0000:c1:00.0``,
``00000000:C1:00.0``, ``PCI:0000:c1:00``) or a local device index. Every command
goes through the operations interface (:func:`trainguard._commands._remote.operations`):
the same control-plane code whether on ``--state`` or ``--server``.
"""

from __future__ import annotations

import argparse
from typing import Any

from trainguard._commands._common import (
    DEFAULT_STATE,
    add_state_option,
    error,
    print_json,
    print_table,
    usage_error,
)
from trainguard._commands._remote import (
    NoDatabase,
    RemoteError,
    add_server_option,
    operations,
)
from trainguard.controller.operations import OperationError
from trainguard.model.actors import actor_name


def _sub_state_option(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS: a --state given before the sub-command must not be overwritten
    # by this parser's default.
    parser.add_argument(
        "--state",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help=f"SQLite state database (default: {DEFAULT_STATE})",
    )


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "devices",
        help="device health: list, release, history",
        description="List devices and their health; release a quarantined device.",
    )
    add_state_option(parser)
    add_server_option(parser)
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=run_list)
    sub = parser.add_subparsers(dest="devices_action", metavar="ACTION")

    release = sub.add_parser(
        "release",
        help="return a quarantined or suspect device to service",
        description="Return a quarantined or suspect device to service (-> healthy). "
        "The reason is recorded in the device's health history and the audit log.",
    )
    release.add_argument("id", metavar="ID", help="device UUID, PCI bus id or index")
    release.add_argument("--reason", required=True, help="why it is safe to use again")
    release.add_argument(
        "--actor", default=None, help="who releases it (default: operator:<user name>)"
    )
    release.add_argument("--host", default=None, help="host of an index ID (default: any)")
    _sub_state_option(release)
    add_server_option(release, sub=True)
    release.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON"
    )
    release.set_defaults(func=run_release)

    retire = sub.add_parser(
        "retire",
        help="ask to retire a device for good (an approval a person decides)",
        description="Request the retirement of a device in quarantine or repair: a retire "
        "approval is created; `trainguard approve ID --reason ...` carries it out.",
    )
    retire.add_argument("id", metavar="ID", help="device UUID, PCI bus id or index")
    retire.add_argument("--reason", required=True, help="why it should leave the fleet")
    retire.add_argument("--actor", default=None, help="who asks (default: operator:<user name>)")
    retire.add_argument("--host", default=None, help="host of an index ID (default: any)")
    _sub_state_option(retire)
    add_server_option(retire, sub=True)
    retire.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    retire.set_defaults(func=run_retire)

    history = sub.add_parser("history", help="a device's health history")
    history.add_argument("id", metavar="ID", help="device UUID, PCI bus id or index")
    history.add_argument("--host", default=None, help="host of an index ID (default: any)")
    _sub_state_option(history)
    add_server_option(history, sub=True)
    history.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON"
    )
    history.set_defaults(func=run_history)


def _history_table(title: str, history: list[dict[str, Any]]) -> None:
    print_table(
        title,
        ["AT", "FROM", "TO", "ACTOR", "INCIDENT", "REASON"],
        [
            [
                h["at"],
                h["old_state"] or "-",
                h["new_state"],
                actor_name(h["actor"]),
                h["incident_id"] or "-",
                h["reason"],
            ]
            for h in history
        ],
    )


def run_list(args: argparse.Namespace) -> int:
    where = ""
    devices: list[dict[str, Any]] = []
    try:
        with operations(args) as ops:
            devices = ops.devices()
    except NoDatabase:
        # Listing an absent database is not an error: nothing is recorded yet.
        where = f" (no state database at {args.state})"
    except (RemoteError, OperationError) as exc:
        return error(str(exc))
    if args.json:
        print_json(devices)
        return 0
    if not devices:
        print(f"no devices recorded{where}; `trainguard run` registers the devices it uses")
        return 0
    print_table(
        "Devices",
        ["INDEX", "UUID", "PCI BUS ID", "HOST", "MODEL", "STATE", "SINCE", "REASON"],
        [
            [
                d["index"],
                d["uuid"],
                d["pci_bus_id"],
                d["host"],
                d["model"],
                d["state"],
                d["since"],
                d["reason"],
            ]
            for d in devices
        ],
    )
    return 0


def run_release(args: argparse.Namespace) -> int:
    from trainguard.controller.operations import ErrorKind, Target

    reason = (args.reason or "").strip()
    if not reason:
        return usage_error("--reason must not be empty: say why the device is safe to use again")
    try:
        with operations(args, args.actor) as ops:
            before = ops.device(args.id, host=args.host)  # for its state before
            try:
                dev = ops.release(Target.device(before["uuid"], args.host), reason)
            except OperationError as exc:
                if exc.kind is not ErrorKind.CONFLICT:
                    raise
                return error(
                    f"device {before['uuid']} is {before['state']}; only a quarantined or "
                    "suspect device can be released (a device in repair returns through "
                    "validation)"
                )
    except (RemoteError, OperationError) as exc:
        return error(str(exc))
    if getattr(args, "json", False):
        print_json(dev)
    else:
        print(
            f"released device {dev['index']} {dev['uuid']} ({dev['pci_bus_id']}): "
            f"{before['state']} -> {dev['state']}"
        )
    return 0


def run_retire(args: argparse.Namespace) -> int:
    from trainguard.controller.operations import Target

    reason = (args.reason or "").strip()
    if not reason:
        return usage_error("--reason must not be empty: say why the device should be retired")
    try:
        with operations(args, args.actor) as ops:
            dev = ops.device(args.id, host=args.host)
            approval = ops.request_retire(Target.device(dev["uuid"], args.host), reason)
    except (RemoteError, OperationError) as exc:
        return error(str(exc))
    if getattr(args, "json", False):
        print_json(approval)
    else:
        print(
            f"retirement of device {dev['index']} {dev['uuid']} requested: approval "
            f"{approval['id']} {approval['state']} "
            f"(`trainguard approve {approval['id']} --reason ...`)"
        )
    return 0


def run_history(args: argparse.Namespace) -> int:
    try:
        with operations(args) as ops:
            dev = ops.device(args.id, host=args.host)
            history = ops.device_history(dev["uuid"], host=args.host)
    except (RemoteError, OperationError) as exc:
        return error(str(exc))
    if getattr(args, "json", False):
        print_json(history)
        return 0
    _history_table(f"Health history of {dev['uuid']} ({dev['pci_bus_id']})", history)
    return 0
