"""Slurm's commands on a login node over OpenSSH: ``slurm watch`` outside the cluster.

The same argument lists :class:`~trainguard.schedulers.slurm.commands.SlurmCommands`
runs here, sent to ``USER@HOST`` (decision 0535):

* **Quoting.** ``ssh`` hands the remote side one string that the login shell parses, so
  each argument is quoted on its own (:func:`remote_command`: ``shlex.quote``, POSIX
  shells); nothing is ever joined unquoted. The login shell must be a POSIX one (sh,
  bash, dash, ksh, zsh), not csh.
* **Authentication.** ``BatchMode=yes`` (never a prompt), the key given
  (``IdentitiesOnly``), the host key checked against the known-hosts file given
  (``StrictHostKeyChecking=yes``; ``accept-new`` only when asked for).
* **A bounded pool.** One OpenSSH master connection per target (``ControlMaster``,
  its socket in a private 0700 directory, kept ``ControlPersist`` seconds after the
  last use) carries every command as a session; a semaphore bounds how many run at
  once (below sshd's ``MaxSessions``, 10 by default).
* **Timeouts.** The remote command runs under coreutils' ``timeout`` (it does not
  outlive its caller on the login node); the local ``ssh`` gets the same bound plus the
  connection's. Either way the call raises :class:`SlurmCommandError`, as a local
  command that times out does; so do a refused host key or key (with what to do).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from trainguard.schedulers.slurm.commands import DEFAULT_TIMEOUT, SlurmCommandError, SlurmCommands

# A user name and a host name or address: nothing that ssh could read as an option
# (a leading '-') or that holds a space, a quote or a shell character.
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
_HOST = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}"  # a name or an IPv4 address
    r"|\[[0-9A-Fa-f:.]+\]|[0-9A-Fa-f:]+:[0-9A-Fa-f:.]*"  # an IPv6 address
)
_TOOL = re.compile(r"[A-Za-z0-9_.+-]+")
REMOTE_KILL_AFTER = 5  # seconds between the remote timeout's TERM and its KILL
SSH_FAILED = 255  # ssh's own exit status: it could not connect or authenticate


def remote_command(argv: Sequence[str]) -> str:
    """The one string ``ssh`` sends for ``argv``: each argument quoted for a POSIX shell,
    so that the remote shell hands the command exactly ``argv``."""
    if not argv:
        raise ValueError("an empty command")
    for arg in argv:
        if "\0" in arg:
            raise ValueError("an argument holds a NUL byte")
    return " ".join(shlex.quote(arg) for arg in argv)


def parse_destination(text: str) -> tuple[str | None, str]:
    """``USER@HOST`` or ``HOST`` -> (user, host); ``ValueError`` for anything else."""
    user, sep, host = text.rpartition("@")
    if sep and not _USER.fullmatch(user):
        raise ValueError(f"--ssh {text!r}: not a user name")
    if not _HOST.fullmatch(host):
        raise ValueError(f"--ssh {text!r}: expected USER@HOST")
    return (user if sep else None), host


@dataclass(frozen=True)
class SshTarget:
    """Where and how to connect. ``key``/``known_hosts`` of ``None``: ssh's defaults
    (``~/.ssh/id_*``, ``~/.ssh/known_hosts``); the host key is checked either way."""

    destination: str  # USER@HOST
    port: int | None = None
    key: str | None = None
    known_hosts: str | None = None
    accept_new_host_key: bool = False
    max_sessions: int = 4
    persist: float = 60.0  # seconds the master connection outlives its last session
    connect_timeout: float = 10.0
    ssh: str = "ssh"  # the OpenSSH client

    def __post_init__(self) -> None:
        parse_destination(self.destination)
        if self.port is not None and not 0 < self.port < 65536:
            raise ValueError(f"--ssh-port {self.port}: not a port")
        if not 1 <= self.max_sessions <= 64:
            raise ValueError(f"--ssh-max-sessions {self.max_sessions}: expected 1..64")


def _control_dir() -> str:
    """A fresh private (0700) directory for the master's socket. A UNIX socket path holds
    at most 107 bytes: a long TMPDIR falls back to /tmp."""
    base = tempfile.gettempdir()
    if len(base) > 40:
        base = "/tmp"
    path = tempfile.mkdtemp(prefix="tg-ssh-", dir=base)
    os.chmod(path, 0o700)
    return path


def _stop_master(options: list[str], destination: str, control_dir: str) -> None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run([*options, "-O", "exit", "--", destination], capture_output=True,
                       timeout=5, check=False, stdin=subprocess.DEVNULL)  # fmt: skip
    shutil.rmtree(control_dir, ignore_errors=True)


class SshSlurmCommands(SlurmCommands):
    """:class:`SlurmCommands` whose commands run on ``target`` (see the module docstring).

    ``conf``/``bindir`` name paths *on the login node*; ``active``/``peak`` count the
    sessions running now and at most (the pool's bound, for tests and the benchmark).
    """

    def __init__(
        self,
        target: SshTarget,
        *,
        conf: str | None = None,
        bindir: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__(conf=conf, bindir=bindir, timeout=timeout)
        self.target = target
        self.control_dir = _control_dir()
        self._slots = threading.BoundedSemaphore(target.max_sessions)
        self._lock = threading.Lock()
        self.active = 0
        self.peak = 0
        self._finalizer = weakref.finalize(
            self, _stop_master, self.ssh_options(), target.destination, self.control_dir
        )

    @property
    def remote(self) -> str | None:
        return self.target.destination

    def ssh_argv(self) -> list[str]:
        """``ssh`` and its options, up to and including the destination."""
        return [*self.ssh_options(), "--", self.target.destination]

    def ssh_options(self) -> list[str]:
        """``ssh`` and its options (key, host key check, port, master connection)."""
        t = self.target
        argv = [t.ssh, "-T", "-o", "BatchMode=yes"]
        argv += ["-o", f"StrictHostKeyChecking={'accept-new' if t.accept_new_host_key else 'yes'}"]
        if t.known_hosts:
            # Only this file decides: the system-wide list is not consulted.
            argv += ["-o", f"UserKnownHostsFile={t.known_hosts}"]
            argv += ["-o", "GlobalKnownHostsFile=/dev/null"]
        if t.key:
            argv += ["-i", t.key, "-o", "IdentitiesOnly=yes"]
        if t.port is not None:
            argv += ["-p", str(t.port)]
        argv += [
            "-o", "ControlMaster=auto",
            "-o", f"ControlPath={self.control_dir}/%C",
            "-o", f"ControlPersist={max(1, round(t.persist))}",
            "-o", f"ConnectTimeout={max(1, round(t.connect_timeout))}",
            "-o", "ServerAliveInterval=15",
            "-o", "ServerAliveCountMax=3",
        ]  # fmt: skip
        return argv

    def tool(self, name: str) -> str:
        if not _TOOL.fullmatch(name):
            raise SlurmCommandError([name], "not a tool name")
        return posixpath.join(self.bindir, name) if self.bindir else name

    def remote_argv(self, argv: Sequence[str], timeout: float) -> list[str]:
        """What the login node runs: ``timeout``, ``env`` with ``SLURM_CONF`` (and the extra
        environment) when given, then the tool and its arguments."""
        env = ([f"SLURM_CONF={self.conf}"] if self.conf else []) + [
            f"{k}={v}" for k, v in self.env_extra.items()
        ]
        bound = ["timeout", "-k", str(REMOTE_KILL_AFTER), f"{timeout:g}"]
        return [*bound, *(["env", *env] if env else []), *argv]

    def require(self, *tools: str) -> None:
        """Each tool answers ``--version`` on the login node (this also proves the
        connection, the host key and the key)."""
        for name in tools:
            proc = self.run(name, "--version", check=False, timeout=15)
            if proc.returncode == 127:
                raise SlurmCommandError(
                    [name],
                    f"{name} not found on {self.target.destination} (the PATH of a "
                    "non-interactive ssh session; see --slurm-bin)",
                    127,
                )
            if proc.returncode != 0:
                raise SlurmCommandError([name], _last_line(proc), proc.returncode)

    def launch(
        self, argv: list[str], timeout: float, input: str | None
    ) -> subprocess.CompletedProcess[str]:
        remote = remote_command(self.remote_argv(argv, timeout))
        # The slot wait and the connection count against the caller's bound too.
        deadline = time.monotonic() + timeout + self.target.connect_timeout + REMOTE_KILL_AFTER
        if not self._slots.acquire(timeout=deadline - time.monotonic()):
            raise SlurmCommandError(argv, f"no ssh session free after {timeout:g} s")
        try:
            with self._lock:
                self.active += 1
                self.peak = max(self.peak, self.active)
            proc = super().launch(
                [*self.ssh_argv(), remote], max(1.0, deadline - time.monotonic()), input
            )
        except SlurmCommandError as exc:
            raise SlurmCommandError(argv, str(exc).split(": ", 1)[-1]) from exc
        finally:
            with self._lock:
                self.active -= 1
            self._slots.release()
        if proc.returncode == 124:
            raise SlurmCommandError(argv, f"timed out after {timeout:g} s on the login node")
        if proc.returncode == SSH_FAILED:
            raise SlurmCommandError(argv, self._ssh_failure(proc), SSH_FAILED)
        return proc

    def _ssh_failure(self, proc: subprocess.CompletedProcess[str]) -> str:
        t = self.target
        text = proc.stderr or ""
        where = f"ssh to {t.destination}" + (f" port {t.port}" if t.port else "")
        if "Host key verification failed" in text or "IDENTIFICATION HAS CHANGED" in text:
            known = t.known_hosts or "~/.ssh/known_hosts"
            return (
                f"{where}: host key verification failed: the host's key is not the one in "
                f"{known} (or it is not there); check it and add it (ssh-keyscan"
                f"{' -p ' + str(t.port) if t.port else ''} HOST), or pass "
                "--ssh-accept-new-host-key to trust a host seen for the first time"
            )
        if "Permission denied" in text:
            return (
                f"{where}: key authentication refused (key {t.key or 'ssh default'}): the key "
                "is not authorised for this user on the host"
            )
        if "UNPROTECTED PRIVATE KEY" in text or "bad permissions" in text:
            return f"{where}: the key {t.key} is readable by others: ssh refuses it (chmod 600)"
        return f"{where} failed: {_last_line(proc)}"

    def close(self) -> None:
        """Stop the master connection and remove its private directory."""
        self._finalizer()


def _last_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = (proc.stderr or proc.stdout or "").strip().splitlines()
    return lines[-1] if lines else f"exit {proc.returncode}"


__all__ = [
    "REMOTE_KILL_AFTER",
    "SshSlurmCommands",
    "SshTarget",
    "parse_destination",
    "remote_command",
]
