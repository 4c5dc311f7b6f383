"""The local scheduler's warm standby: when it does not apply, a cold start and why.

Real processes: a real parked standby (torch imported) and a real torchrun. The warm
path itself, with faults, is tests/e2e/test_run_warm_restart.py.
"""

from __future__ import annotations

import io
import os
import sys
import time
from pathlib import Path

from trainguard.schedulers.local import LaunchSpec, LocalAttempt, LocalScheduler, job_processes
from trainguard.signals.process import read_environ

JOB = "import os; print('attempt', os.environ['TRAINGUARD_ATTEMPT'], flush=True)\n"


def _standbys(job_id: str) -> list[int]:
    """The job's parked processes: standbys and their watchdogs."""
    return [p for p in job_processes(job_id) if read_environ(p).get("TRAINGUARD_STANDBY") == "1"]


def _standby(job_id: str) -> list[int]:
    """The standbys themselves (not their watchdogs)."""
    out = []
    for pid in _standbys(job_id):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        comm = Path(f"/proc/{pid}/comm").read_bytes().strip()
        if len(argv) > 1 and argv[1].endswith(b"standby.py") and comm != b"tg-zygote":
            out.append(pid)  # not its watchdog, nor its zygote (same command line)
    return out


def _run(sched: LocalScheduler, spec: LaunchSpec) -> LocalAttempt:
    att = sched.launch(spec)
    att.proc.wait(180)
    att.wait_closed(5.0)
    return att


def test_a_command_that_is_not_torchrun_starts_cold_and_parks_nothing(tmp_path: Path) -> None:
    sched = LocalScheduler(lambda ev: None, stdout=io.BytesIO(), stderr=io.BytesIO(),
                           warm_standby=True)  # fmt: skip
    log = tmp_path / "attempt-0.log"
    att = _run(sched, LaunchSpec((sys.executable, "-c", JOB), 0, (), None, str(log), job_id="c1"))
    assert att.proc.returncode == 0
    assert att.start_note is not None and att.start_note.startswith("cold start: ")
    assert "not torchrun" in att.start_note
    assert f"# trainguard: {att.start_note}" in log.read_text()
    time.sleep(0.5)
    assert _standbys("c1") == []
    sched.close()


def test_a_changed_interpreter_environment_starts_cold_and_close_dismisses(
    tmp_path: Path,
) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    base = dict(os.environ)
    sched = LocalScheduler(lambda ev: None, base_env=base, stdout=io.BytesIO(),
                           stderr=io.BytesIO(), warm_standby=True)  # fmt: skip
    cmd = (sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "1", str(job))  # fmt: skip
    logs = [tmp_path / f"attempt-{i}.log" for i in range(2)]
    first = _run(sched, LaunchSpec(cmd, 0, (), None, str(logs[0]), job_id="c2"))
    assert first.proc.returncode == 0, logs[0].read_text()
    assert "no standby was parked" in (first.start_note or "")
    deadline = time.monotonic() + 30
    while not _standby("c2") and time.monotonic() < deadline:
        time.sleep(0.1)
    [parked] = _standby("c2")
    # The next attempt's interpreter would see another sys.path: the standby is not it.
    sched.base_env["PYTHONPATH"] = base.get("PYTHONPATH", "") + os.pathsep + str(tmp_path)
    second = _run(sched, LaunchSpec(cmd, 1, (), None, str(logs[1]), job_id="c2"))
    assert second.proc.returncode == 0, logs[1].read_text()
    note = second.start_note or ""
    assert note == "cold start: environment differs from the standby's (PYTHONPATH)", note
    assert second.launcher_pid != parked and "attempt 1" in logs[1].read_text()
    sched.close()
    deadline = time.monotonic() + 15
    while _standbys("c2") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _standbys("c2") == []  # the dismissed one and the one parked for attempt 2
