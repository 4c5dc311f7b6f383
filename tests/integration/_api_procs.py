"""Shared by the control-plane tests: start and stop real ``trainguard serve`` and
``trainguard agent`` processes, and talk to them.

Not a test module (leading underscore): ``tests/integration/test_api_*.py``,
``test_agent_*.py`` and ``tests/e2e/test_dashboard_*.py`` import it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

OP = "operator-token-0123456789"
VIEW = "viewer-token-0123456789ab"
AGENT = "agent-token-any-012345678"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_tokens(directory: Path) -> Path:
    path = directory / "tokens.yaml"
    path.write_text(
        f'"{OP}": {{role: operator, name: alice}}\n'
        f'"{VIEW}": {{role: viewer, name: grafana}}\n'
        f'"{AGENT}": {{role: agent, name: "*"}}\n'
    )
    (directory / "agent.token").write_text(AGENT + "\n")
    (directory / "operator.token").write_text(OP + "\n")
    return path


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("TRAINGUARD_SERVER", None)
    env.pop("TRAINGUARD_TOKEN", None)
    return env


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, OSError, ValueError, KeyError):
            last = predicate()
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


class Proc:
    """A child process with its output in a file (read it when a test fails)."""

    def __init__(
        self,
        args: Sequence[str],
        log: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ):
        self.args = list(args)
        self.log = log
        self._fh = open(log, "ab")  # noqa: SIM115
        self.p = subprocess.Popen(
            self.args,
            stdout=self._fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env or cli_env(),
            cwd=cwd,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self, sig: int = signal.SIGKILL) -> int:
        with contextlib.suppress(ProcessLookupError):
            self.p.send_signal(sig)
        try:
            return self.p.wait(20)
        finally:
            self._fh.close()

    def stop(self) -> int:
        return self.kill(signal.SIGTERM)


class Server(Proc):
    def __init__(self, directory: Path, port: int, *extra: str, log: str = "serve.log") -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        super().__init__(
            [
                sys.executable,
                "-m",
                "trainguard.cli",
                "serve",
                "--port",
                str(port),
                "--database",
                str(directory / "state.db"),
                "--token-file",
                str(directory / "tokens.yaml"),
                "--log-level",
                "info",
                *extra,
            ],
            directory / log,
        )
        wait_for(self._ready, 30, f"trainguard serve on port {port}\n{self.output()}")

    @classmethod
    def procs(
        cls, directory: Path, nodes: str, interval: float, *extra: str, mode: str = "act"
    ) -> Server:
        """A serve whose scheduler is the procs stand-in cluster under ``directory/cluster``
        (``nodes``: ``n1=4,n2=4``), reconciling every ``interval`` s."""
        return cls(
            directory, free_port(), "--scheduler", "procs",
            "--procs-root", str(directory / "cluster"), "--procs-nodes", nodes,
            "--mode", mode, "--reconcile-interval", str(interval), *extra,
        )  # fmt: skip

    def _ready(self) -> bool:
        if self.p.poll() is not None:
            raise AssertionError(f"serve exited {self.p.returncode}:\n{self.output()}")
        return httpx.get(self.url + "/healthz", timeout=1).status_code == 200

    def client(self, token: str = OP) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )


def start_agent(directory: Path, server_url: str, host: str, *extra: str) -> Proc:
    return Proc(
        [
            sys.executable,
            "-m",
            "trainguard.cli",
            "agent",
            "--server",
            server_url,
            "--token-file",
            str(directory / "agent.token"),
            "--host-name",
            host,
            "--buffer-dir",
            str(directory / f"agent-{host}"),
            "--heartbeat-interval",
            "0.2",
            "--retry-max",
            "0.5",
            *extra,
        ],
        directory / f"agent-{host}.log",
    )


def xid_line(n: int, pci: str = "0000:10:00") -> str:
    # Each line unique (n), all recognised as XID 13 by the classifier.
    return (
        f"Nov 29 12:00:{n % 60:02d} n1 kernel: NVRM: Xid (PCI:{pci}): 13, pid={1000 + n}, "
        f"name=python, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): seq {n}\n"
    )


def kill_cluster_jobs(root: Path) -> None:
    """Kill every process group the procs cluster started (they outlive serve on purpose)."""
    import json

    try:
        state = json.loads((root / "state.json").read_text())
    except (OSError, ValueError):
        return
    for job in state.get("jobs", {}).values():
        pid = job.get("pid")
        if pid:
            with contextlib.suppress(OSError):
                os.killpg(int(pid), signal.SIGKILL)


def listening_port(text: str) -> int | None:
    """The port of serve's "listening on" line, ``None`` before it is printed."""
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", text)
    return int(m.group(1)) if m else None
