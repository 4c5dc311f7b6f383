"""``trainguard slurm``: protect the jobs of a Slurm cluster (watch) and look at it (status)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
from typing import Any

from trainguard._commands._common import (
    DEFAULT_STATE,
    add_log_level_option,
    error,
    print_json,
    print_table,
    usage_error,
)


def _cluster_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--slurm-conf",
        metavar="FILE",
        help="the cluster's slurm.conf (default: $SLURM_CONF, else Slurm's own default; "
        "with --ssh: a path on the login node, no default)",
    )
    parser.add_argument("--slurm-bin", metavar="DIR", help="where squeue/scontrol... are")
    ssh = parser.add_argument_group(
        "remote control over ssh (decision 0535): Slurm's commands run on a login node"
    )
    ssh.add_argument(
        "--ssh",
        metavar="USER@HOST",
        help="run every Slurm command on this login node over OpenSSH (key authentication, "
        "the host key checked); --slurm-conf and --slurm-bin then name paths there",
    )
    ssh.add_argument("--ssh-port", type=int, metavar="N", help="its ssh port (default 22)")
    ssh.add_argument(
        "--ssh-key", metavar="FILE", help="private key to log in with (default: ssh's own)"
    )
    ssh.add_argument(
        "--ssh-known-hosts",
        metavar="FILE",
        help="known-hosts file holding the login node's host key; only this file is "
        "consulted (default: ~/.ssh/known_hosts and the system's)",
    )
    ssh.add_argument(
        "--ssh-accept-new-host-key",
        action="store_true",
        help="trust the host key of a host not in the known-hosts file yet, and record it "
        "there (a changed key is still refused)",
    )
    ssh.add_argument(
        "--ssh-max-sessions",
        type=int,
        default=4,
        metavar="N",
        help="Slurm commands running at once over the one connection (default 4)",
    )
    parser.add_argument(
        "--slurm-state",
        metavar="DIR",
        help="trainguard's Slurm adapter state: keys, tokens, job identities "
        "(default: slurm/ next to the database)",
    )
    parser.add_argument("--partition", metavar="NAME", help="only this partition")
    parser.add_argument(
        "--inventory",
        metavar="FILE",
        default=os.environ.get("TRAINGUARD_SLURM_INVENTORY"),
        help="GPUs of each node as JSON {node: [{index, uuid, pci_bus_id}, ...]} "
        "(default: one stand-in device per GRES GPU)",
    )


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "slurm",
        help="protect Slurm jobs: drain bad nodes, requeue without them, resume, verify",
        description=(
            "trainguard on a Slurm cluster. `watch` runs the control plane's reconciler "
            "against Slurm: jobs that opted in (sbatch --comment trainguard[:policy=NAME,"
            "ckpt=DIR]) are recovered; the rest are left alone (or observed, with "
            "--observe-others). `status` shows the cluster as trainguard sees it."
        ),
    )
    sub = parser.add_subparsers(dest="slurm_command", metavar="COMMAND")
    sub.required = True

    watch = sub.add_parser(
        "watch",
        help="reconcile loop: findings -> plan -> drain/requeue/cancel -> verify",
        description=(
            "Watch the cluster and recover the jobs that opted in: node events (NOT_RESPONDING, "
            "DOWN, NODE_FAIL), kernel-log lines of each node (XID ...), job output (errors, "
            "progress) and hangs open incidents; plans are recorded before anything is done; "
            "in act mode the bad node is drained with a reason naming trainguard, the incident "
            "and the evidence, the job is requeued excluding it and resumes from the checkpoint "
            "trainguard selected; the restart is verified by its progress. Observe mode (the "
            "default) records the plans and touches nothing."
        ),
    )
    watch.add_argument(
        "--state",
        "--database",
        dest="state",
        default=DEFAULT_STATE,
        metavar="URL|PATH",
        help=f"SQLite file or postgresql:// URL (default {DEFAULT_STATE})",
    )
    _cluster_options(watch)
    watch.add_argument(
        "--mode",
        choices=("observe", "act"),
        default="observe",
        help="default mode where no scope sets one (default observe: record plans only)",
    )
    watch.add_argument(
        "--kernel-log",
        action="append",
        default=[],
        metavar="NODE=FILE",
        help="follow FILE as NODE's kernel log (repeatable)",
    )
    watch.add_argument(
        "--kernel-log-pattern",
        metavar="PATTERN",
        help="kernel log of every node: PATTERN with {node} replaced, e.g. "
        "/var/log/cluster/{node}/kern.log",
    )
    watch.add_argument(
        "--observe-others",
        action="store_true",
        help="also manage jobs that did not opt in, in observe mode (plans recorded, no action)",
    )
    watch.add_argument("--policy", metavar="FILE", help="store this YAML/JSON policy document")
    watch.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds/pass")
    watch.add_argument("--identity", metavar="NAME", help="name in the leader lease and audit")
    watch.add_argument("--once", action="store_true", help="one pass, print its report, exit")
    add_log_level_option(watch, "warning")
    watch.set_defaults(func=run_watch)

    status = sub.add_parser("status", help="nodes and jobs as trainguard sees them")
    _cluster_options(status)
    status.add_argument("--json", action="store_true", help="print JSON")
    status.add_argument(
        "--all", action="store_true", help="also jobs that did not opt in and finished ones"
    )
    status.set_defaults(func=run_status, state=DEFAULT_STATE)

    series = sub.add_parser(
        "series",
        help="job series: the Slurm jobs of one training run as one record",
        description=(
            "A job series is the Slurm jobs of one training run (the same job name, user "
            "and checkpoint directory: resubmissions, --dependency=singleton chains). "
            "Without SERIES: the series the store knows. With it: its jobs, incidents, "
            "planned stops, work lost, goodput, and why it was stopped."
        ),
    )
    series.add_argument("series", nargs="?", metavar="SERIES", help="a series id")
    series.add_argument(
        "--state",
        "--database",
        dest="state",
        default=DEFAULT_STATE,
        metavar="URL|PATH",
        help=f"SQLite file or postgresql:// URL (default {DEFAULT_STATE})",
    )
    series.add_argument("--json", action="store_true", help="print JSON")
    series.set_defaults(func=run_series)


def run_series(args: argparse.Namespace) -> int:
    from trainguard.store import NotFound, Store, StoreError
    from trainguard.store.series import format_series, list_series, series_report

    try:
        store = Store.open_existing(args.state)
    except StoreError as exc:
        return error(str(exc))
    if store is None:
        return error(f"no state database at {args.state}")
    with store:
        if not args.series:
            ids = list_series(store)
            print_json(ids) if args.json else print("\n".join(ids) or "no job series")
            return 0
        try:
            report = series_report(store, args.series)
        except NotFound:
            return error(f"no job series {args.series!r} in {args.state}")
    print_json(report) if args.json else print(format_series(report))
    return 0


def _commands(args: argparse.Namespace) -> Any:
    """Where Slurm's commands run: here, or on ``--ssh``'s login node (``ValueError`` for
    bad ssh options)."""
    from trainguard.schedulers.slurm.commands import SlurmCommands

    if not args.ssh:
        given = [
            flag
            for flag, value in (
                ("--ssh-port", args.ssh_port),
                ("--ssh-key", args.ssh_key),
                ("--ssh-known-hosts", args.ssh_known_hosts),
                ("--ssh-accept-new-host-key", args.ssh_accept_new_host_key),
            )
            if value
        ]
        if given:
            raise ValueError(f"{', '.join(given)}: only with --ssh USER@HOST")
        return SlurmCommands(
            conf=args.slurm_conf or os.environ.get("SLURM_CONF") or None, bindir=args.slurm_bin
        )
    from trainguard.schedulers.slurm.ssh import SshSlurmCommands, SshTarget

    if args.ssh_key and not os.path.isfile(args.ssh_key):
        raise ValueError(f"--ssh-key {args.ssh_key}: no such file")
    known = args.ssh_known_hosts
    if known and not args.ssh_accept_new_host_key and not os.path.isfile(known):
        # Without accept-new an absent file can only refuse the host: say so now.
        raise ValueError(f"--ssh-known-hosts {known}: no such file")
    target = SshTarget(
        args.ssh,
        port=args.ssh_port,
        key=args.ssh_key,
        known_hosts=args.ssh_known_hosts,
        accept_new_host_key=args.ssh_accept_new_host_key,
        max_sessions=args.ssh_max_sessions,
    )
    return SshSlurmCommands(target, conf=args.slurm_conf or None, bindir=args.slurm_bin)


def _scheduler(args: argparse.Namespace, commands: Any = None) -> Any:
    from pathlib import Path

    from trainguard.schedulers.slurm import SlurmScheduler

    state_dir = args.slurm_state
    if not state_dir:
        db = str(args.state)
        base = Path(db).parent if "://" not in db else Path(".trainguard")
        state_dir = str(base / "slurm")
    return SlurmScheduler(
        state_dir,
        partition=args.partition,
        inventory=args.inventory or None,
        commands=commands if commands is not None else _commands(args),
    )


def _require_tools(commands: Any) -> None:
    """Stop before the first pass when Slurm's commands are missing (or, over ssh, the
    login node refuses us): without them every pass would fail the same way, forever.
    Raises ``SchedulerError``."""
    commands.require("squeue", "sinfo", "scontrol")


def run_status(args: argparse.Namespace) -> int:
    from trainguard.schedulers.base import SchedulerError
    from trainguard.schedulers.slurm import SlurmObservedJob, SlurmObservedNode

    try:
        commands = _commands(args)
    except ValueError as exc:
        return usage_error(str(exc))
    try:
        obs = _scheduler(args, commands).observe()
    except SchedulerError as exc:
        return error(str(exc))
    finally:
        commands.close()
    nodes = [n for n in obs.nodes.values() if isinstance(n, SlurmObservedNode)]
    jobs = [
        j
        for j in obs.jobs.values()
        if isinstance(j, SlurmObservedJob) and (args.all or (j.opt_in and not j.phase.terminal))
    ]
    if args.json:
        print_json(
            {
                "nodes": [
                    {
                        "name": n.name,
                        "phase": n.phase.value,
                        "state": n.slurm_state,
                        "flags": list(n.flags),
                        "reason": n.reason,
                        "gpus": len(n.devices),
                        "quarantined_devices": list(n.quarantined_devices),
                    }
                    for n in nodes
                ],
                "jobs": [
                    {
                        **j.to_json(),
                        "job_id": j.job_id,
                        "slurm_state": j.slurm_state,
                        "restarts": j.restarts,
                        "opted_in": j.opt_in is not None,
                        "policy": j.opt_in.policy if j.opt_in else None,
                        "gpus_by_node": {k: list(v) for k, v in (j.gpus_by_node or {}).items()},
                    }
                    for j in jobs
                ],
            }
        )
        return 0
    print_table(
        "nodes",
        ("node", "phase", "slurm state", "reason", "gpus", "quarantined"),
        [
            (
                n.name,
                n.phase.value,
                "+".join([n.slurm_state, *n.flags]),
                n.reason or "",
                len(n.devices),
                ",".join(n.quarantined_devices),
            )
            for n in nodes
        ],
    )
    print_table(
        "jobs" if args.all else "jobs that opted in",
        ("ref", "name", "state", "attempt", "nodes", "gpus", "opt-in", "reason"),
        [
            (
                j.ref,
                j.name,
                j.slurm_state,
                j.attempt,
                ",".join(j.nodes),
                " ".join(f"{k}:{','.join(map(str, v))}" for k, v in (j.gpus_by_node or {}).items()),
                ("policy=" + j.opt_in.policy if j.opt_in and j.opt_in.policy else "yes")
                if j.opt_in
                else "no",
                j.reason or "",
            )
            for j in jobs
        ],
    )
    return 0


def run_watch(args: argparse.Namespace) -> int:
    from trainguard.controller.policies import PolicyError
    from trainguard.controller.reconcile import ControlConfig
    from trainguard.controller.slurm_watch import (
        SlurmWatch,
        SlurmWatchConfig,
        kernel_logs_from_spec,
    )
    from trainguard.model.plan import Mode
    from trainguard.schedulers.base import SchedulerError
    from trainguard.store import Store, StoreError

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s: %(message)s")
    if args.interval <= 0:
        return usage_error("--interval must be positive")
    try:
        kernel_logs = kernel_logs_from_spec(args.kernel_log)
    except ValueError as exc:
        return usage_error(str(exc))
    try:
        commands = _commands(args)
    except ValueError as exc:
        return usage_error(str(exc))
    try:
        _require_tools(commands)
        scheduler = _scheduler(args, commands)
        store = Store.open(args.state)
    except (ValueError, SchedulerError, StoreError, OSError) as exc:
        commands.close()
        return error(str(exc))
    watch = SlurmWatch(
        store,
        scheduler,
        config=ControlConfig(default_mode=Mode(args.mode), interval=args.interval),
        watch=SlurmWatchConfig(
            kernel_logs=kernel_logs,
            kernel_log_pattern=args.kernel_log_pattern,
            observe_others=args.observe_others,
            interval=args.interval,
        ),
        identity=args.identity,
    )
    if args.policy:
        try:
            with open(args.policy, encoding="utf-8") as fh:
                watch.cp.put_policy(fh.read(), actor="operator:cli")
        except (OSError, PolicyError, ValueError) as exc:
            return usage_error(f"--policy {args.policy}: {exc}")
    if args.once:
        report = watch.run_once()
        print_json(
            {
                "leader": report.leader,
                "opened": report.opened,
                "planned": report.planned,
                "applied": report.applied,
                "recovered": report.recovered,
                "errors": report.errors,
            }
        )
        store.close()
        commands.close()
        return 1 if report.errors else 0
    runtime = watch.runtime()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: runtime.stop())
    where = f" (over ssh to {commands.remote})" if commands.remote else ""
    print(
        f"trainguard slurm watch: cluster {scheduler.cluster}{where}, mode {args.mode}, "
        f"state {args.state}",
        flush=True,
    )
    runtime.run()  # gives the lease back as it stops
    store.close()
    commands.close()
    return 0
