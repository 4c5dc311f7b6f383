"""A ``trainguard slurm watch`` driven pass by pass by a test (or the benchmark).

Everything is real: the local Slurm cluster, the store (SQLite), the adapter, the
reconciler. Only the loop is the caller's (``run_until``), so a test can wait for
exactly the state of the world it asserts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurm.harness import LocalSlurm, steps_in, train_args
from trainguard.controller.reconcile import ControlConfig, PassReport
from trainguard.controller.slurm_watch import SlurmWatch, SlurmWatchConfig
from trainguard.model.plan import Mode
from trainguard.model.records import IncidentRecord
from trainguard.schedulers.slurm import SlurmObservedJob, SlurmScheduler
from trainguard.schedulers.slurm.commands import SlurmCommands
from trainguard.store import Store


class Watcher:
    def __init__(
        self,
        cluster: LocalSlurm,
        tmp: Path,
        *,
        mode: str = "act",
        policy: dict[str, Any] | None = None,
        interval: float = 0.5,
        commands: SlurmCommands | None = None,
    ) -> None:
        self.cluster = cluster
        self.tmp = tmp
        self.interval = interval
        # ``commands``: Slurm's commands run elsewhere (over ssh), with their own conf.
        self.scheduler = SlurmScheduler(
            tmp / "slurm-state",
            conf=cluster.conf,
            inventory=cluster.inventory,
            poll=0.1,
            commands=commands,
        )
        self.store = Store.open(str(tmp / "state.db"))
        self.watch = SlurmWatch(
            self.store,
            self.scheduler,
            config=ControlConfig(default_mode=Mode(mode), interval=interval),
            watch=SlurmWatchConfig(
                kernel_log_pattern=str(cluster.dir / "nodes" / "{node}" / "kern.log"),
                interval=interval,
            ),
            identity="test-slurm-watch",
        )
        self.watch.cp.put_policy(
            {"name": "default", "verify_window_seconds": 3, "backoff": 0.0, **(policy or {})},
            "operator:test",
        )
        self.reports: list[PassReport] = []

    def submit(
        self,
        ckpt: Path,
        *,
        comment: str | None = None,
        extra: tuple[str, ...] = (),
        sbatch: tuple[str, ...] = (),
        steps: int = 400,
        sleep: float = 0.15,
    ) -> str:
        """The 2-node torchrun job, opted in with ``trainguard:ckpt=<ckpt>`` by default."""
        opt = comment if comment is not None else f"trainguard:ckpt={ckpt}"
        return self.cluster.sbatch(
            "--nodes=2",
            "--ntasks-per-node=1",
            "--gres=gpu:1",
            "--job-name=tiny",
            f"--output={self.tmp}/out-%j.txt",
            *([f"--comment={opt}"] if opt else []),
            *sbatch,
            *train_args(ckpt, steps=steps, sleep=sleep, extra=extra),
        )

    def output(self, job_id: str) -> Path:
        return self.tmp / f"out-{job_id}.txt"

    def steps(self, job_id: str) -> list[int]:
        return steps_in(self.output(job_id))

    def job(self, job_id: str) -> SlurmObservedJob:
        return self.scheduler.job(job_id)

    def run_once(self) -> PassReport:
        report = self.watch.run_once()
        self.reports.append(report)
        assert not report.errors, report.errors
        return report

    def run_until(self, pred: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            started = time.monotonic()
            self.run_once()
            value = pred()
            if value:
                return value
            if time.monotonic() > deadline:
                states = [(i.id, i.state.value, i.summary[:80]) for i in self.incidents()]
                raise AssertionError(
                    f"timed out after {timeout:g} s waiting for {what}; incidents: {states}"
                )
            time.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    def incidents(self) -> list[IncidentRecord]:
        return self.store.incidents.list_incidents()

    def managed_job_id(self, slurm_job_id: str) -> str:
        fj = self.watch.cp.fleet.jobs.find_fleet_job(slurm_job_id)
        assert fj is not None, f"job {slurm_job_id} is not managed"
        return fj.job_id

    def incident_state(self, slurm_job_id: str) -> str | None:
        fj = self.watch.cp.fleet.jobs.find_fleet_job(slurm_job_id)
        if fj is None:
            return None
        incs = self.store.incidents.list_incidents(job_id=fj.job_id)
        return incs[-1].state.value if incs else None

    def audit(self) -> list[Any]:
        return list(self.store.audit.list_audit())

    def close(self) -> None:
        self.store.close()
        self.scheduler.cmd.close()


__all__ = ["Watcher"]
