"""The raw reads of a Slurm cluster: its config, jobs, nodes and slurmd liveness.

Every read is one bounded command (:class:`~trainguard.schedulers.slurm.commands.SlurmCommands`:
an argument list, a timeout, errors as :class:`SchedulerError`): ``squeue --json`` and
``sinfo --json`` where the tools have ``--json``, else ``scontrol show job -d -o`` /
``scontrol show node -o``. What comes back is parsed (:mod:`.parse`), not interpreted.
"""

from __future__ import annotations

import re
import socket

from trainguard.schedulers.base import SchedulerError
from trainguard.schedulers.slurm import names
from trainguard.schedulers.slurm.commands import SlurmCommandError, SlurmCommands
from trainguard.schedulers.slurm.parse import (
    ParseError,
    SlurmJob,
    SlurmNode,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    parse_sinfo_json,
    parse_squeue_json,
)


class SlurmClient:
    """Slurm's tools, read through ``cmd``; ``use_json`` (``None``: probe once) picks the
    JSON output or ``scontrol -o``."""

    def __init__(self, cmd: SlurmCommands, *, use_json: bool | None = None) -> None:
        self.cmd = cmd
        self.use_json = use_json
        self._config: dict[str, str] | None = None

    def config(self) -> dict[str, str]:
        """``scontrol show config`` as a dict (empty when slurmctld cannot be asked)."""
        if self._config is None:
            try:
                out = self.cmd.run("scontrol", "show", "config", timeout=10).stdout
            except SchedulerError:
                return {}
            self._config = {
                m.group(1): m.group(2).strip()
                for m in re.finditer(r"^(\w+)\s*=\s*(.*)$", out, re.MULTILINE)
            }
        return self._config

    def _json_ok(self, tool: str) -> bool:
        if self.use_json is not None:
            return self.use_json
        try:
            proc = self.cmd.run(tool, "--json", check=False, timeout=10)
        except SchedulerError:
            self.use_json = False
            return False
        self.use_json = proc.returncode == 0 and proc.stdout.lstrip().startswith("{")
        return self.use_json

    def slurm_jobs(self) -> list[SlurmJob]:
        """Every job slurmctld knows (all users; finished ones until MinJobAge)."""
        if self._json_ok("squeue"):
            out = self.cmd.run("squeue", "--json").stdout
            try:
                return parse_squeue_json(out)
            except ParseError as exc:
                raise SchedulerError(str(exc)) from exc
        proc = self.cmd.run("scontrol", "show", "job", "-d", "-o", check=False)
        if proc.returncode != 0 and "No jobs" not in (proc.stdout + proc.stderr):
            raise SlurmCommandError(["scontrol", "show", "job"], proc.stderr.strip())
        return parse_scontrol_jobs(proc.stdout)

    def slurm_nodes(self) -> list[SlurmNode]:
        if self._json_ok("squeue"):
            out = self.cmd.run("sinfo", "--json").stdout
            try:
                return parse_sinfo_json(out)
            except ParseError as exc:
                raise SchedulerError(str(exc)) from exc
        return parse_scontrol_nodes(self.cmd.run("scontrol", "show", "node", "-o").stdout)

    def slurmd_answers(self, node: SlurmNode, timeout: float = 0.5) -> bool | None:
        """Whether the node's slurmd accepts a TCP connection (``None``: address unknown).

        Slurm notices a dead node only after ``SlurmdTimeout`` pings; a refused or silent
        slurmd port is the same fact, seconds earlier (decision 0106). Commands that run
        on a login node (``cmd.remote``): ``None``, the nodes' addresses are the
        cluster's, not reachable from here (decision 0535)."""
        if not node.address or not node.port or self.cmd.remote is not None:
            return None
        try:
            with socket.create_connection((node.address, node.port), timeout=timeout):
                return True
        except OSError:
            return False

    def slurm_job(self, job_id: str) -> SlurmJob | None:
        jid = names.job_id(job_id)
        for job in self.slurm_jobs():
            if job.job_id == jid:
                return job
        return None

    def slurm_node(self, node: str) -> SlurmNode | None:
        name = names.node(node)
        for n in self.slurm_nodes():
            if n.name == name:
                return n
        return None


__all__ = ["SlurmClient"]
