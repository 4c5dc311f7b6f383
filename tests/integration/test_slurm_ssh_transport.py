"""The ssh transport of ``slurm watch --ssh`` against a real sshd on loopback.

``tests/sshd_fixture.py`` starts OpenSSH's sshd (``scripts/sshd-local.sh``: a generated
host key, one authorised key). The commands here are coreutils (``--slurm-bin /usr/bin``):
the transport does not care which tool it runs; the Slurm end-to-end test is
``tests/e2e/test_slurm_ssh.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sshd_fixture import LocalSshd, local_sshd
from trainguard.schedulers.slurm.commands import SlurmCommandError
from trainguard.schedulers.slurm.ssh import SSH_FAILED

__all__ = ["local_sshd"]  # the fixture, re-exported for pytest

BIN = "/usr/bin"


def _new_key(tmp_path: Path, name: str) -> Path:
    key = tmp_path / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=30
    )
    return key


def _procs_with(needle: str) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if needle in cmd:
                out.append(int(p.name))
    return out


def test_commands_run_on_the_remote_side_with_their_arguments_intact(
    local_sshd: LocalSshd,
) -> None:
    cmds = local_sshd.commands(bindir=BIN, conf="/etc/slurm dir/slurm.conf")
    try:
        weird = ["a b", "it's", "$HOME", "`id`", "x\ny", "-n", "*", ""]
        before = local_sshd.sessions()
        proc = cmds.run("printf", "%s\\0", *weird)
        assert proc.stdout.split("\0")[:-1] == weird
        # It ran in an ssh session (sshd logged one; the session's environment says so),
        # with SLURM_CONF set there to the path given.
        env = dict(
            line.split("=", 1) for line in cmds.run("env").stdout.splitlines() if "=" in line
        )
        assert "SSH_CONNECTION" not in os.environ and env["SSH_CONNECTION"].startswith("127.0.0.1 ")
        assert env["SLURM_CONF"] == "/etc/slurm dir/slurm.conf"
        assert local_sshd.sessions() >= before + 2
        # A failing command keeps its exit status; check=True raises with it.
        assert cmds.run("false", check=False).returncode == 1
        with pytest.raises(SlurmCommandError) as err:
            cmds.run("false")
        assert err.value.returncode == 1
        assert cmds.calls == 4
    finally:
        cmds.close()


def test_the_connection_is_shared_and_closed(local_sshd: LocalSshd) -> None:
    cmds = local_sshd.commands(bindir=BIN)
    control = Path(cmds.control_dir)
    for _ in range(3):
        cmds.run("true")
    # One master connection: its socket in the private directory, one mux process.
    (socket,) = list(control.iterdir())
    assert oct(control.stat().st_mode & 0o777) == "0o700"
    assert _procs_with(f"{socket} [mux]") or _procs_with(str(socket))
    cmds.close()
    assert not control.exists()
    deadline = time.monotonic() + 5
    while _procs_with(str(socket)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _procs_with(str(socket)), "the master connection outlived close()"


def test_a_remote_command_that_runs_too_long_is_stopped_on_both_sides(
    local_sshd: LocalSshd,
) -> None:
    cmds = local_sshd.commands(bindir=BIN)
    try:
        started = time.monotonic()
        with pytest.raises(SlurmCommandError, match="timed out after 1 s"):
            cmds.run("sleep", "31.734", timeout=1)
        assert time.monotonic() - started < 15
        deadline = time.monotonic() + 10
        while _procs_with("sleep 31.734") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _procs_with("sleep 31.734"), "the remote command outlived its timeout"
    finally:
        cmds.close()


def test_a_wrong_host_key_is_refused_and_nothing_runs(
    local_sshd: LocalSshd, tmp_path: Path
) -> None:
    other = _new_key(tmp_path, "other_host_key")
    known = tmp_path / "known_hosts"
    pub = " ".join(other.with_suffix(".pub").read_text().split()[:2])
    known.write_text(f"[127.0.0.1]:{local_sshd.port} {pub}\n")
    marker = tmp_path / "ran"
    cmds = local_sshd.commands(bindir=BIN, known_hosts=str(known))
    try:
        with pytest.raises(SlurmCommandError) as err:
            cmds.run("touch", str(marker))
        assert err.value.returncode == SSH_FAILED
        assert "host key verification failed" in str(err.value)
        assert str(known) in str(err.value)
        assert not marker.exists()
        # Even asked to accept new keys, a *changed* key stays refused.
        cmds.close()
        cmds = local_sshd.commands(bindir=BIN, known_hosts=str(known), accept_new_host_key=True)
        with pytest.raises(SlurmCommandError, match="host key verification failed"):
            cmds.run("touch", str(marker))
        assert not marker.exists()
    finally:
        cmds.close()


def test_an_unknown_host_is_refused_unless_new_keys_are_accepted(
    local_sshd: LocalSshd, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    cmds = local_sshd.commands(bindir=BIN, known_hosts=str(known))
    try:
        with pytest.raises(SlurmCommandError, match="host key verification failed"):
            cmds.run("true")
    finally:
        cmds.close()
    cmds = local_sshd.commands(bindir=BIN, known_hosts=str(known), accept_new_host_key=True)
    try:
        cmds.run("true")
    finally:
        cmds.close()
    # Trusted on first use and recorded: the key now in the file is the server's.
    server_key = (local_sshd.dir / "host_key.pub").read_text().split()[1]
    assert server_key in known.read_text()


def test_a_key_the_server_does_not_authorise_fails_clearly(
    local_sshd: LocalSshd, tmp_path: Path
) -> None:
    stranger = _new_key(tmp_path, "stranger")
    cmds = local_sshd.commands(bindir=BIN, key=str(stranger))
    try:
        with pytest.raises(SlurmCommandError) as err:
            cmds.run("true")
        assert err.value.returncode == SSH_FAILED
        assert "key authentication refused" in str(err.value) and str(stranger) in str(err.value)
    finally:
        cmds.close()


def test_a_tool_missing_on_the_login_node_is_named(local_sshd: LocalSshd, tmp_path: Path) -> None:
    cmds = local_sshd.commands(bindir=str(tmp_path / "nowhere"))
    try:
        with pytest.raises(SlurmCommandError, match="squeue not found on"):
            cmds.require("squeue")
    finally:
        cmds.close()


def test_concurrent_commands_are_bounded_by_the_pool(local_sshd: LocalSshd, tmp_path: Path) -> None:
    """Six callers at once, two sessions allowed: never more than two commands run on
    the remote side at the same time (each counts the live markers there)."""
    live = tmp_path / "live"
    live.mkdir()
    script = 'touch "$1/$$"; ls "$1" | wc -l; sleep 0.6; rm -f "$1/$$"'
    cmds = local_sshd.commands(bindir=BIN, max_sessions=2)
    seen: list[int] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            seen.append(int(cmds.run("sh", "-c", script, "sh", str(live)).stdout.strip()))
        except BaseException as exc:
            errors.append(exc)

    try:
        cmds.run("true")  # the master connection first: the callers share it
        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert len(seen) == 6 and max(seen) <= 2
        assert cmds.peak == 2 and cmds.active == 0
    finally:
        cmds.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--ssh=-oProxyCommand=touch {marker}"], "expected USER@HOST"),
        (["--ssh", "u@h", "--ssh-key", "{marker}"], "no such file"),
        (["--ssh", "u@h", "--ssh-port", "0"], "not a port"),
    ],
)
def test_bad_ssh_options_are_refused_before_anything_runs(
    tmp_path: Path, options: list[str], message: str
) -> None:
    marker = tmp_path / "ran"
    proc = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "slurm", "watch", "--once"]
        + [o.replace("{marker}", str(marker)) for o in options]
        + ["--state", str(tmp_path / "s.db")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2 and message in proc.stderr
    assert not marker.exists() and not (tmp_path / "s.db").exists()


def test_ssh_options_without_ssh_are_refused(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "slurm", "status", "--ssh-port", "2222"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2 and "--ssh-port: only with --ssh USER@HOST" in proc.stderr
