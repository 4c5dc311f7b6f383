"""LocalCluster launches what ``trainguard run`` launches (decision 0380, stage 1).

Real processes: a real torchrun job under a LocalCluster with a warm standby and a
progress socket. The requeued attempt is taken over by the parked standby, every
attempt gets the progress URL, and shutting the cluster down leaves nothing parked.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from trainguard.schedulers.base import JobPhase, JobSpec, Observation
from trainguard.schedulers.local import job_processes
from trainguard.schedulers.local_cluster import LocalCluster, LocalLaunch
from trainguard.schedulers.procs import simulated_devices
from trainguard.signals.output import is_annotation
from trainguard.signals.process import AttemptProcessExit, read_environ

JOB = (
    "import os\n"
    "print('attempt', os.environ['TRAINGUARD_ATTEMPT'], 'progress',"
    " os.environ.get('TRAINGUARD_PROGRESS'), flush=True)\n"
)
PROGRESS = "unix:///tmp/trainguard-test-progress.sock"


def _parked(job_id: str) -> list[int]:
    return [p for p in job_processes(job_id) if read_environ(p).get("TRAINGUARD_STANDBY") == "1"]


def _until(cluster: LocalCluster, ref: str, attempt: int, timeout: float = 120.0) -> Observation:
    deadline = time.monotonic() + timeout
    while True:
        obs = cluster.observe()
        job = obs.jobs[ref]
        if job.attempt == attempt and job.phase.terminal:
            return obs
        assert time.monotonic() < deadline, f"attempt {attempt} did not end: {job}"
        time.sleep(0.1)


def test_a_requeued_attempt_starts_warm_and_every_attempt_gets_the_progress_url(
    tmp_path: Path,
) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    cluster = LocalCluster(
        tmp_path / "local",
        simulated_devices("localhost", 0, 1),
        grace=1.0,
        launch=LocalLaunch(warm_standby=True, progress_url=PROGRESS),
    )
    ref = ""
    try:
        spec = JobSpec(
            name="warm",
            command=(sys.executable, "-m", "torch.distributed.run", "--standalone",
                     "--nproc-per-node", "1", str(script)),
        )  # fmt: skip
        ref = str(cluster.submit(spec, key="submit-1", token=1).detail["ref"])
        first = _until(cluster, ref, 0).jobs[ref]
        assert first.phase is JobPhase.COMPLETED
        assert "no standby was parked" in (cluster.start_note(ref) or "")
        deadline = time.monotonic() + 60
        while not _parked(ref) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _parked(ref), "no standby was parked after the first attempt"

        cluster.requeue(ref, key="requeue-1", token=1)
        second = _until(cluster, ref, 1).jobs[ref]
        assert second.phase is JobPhase.COMPLETED
        assert (cluster.start_note(ref) or "").startswith("warm start: ")
        for job in (first, second):
            assert job.output_path is not None
        logs = [Path(str(j.output_path)).read_text() for j in (first, second)]
        assert f"attempt 0 progress {PROGRESS}" in logs[0]
        assert f"attempt 1 progress {PROGRESS}" in logs[1]
        # The header naming the command and the devices is trainguard's note, never read
        # as the job's (the devices line was taken for output: 0397).
        assert all(is_annotation(line) for log in logs for line in log.splitlines()[:2])
        assert logs[0].splitlines()[1].startswith("# CUDA_VISIBLE_DEVICES=")
    finally:
        cluster.shutdown()
    deadline = time.monotonic() + 15
    while _parked(ref) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _parked(ref) == []  # the standby parked for attempt 2 was dismissed


SLEEPER = "import time\nprint('ready', flush=True)\ntime.sleep(600)\n"


def test_requeueing_a_running_attempt_joins_its_rank_watcher(tmp_path: Path) -> None:
    """The killed ranks' exits reach the cluster while requeue holds its lock: the
    watcher that delivers them must not wait for that lock, or requeue's join of it
    times out and each kill of a live attempt stalls (decision 0401)."""
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    delivered: list[object] = []
    cluster = LocalCluster(
        tmp_path / "local", simulated_devices("localhost", 0, 2), grace=1.0,
        sink=delivered.append, launch=LocalLaunch(kill_grace=0.2),
    )  # fmt: skip
    try:
        spec = JobSpec(
            name="sleeper",
            command=(sys.executable, "-m", "torch.distributed.run", "--standalone",
                     "--nproc-per-node", "2", str(script)),
            devices_per_node=2,
        )  # fmt: skip
        ref = str(cluster.submit(spec, key="submit-1", token=1).detail["ref"])
        launch = cluster._jobs[ref].launch
        assert launch is not None
        deadline = time.monotonic() + 60
        while len(launch.ranks.rank_pids()) < 2:
            assert time.monotonic() < deadline, "the ranks were never found"
            time.sleep(0.05)
        cluster.requeue(ref, key="requeue-1", token=1)
        assert not launch.ranks.thread.is_alive(), "the rank watcher was left blocked"
        exits = [e for e in delivered if isinstance(e, AttemptProcessExit) and e.attempt == 0]
        assert {e.exit.pid for e in exits if e.exit.source == "rank"} == set(
            launch.ranks.rank_pids().values()
        )
        assert cluster.observe().jobs[ref].attempt == 1
    finally:
        cluster.shutdown()
