"""Running Slurm's commands: argument lists only, a timeout, errors as SchedulerError.

Nothing here goes through a shell: every call is ``subprocess.run([...])`` with
arguments the adapter built from validated names (:mod:`.names`). The
environment may carry ``SLURM_CONF`` (a cluster other than the default one)
and a ``PATH`` with the Slurm tools; nothing else is added.

:class:`SlurmCommands` is the one place a Slurm command runs: here, on this host;
:class:`~trainguard.schedulers.slurm.ssh.SshSlurmCommands` runs the same argument
lists on a login node over OpenSSH (decision 0535) by overriding :meth:`launch`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trainguard.schedulers.base import SchedulerError

DEFAULT_TIMEOUT = 20.0


class SlurmCommandError(SchedulerError):
    """A Slurm command failed (non-zero exit, timeout, not installed)."""

    def __init__(self, argv: Sequence[str], message: str, returncode: int | None = None):
        super().__init__(f"{' '.join(argv[:3])}{' ...' if len(argv) > 3 else ''}: {message}")
        self.argv = list(argv)
        self.returncode = returncode


@dataclass
class SlurmCommands:
    """Where the Slurm tools are and how they are called.

    ``conf``: a ``slurm.conf`` path (``SLURM_CONF``) for a cluster other than the
    host's default; ``bindir``: where ``squeue``/``scontrol``... live (default: PATH).
    ``calls`` counts every command run (the benchmark reports it).
    """

    conf: str | None = None
    bindir: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    calls: int = 0
    seconds: float = 0.0
    env_extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def remote(self) -> str | None:
        """The host the commands run on when it is not this one (``None``: here)."""
        return None

    def require(self, *tools: str) -> None:
        """Raise :class:`SlurmCommandError` unless every tool can be run."""
        for name in tools:
            self.tool(name)

    def close(self) -> None:
        """Release what running commands holds (nothing here)."""

    def tool(self, name: str) -> str:
        if self.bindir:
            path = os.path.join(self.bindir, name)
            if not os.access(path, os.X_OK):
                raise SlurmCommandError([path], f"{name} not found in --slurm-bin {self.bindir}")
            return path
        found = shutil.which(name)
        if found is None:
            raise SlurmCommandError(
                [name], f"Slurm is not installed here ({name} not on PATH; see --slurm-bin)"
            )
        return found

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.conf:
            env["SLURM_CONF"] = self.conf
        env.update(self.env_extra)
        return env

    def launch(
        self, argv: list[str], timeout: float, input: str | None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` (the tool's path first) to its end or ``timeout``; raises
        :class:`SlurmCommandError` when it cannot run or times out."""
        try:
            return subprocess.run(
                argv,
                capture_output=True,
                text=True,
                errors="replace",
                env=self.env(),
                timeout=timeout,
                check=False,
                input=input,
                stdin=None if input is not None else subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            raise SlurmCommandError(argv, f"timed out after {exc.timeout:g} s") from exc
        except OSError as exc:
            raise SlurmCommandError(argv, f"cannot run: {exc}") from exc

    def run(
        self,
        name: str,
        *args: str,
        check: bool = True,
        timeout: float | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run Slurm's ``name`` with ``args``; ``input`` is its standard input (else none).
        A non-zero exit raises :class:`SlurmCommandError` unless ``check`` is false."""
        argv = [self.tool(name), *args]
        started = time.perf_counter()
        try:
            proc = self.launch(argv, self.timeout if timeout is None else timeout, input)
        finally:
            self.calls += 1
            self.seconds += time.perf_counter() - started
        if check and proc.returncode != 0:
            detail = (proc.stderr or proc.stdout or "").strip().splitlines()
            raise SlurmCommandError(
                argv,
                f"exit {proc.returncode}: {detail[-1] if detail else 'no message'}",
                proc.returncode,
            )
        return proc


__all__ = ["DEFAULT_TIMEOUT", "SlurmCommandError", "SlurmCommands"]
