"""``trainguard serve``: the control plane (API, dashboard, /metrics, controller loop)."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from trainguard._commands._common import (
    DEFAULT_STATE,
    add_breaker_options,
    add_log_level_option,
    breaker_config,
    error,
    usage_error,
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the control plane: HTTP API, dashboard, /metrics, controller",
        description=(
            "Run the cluster control plane in one process: the HTTP API under /v1, the "
            "dashboard at /, Prometheus metrics at /metrics and the controller loop. "
            "Binds 127.0.0.1 unless --host says otherwise; starts in observe mode."
        ),
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8470, help="port (default 8470; 0: any free)")
    parser.add_argument(
        "--database",
        "--state",
        dest="database",
        default=DEFAULT_STATE,
        metavar="URL|PATH",
        help=f"SQLite file or postgresql:// URL (default {DEFAULT_STATE})",
    )
    parser.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="PEM certificate (chain): serve HTTPS (with --tls-key); without it plain HTTP, "
        "meant for loopback",
    )
    parser.add_argument("--tls-key", metavar="FILE", help="the PEM private key of --tls-cert")
    parser.add_argument(
        "--insecure-bind",
        action="store_true",
        help="serve plain HTTP on a --host that is not loopback (refused without it: tokens "
        "and reports would cross the network in clear text)",
    )
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        help="YAML/JSON token file: token -> {role, name} (default: tokens.yaml next to the "
        "database, created with one token per role when missing)",
    )
    parser.add_argument(
        "--mode",
        choices=("observe", "act"),
        default="observe",
        help="default mode where no scope sets one (default observe: record plans, act on nothing)",
    )
    parser.add_argument(
        "--public-read",
        action="store_true",
        help="let requests without a token read, as a viewer: jobs (names, commands, "
        "checkpoint dirs), nodes and GPU UUIDs, incidents with their log evidence, plans, "
        "actions, approvals, repairs, policies, the audit log and the dashboard; on a "
        "non-loopback --host that is everyone who can reach it. /metrics (host names, GPU "
        "UUIDs, job ids) needs no token even without this flag",
    )
    parser.add_argument(
        "--reconcile-interval", type=float, default=1.0, metavar="S", help="seconds between passes"
    )
    parser.add_argument(
        "--no-controller",
        action="store_true",
        help="serve the API and ingestion only (a standby that never acts)",
    )
    parser.add_argument(
        "--scheduler",
        metavar="NAME|MODULE:FACTORY",
        help="the cluster scheduler the controller acts through: 'procs' (local process "
        "groups, the stand-in cluster) or a ClusterScheduler factory (MODULE:NAME or "
        "FILE.py:NAME); without one the controller records and acts on nothing",
    )
    parser.add_argument(
        "--procs-root", metavar="DIR", help="state of the procs cluster (default: next to the db)"
    )
    parser.add_argument(
        "--procs-nodes",
        default="n1=2",
        metavar="N=K,...",
        help="procs cluster nodes and their simulated devices on first use (default n1=2)",
    )
    parser.add_argument("--identity", metavar="NAME", help="name in the leader lease and audit")
    parser.add_argument(
        "--loop",
        choices=("process", "thread"),
        default="process",
        help="run the reconcile loop in a child process (default: keeps the API responsive "
        "while a pass runs) or in a thread of the API process",
    )
    parser.add_argument("--repair-webhook", metavar="URL", help="POST repair records here")
    parser.add_argument("--page-webhook", metavar="URL", help="POST pages (breaker trips) here")
    parser.add_argument(
        "--keep-rejected-in-place",
        action="store_true",
        help="leave damaged checkpoints where they are (default: before a requeue they are "
        "moved into <checkpoint dir>/.trainguard-rejected/ with a note of why)",
    )
    parser.add_argument(
        "--bmc-config",
        metavar="FILE",
        help="the nodes' BMCs (TOML, one [nodes.NAME] table each; see `trainguard bmc`): in "
        "act mode a node that stops answering is looked at out of band, isolated, "
        "power-cycled after an approval and returned after it answers again (0242)",
    )
    parser.add_argument(
        "--max-ranks",
        type=int,
        default=16_384,
        metavar="N",
        help="the most ranks a job may report progress from when its world size is unknown "
        "(no torchrun command line), and the cap on any job's (default 16384); "
        "a report from a rank past a job's world size is refused with 422",
    )
    add_breaker_options(parser)
    add_log_level_option(parser, "warning")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainguard.api.auth import TokenFileError
    from trainguard.api.server import ServeError, ServeOptions, serve
    from trainguard.store import StoreError

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s: %(message)s")
    if args.port < 0 or args.port > 65535:
        return usage_error(f"--port {args.port} is not a port number")
    if args.reconcile_interval <= 0:
        return usage_error("--reconcile-interval must be positive")
    if args.max_ranks < 1:
        return usage_error("--max-ranks must be at least 1")
    options = ServeOptions(
        host=args.host,
        port=args.port,
        database=args.database,
        token_file=args.token_file,
        mode=args.mode,
        public_read=args.public_read,
        reconcile_interval=args.reconcile_interval,
        log_level=args.log_level,
        controller=not args.no_controller,
        scheduler=args.scheduler,
        procs_root=args.procs_root,
        procs_nodes=args.procs_nodes,
        holder=args.identity,
        loop=args.loop,
        repair_webhook=args.repair_webhook,
        page_webhook=args.page_webhook,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        insecure_bind=args.insecure_bind,
        default_database=args.database == DEFAULT_STATE,
        keep_rejected_in_place=args.keep_rejected_in_place,
        bmc_config=args.bmc_config,
        breaker=breaker_config(args),
        max_ranks=args.max_ranks,
    )
    try:
        return serve(options, say=lambda m: print(m, flush=True))
    except ServeError as exc:
        return error(str(exc), 2)  # a usage error: nothing was started or created
    except (TokenFileError, StoreError, ValueError, ImportError) as exc:
        return error(str(exc))
    except OSError as exc:
        return error(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
