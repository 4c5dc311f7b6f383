"""``trainguard run [OPTIONS] -- COMMAND...``: run a training job and keep it making progress."""

from __future__ import annotations

import argparse

from trainguard._commands._common import (
    add_breaker_options,
    add_state_option,
    breaker_config,
    error,
)
from trainguard._commands._policy_options import (
    add_policy_options,
    policy_error,
    policy_values,
)

DESCRIPTION = """\
Run COMMAND (typically `torchrun ... train.py`) under supervision. On a crash, a
hang or a GPU XID it quarantines the failed device, restarts from the newest valid
checkpoint on healthy devices (TRAINGUARD_RESUME_FROM), verifies the restart, and
records everything in the state database. Exit status: 0 when the job completes;
1 when it was stopped (reason on stderr); 2 for a usage or state-database error;
130 when interrupted; in observe mode, the job's own exit status. It never waits
for a person unless --approvals is given (then at most --approval-timeout seconds).
See docs/run.md.
"""


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be >= 0: {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text}")
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "run",
        help="run a training job with detection, isolation, restart and verification",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_state_option(p)
    p.add_argument("--checkpoint-dir", metavar="DIR", help="where the job writes checkpoints")
    p.add_argument(
        "--need",
        type=_non_negative_int,
        metavar="N",
        help="devices the job needs (default: every healthy device)",
    )
    p.add_argument(
        "--min-need",
        type=_non_negative_int,
        metavar="M",
        help="continue with as few as M devices when devices fail (default: exactly --need)",
    )
    inv = p.add_mutually_exclusive_group()
    inv.add_argument(
        "--devices",
        type=_non_negative_int,
        metavar="N",
        help="simulate N devices (machines without GPUs)",
    )
    inv.add_argument(
        "--inventory",
        metavar="FILE",
        help="JSON list of {index, uuid, pci_bus_id, model, memory_mb} describing the devices",
    )
    p.add_argument(
        "--kernel-log",
        metavar="FILE",
        help="follow FILE for XID lines (default: journalctl -k -f, else /dev/kmsg)",
    )
    p.add_argument(
        "--progress-pattern",
        metavar="REGEX",
        help="regex for progress lines; the step is group 'step' or the first group "
        "(default recognises step=N, step N, iteration N, [N/M])",
    )
    p.add_argument(
        "--mode",
        choices=("act", "observe"),
        default="act",
        help="act (default) or observe: record what would be done, do nothing",
    )
    p.add_argument(
        "--log-dir",
        metavar="DIR",
        help="per-attempt logs (default: <state dir>/logs/<job id>)",
    )
    p.add_argument(
        "--grace",
        type=_positive_float,
        default=5.0,
        metavar="S",
        help="SIGTERM -> SIGKILL grace when stopping an attempt (default 5)",
    )
    p.add_argument(
        "--settle",
        type=_non_negative_float,
        default=0.3,
        metavar="S",
        help="after the first sign of a failure, gather evidence this long (the other ranks' "
        "tracebacks, a kernel line) before deciding, unless the launcher has already "
        "exited and its output is drained (default 0.3; more on a loaded machine)",
    )
    p.add_argument(
        "--kill-grace",
        type=_non_negative_float,
        default=0.2,
        metavar="S",
        help="a failed attempt (crash, XID, hang) is killed directly, not through its "
        "launcher: SIGTERM to its ranks, SIGKILL to the whole tree after S seconds "
        "(default 0.2; 0: SIGKILL at once)",
    )
    p.add_argument(
        "--snapshot-flush-wait",
        type=_non_negative_float,
        default=3.0,
        metavar="S",
        help="before a failed attempt is killed, ranks that keep memory snapshots "
        "(CheckpointManager(memory_snapshots=True)) get the flush signal and up to S "
        "seconds to complete their newest one (default 3; 0: off; ranks that do not "
        "listen for it are not signalled)",
    )
    p.add_argument(
        "--warm-standby",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep a torchrun agent with torch already imported parked at idle priority "
        "(no GPU) while the job trains; a restart hands it the new attempt instead of "
        "starting a new interpreter; commands other than torchrun / python -m "
        "torch.distributed.run start cold, and the attempt log says why (default: on)",
    )
    p.add_argument(
        "--warm-workers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --warm-standby: the standby also keeps a preloaded copy of itself (a "
        "zygote) that forks the restarted torchrun's script workers instead of starting "
        "new interpreters that import torch; a worker it cannot start that way starts "
        "cold and the attempt log says why (default: on)",
    )
    p.add_argument("--quiet", action="store_true", help="do not echo the job's output")
    p.add_argument(
        "--preflight",
        choices=("quick", "standard", "thorough"),
        metavar="LEVEL",
        help="check the devices before the first attempt (quick, standard, thorough); "
        "a device that fails is quarantined and never assigned",
    )
    p.add_argument(
        "--resume-arg",
        metavar="TEMPLATE",
        help="arguments appended to the command of every restart that restores a "
        "checkpoint, {checkpoint} replaced by its path (shell-split), e.g. "
        "'--resume_from_checkpoint {checkpoint}' (HF Trainer) or 'ckpt_path={checkpoint}'; "
        "the first attempt runs as written (a template that starts with - and has no "
        "space needs the = form: --resume-arg=--ckpt={checkpoint})",
    )
    p.add_argument(
        "--keep-rejected-in-place",
        action="store_true",
        help="leave damaged checkpoints where they are (default: before a restart they are "
        "moved into <checkpoint dir>/.trainguard-rejected/ with a note of why, so a script "
        "that loads its own newest checkpoint loads a valid one)",
    )
    p.add_argument(
        "--lease-ttl",
        type=_positive_float,
        default=15.0,
        metavar="S",
        help="one trainguard at a time acts on a state database: a run that cannot renew "
        "its lease for S seconds (paused, stuck disk) loses it to the next (default 15)",
    )
    alloc = p.add_argument_group(
        "inside a Slurm allocation (srun --ntasks-per-node=1 trainguard run --spares K ...; "
        "docs/slurm.md)"
    )
    alloc.add_argument(
        "--spares",
        type=_non_negative_int,
        metavar="K",
        help="run as one node of the job's allocation: the first node leads, the command "
        "(torchrun) runs on all nodes but K, the K others are hot spares; a failure is "
        "recovered inside the allocation (the bad node left out, a spare in its place)",
    )
    alloc.add_argument(
        "--min-nodes",
        type=_non_negative_int,
        metavar="M",
        help="with --spares: with no spare left, continue on as few as M nodes (default: "
        "the MIN of --nnodes MIN:MAX, else every node); fewer: back to Slurm's requeue path",
    )
    alloc.add_argument(
        "--drain-via",
        metavar="URL",
        help="with --spares: ask this cluster-level trainguard (serve) to drain a bad node "
        "(token from TRAINGUARD_TOKEN); without it scontrol is used when permitted, else "
        "the exact scontrol line is recorded",
    )
    alloc.add_argument(
        "--node-address",
        metavar="ADDR",
        help="with --spares: the address the other nodes reach this one at (default: its "
        "host name, resolved)",
    )
    add_policy_options(p)
    add_breaker_options(p)
    p.add_argument(
        "--engine",
        action="store_true",
        help=argparse.SUPPRESS,  # kept so scripts that passed it still run (0380)
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from trainguard.controller.local_driver import LocalDriver
    from trainguard.controller.local_options import RunOptions
    from trainguard.model.plan import Mode
    from trainguard.model.policy_schema import PolicyError
    from trainguard.store import StoreError

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        return error("no command given: trainguard run [OPTIONS] -- COMMAND [ARGS...]", 2)
    if args.min_need is not None and args.need is not None and args.min_need > args.need:
        return error("--min-need cannot be larger than --need", 2)
    if args.approval_timeout_seconds is not None and not args.approvals:
        return error("--approval-timeout needs --approvals (run never waits without it)", 2)
    try:
        options = RunOptions(
            command=tuple(command),
            state=args.state,
            checkpoint_dir=args.checkpoint_dir,
            need=args.need,
            min_need=args.min_need,
            simulate_devices=args.devices,
            inventory_file=args.inventory,
            kernel_log=args.kernel_log,
            policy=policy_values(args),
            progress_pattern=args.progress_pattern,
            mode=Mode(args.mode),
            log_dir=args.log_dir,
            grace=args.grace,
            settle=args.settle,
            kill_grace=args.kill_grace,
            snapshot_flush_wait=args.snapshot_flush_wait,
            warm_standby=args.warm_standby,
            warm_workers=args.warm_workers,
            echo=not args.quiet,
            preflight=args.preflight,
            resume_arg=args.resume_arg,
            keep_rejected_in_place=args.keep_rejected_in_place,
            lease_ttl=args.lease_ttl,
            breaker=breaker_config(args),
        )
        if args.spares is not None:
            return _in_allocation(args, options)
        controller = LocalDriver(options)
    except PolicyError as exc:
        return error(policy_error(exc), 2)
    except ValueError as exc:
        return error(str(exc), 2)
    try:
        result = controller.run()
    except StoreError as exc:
        return error(str(exc), 2)
    # The controller has already said why on stderr ("trainguard: job stopped: ...").
    return result.exit_code


def _in_allocation(args: argparse.Namespace, options: object) -> int:
    """``--spares``: this node's part of the allocation (controller/alloc_driver.py)."""
    from trainguard.api.client import report_node_down
    from trainguard.controller.alloc_driver import AllocOptions, run_in_allocation
    from trainguard.controller.local_options import RunOptions
    from trainguard.store import StoreError

    assert isinstance(options, RunOptions)
    extra = AllocOptions(
        spares=args.spares,
        min_nodes=args.min_nodes or None,
        drain_via=args.drain_via,
        address=args.node_address,
        ask_cluster=report_node_down,
    )
    try:
        return run_in_allocation(options, extra)
    except StoreError as exc:
        return error(str(exc), 2)
