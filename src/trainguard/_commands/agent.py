"""``trainguard agent``: the per-host reporter (inventory, kernel log, GPU metrics, findings)."""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import threading
from pathlib import Path
from typing import Any

from trainguard._commands._common import add_log_level_option, error, usage_error


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "agent",
        help="report this host's devices and failures to trainguard serve",
        description=(
            "Report this host's device inventory, follow its kernel log and GPU metrics, "
            "and push findings to the control plane. Findings are buffered on disk and "
            "delivered exactly once when the server is reachable again."
        ),
    )
    parser.add_argument("--server", required=True, metavar="URL", help="http://HOST:8470")
    parser.add_argument(
        "--token-file", required=True, metavar="FILE", help="file holding this host's agent token"
    )
    parser.add_argument("--host-name", metavar="H", help="name of this host (default: hostname)")
    parser.add_argument(
        "--kernel-log",
        metavar="FILE",
        help="follow this file, resuming where the agent stopped "
        "(default: journalctl -k or /dev/kmsg)",
    )
    parser.add_argument(
        "--kernel-log-from-start",
        action="store_true",
        help="on first start, read the kernel-log file from its beginning",
    )
    metrics = parser.add_mutually_exclusive_group()
    metrics.add_argument("--metrics-url", metavar="URL", help="DCGM exporter /metrics URL")
    metrics.add_argument("--metrics-file", metavar="FILE", help="a file in DCGM exporter format")
    parser.add_argument(
        "--buffer-dir",
        metavar="DIR",
        default=".trainguard/agent",
        help="where findings wait for the server (default .trainguard/agent)",
    )
    devices = parser.add_mutually_exclusive_group()
    devices.add_argument("--devices", type=int, metavar="N", help="simulate N GPUs (no driver)")
    devices.add_argument("--inventory", metavar="FILE", help="JSON inventory file")
    parser.add_argument(
        "--heartbeat-interval",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds between heartbeats to the server (default 1)",
    )
    parser.add_argument(
        "--metrics-interval",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds between reads of --metrics-url/--metrics-file (default 5)",
    )
    parser.add_argument(
        "--temp-threshold",
        type=float,
        default=90.0,
        metavar="C",
        help="GPU temperature in °C reported as a thermal finding (default 90)",
    )
    parser.add_argument(
        "--retry-max",
        type=float,
        default=30.0,
        metavar="S",
        help="longest wait between retries while the server is unreachable (default 30)",
    )
    add_log_level_option(parser, "info")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainguard.agent import Agent, AgentOptions
    from trainguard.agent.client import AgentError, read_token_file
    from trainguard.signals.inventory import InventoryError

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise
    if args.heartbeat_interval <= 0 or args.metrics_interval <= 0:
        return usage_error("intervals must be positive")
    if args.devices is not None and args.devices < 0:
        return usage_error("--devices must be 0 or more")
    try:
        token = read_token_file(args.token_file)
    except UnicodeDecodeError:
        return usage_error(f"token file {args.token_file} is not a text (UTF-8) file")
    except (OSError, AgentError) as exc:
        return usage_error(f"token file: {exc}")
    host = args.host_name or socket.gethostname()
    try:
        agent = Agent(
            AgentOptions(
                server=args.server,
                token=token,
                host=host,
                buffer_dir=Path(args.buffer_dir),
                kernel_log=args.kernel_log,
                kernel_log_from_start=args.kernel_log_from_start,
                metrics_url=args.metrics_url,
                metrics_file=args.metrics_file,
                devices=args.devices,
                inventory_file=args.inventory,
                heartbeat_interval=args.heartbeat_interval,
                metrics_interval=args.metrics_interval,
                temp_threshold_c=args.temp_threshold,
                backoff_max=max(0.2, args.retry_max),
            )
        )
    except (InventoryError, OSError) as exc:
        return error(str(exc))
    print(
        f"trainguard agent: host {host}, {len(agent.devices)} devices ({agent.inventory_message}), "
        f"server {args.server}, buffer {args.buffer_dir} ({agent.buffer.pending()} pending)",
        flush=True,
    )
    done = threading.Event()

    def stop(signum: int, _frame: Any) -> None:
        done.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    agent.start()
    try:
        while not done.wait(1.0):
            pass
    finally:
        agent.stop()
    print(
        f"trainguard agent: stopped ({agent.buffer.pending()} findings still buffered)", flush=True
    )
    return 0
