"""``trainguard devices``: device health as the state database records it.

* ``trainguard devices [--json]`` lists every device with its health state;
* ``trainguard devices release ID --reason TEXT`` returns a quarantined or
  suspect device to service (recorded in its health history and the audit log);
* ``trainguard devices history ID [--json]`` shows a device's health history.

ID is a device UUID, a PCI bus id (any spelling: ``0000:c1:00.0``,
``00000000:C1:00.0``, ``PCI:0000:c1:00``) or a local device index.
"""

from __future__ import annotations

import argparse
import getpass
import time
from typing import Any

from trainguard._commands._common import (
    DEFAULT_STATE,
    add_state_option,
    error,
    print_json,
    print_table,
    usage_error,
)
from trainguard._commands._remote import RemoteError, add_server_option, get_json, post_json


def _sub_state_option(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS: a --state given before the sub-command must not be overwritten
    # by this parser's default.
    parser.add_argument(
        "--state",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help=f"SQLite state database (default: {DEFAULT_STATE})",
    )


def _default_actor() -> str:
    try:
        return f"operator:{getpass.getuser()}"
    except Exception:  # no user name in this environment (containers)
        return "operator"


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

    history = sub.add_parser("history", help="a device's health history")
    history.add_argument("id", metavar="ID", help="device UUID, PCI bus id or index")
    history.add_argument("--host", default=None, help="host of an index ID (default: any)")
    _sub_state_option(history)
    add_server_option(history, sub=True)
    history.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON"
    )
    history.set_defaults(func=run_history)


def run_list(args: argparse.Namespace) -> int:
    from trainguard.store import Store, StoreError

    if args.server:
        try:
            devices = get_json(args, "/v1/devices")
        except RemoteError as exc:
            return error(str(exc))
        where = ""
    else:
        try:
            store = Store.open_existing(args.state)
        except StoreError as exc:
            return error(str(exc))
        where = "" if store is not None else f" (no state database at {args.state})"
        devices = []
        if store is not None:
            with store:
                devices = [d.to_json() for d in store.list_devices()]
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
    from trainguard.model.statemachine import IllegalTransition
    from trainguard.store import NotFound, Store, StoreError

    reason = (args.reason or "").strip()
    if not reason:
        return usage_error("--reason must not be empty: say why the device is safe to use again")
    if getattr(args, "server", None):
        # Through the API the actor is the token's holder (operator:<name>), not --actor.
        try:
            rec_json = post_json(
                args,
                f"/v1/devices/{args.id}/release" + (f"?host={args.host}" if args.host else ""),
                {"reason": reason},
            )
        except RemoteError as exc:
            return error(str(exc))
        if getattr(args, "json", False):
            print_json(rec_json)
        else:
            print(f"released device {rec_json['index']} {rec_json['uuid']}: -> {rec_json['state']}")
        return 0
    try:
        store = Store.open_existing(args.state)
    except StoreError as exc:
        return error(str(exc))
    if store is None:
        return error(f"no device {args.id!r}: no state database at {args.state}")
    with store:
        try:
            dev = store.find_device(args.id, host=args.host)
            rec = store.release_device(
                dev.uuid, reason, args.actor or _default_actor(), time.time()
            )
        except NotFound as exc:
            return error(str(exc))
        except IllegalTransition:
            return error(
                f"device {dev.uuid} is {dev.state.value}; only a quarantined or suspect device "
                "can be released (a device in repair returns through validation)"
            )
    if getattr(args, "json", False):
        print_json(rec.to_json())
    else:
        print(
            f"released device {rec.device.index} {rec.uuid} ({rec.device.pci_bus_id}): "
            f"{dev.state.value} -> {rec.state.value}"
        )
    return 0


def run_history(args: argparse.Namespace) -> int:
    from trainguard.store import NotFound, Store, StoreError

    if getattr(args, "server", None):
        try:
            history = get_json(args, f"/v1/devices/{args.id}/history", host=args.host)
        except RemoteError as exc:
            return error(str(exc))
        if getattr(args, "json", False):
            print_json(history)
        else:
            print_table(
                f"Health history of {args.id}",
                ["AT", "FROM", "TO", "ACTOR", "INCIDENT", "REASON"],
                [
                    [
                        h["at"],
                        h["old_state"] or "-",
                        h["new_state"],
                        h["actor"],
                        h["incident_id"] or "-",
                        h["reason"],
                    ]
                    for h in history
                ],
            )
        return 0
    try:
        store = Store.open_existing(args.state)
    except StoreError as exc:
        return error(str(exc))
    if store is None:
        return error(f"no device {args.id!r}: no state database at {args.state}")
    with store:
        try:
            dev = store.find_device(args.id, host=args.host)
        except NotFound as exc:
            return error(str(exc))
        history = [h.to_json() for h in store.device_history(dev.uuid)]
    if getattr(args, "json", False):
        print_json(history)
        return 0
    print_table(
        f"Health history of {dev.uuid} ({dev.device.pci_bus_id})",
        ["AT", "FROM", "TO", "ACTOR", "INCIDENT", "REASON"],
        [
            [
                h["at"],
                h["old_state"] or "-",
                h["new_state"],
                h["actor"],
                h["incident_id"] or "-",
                h["reason"],
            ]
            for h in history
        ],
    )
    return 0
