"""A real OpenSSH server on loopback for the tests of ``slurm watch --ssh``.

``local_sshd`` (session fixture) brings up ``scripts/sshd-local.sh`` in a private
directory on its own port (Debian's openssh-server, installed when missing; a generated
host key; one authorised client key) and takes it down at the end.

Where it cannot start (no apt, no sshd): skipped with the reason, except under
``CI=true``, where that is a failure. ``TRAINGUARD_TEST_SSHD_DIR`` points the tests at a
server already running there (never taken down).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from trainguard.schedulers.slurm.ssh import SshSlurmCommands, SshTarget

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "sshd-local.sh"
DEFAULT_DIR = "/tmp/trainguard-sshd-test"
PORT = "17223"


@dataclass(frozen=True)
class LocalSshd:
    dir: Path
    port: int
    user: str
    key: str
    known_hosts: str
    env: dict[str, str]

    @property
    def destination(self) -> str:
        return f"{self.user}@127.0.0.1"

    def target(self, **changes: Any) -> SshTarget:
        options: dict[str, Any] = {"port": self.port, "key": self.key}
        options["known_hosts"] = self.known_hosts
        options.update(changes)
        return SshTarget(self.destination, **options)

    def commands(
        self,
        *,
        conf: str | None = None,
        bindir: str | None = None,
        timeout: float = 20.0,
        **target: Any,
    ) -> SshSlurmCommands:
        return SshSlurmCommands(self.target(**target), conf=conf, bindir=bindir, timeout=timeout)

    def sessions(self) -> int:
        """Sessions sshd has started so far (its log says so for each)."""
        try:
            text = (self.dir / "sshd.log").read_text(errors="replace")
        except OSError:
            return 0
        return len(re.findall(r"Starting session: command", text))

    def cli_options(self) -> list[str]:
        return [
            "--ssh",
            self.destination,
            "--ssh-port",
            str(self.port),
            "--ssh-key",
            self.key,
            "--ssh-known-hosts",
            self.known_hosts,
        ]


def _parse_env(text: str) -> dict[str, str]:
    return dict(re.findall(r"^export (\w+)=(.*)$", text, re.MULTILINE))


@pytest.fixture(scope="session")
def local_sshd() -> Iterator[LocalSshd]:
    in_ci = os.environ.get("CI", "").lower() == "true"
    given = os.environ.get("TRAINGUARD_TEST_SSHD_DIR")
    dir_ = Path(given or DEFAULT_DIR)
    env = {**os.environ, "TRAINGUARD_SSHD_DIR": str(dir_), "TRAINGUARD_SSHD_PORT": PORT}
    proc = subprocess.run(
        ["bash", str(SCRIPT), "env" if given else "up"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        why = f"scripts/sshd-local.sh up failed:\n{proc.stderr[-3000:]}"
        if in_ci:
            pytest.fail(f"CI=true and sshd could not start: {why}", pytrace=False)
        pytest.skip(why)
    values = _parse_env(proc.stdout)
    server = LocalSshd(
        dir=dir_,
        port=int(values["TRAINGUARD_SSHD_PORT"]),
        user=values["TRAINGUARD_SSHD_USER"],
        key=values["TRAINGUARD_SSHD_KEY"],
        known_hosts=values["TRAINGUARD_SSHD_KNOWN_HOSTS"],
        env=env,
    )
    try:
        yield server
    finally:
        if not given:
            subprocess.run(["bash", str(SCRIPT), "down"], env=env, timeout=60, check=False)


__all__ = ["LocalSshd", "local_sshd"]
