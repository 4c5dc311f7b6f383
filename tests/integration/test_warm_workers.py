"""Warm workers (decision 0310): the restarted torchrun's workers forked by the zygote.

Real processes: a real parked standby and its zygote, a real torchrun agent (the
standby), real forked workers. A forked worker's ``/proc/PID/environ`` is the zygote's;
trainguard must still see its rank, its death, its job (the leftover sweep) and kill it.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from trainguard.schedulers.local import LaunchSpec, LocalScheduler, job_processes
from trainguard.signals.process import AttemptProcessExit, read_environ

# Attempt 0 ends at once (it only has to park the standby); attempt 1 trains "forever".
# Its rank 0 keeps a memory snapshot (decision 0261) and outlives torchrun's SIGTERM, so
# trainguard's kill still finds it to flush once rank 1 is dead.
JOB = """
import os, signal, time
if os.environ["TRAINGUARD_ATTEMPT"] != "0":
    if os.environ["LOCAL_RANK"] == "0":
        import torch
        from trainguard.train import CheckpointManager
        ckpt = CheckpointManager(os.environ["TG_TEST_CKPT"], memory_snapshots=True)
        ckpt.snapshot(1, {"w": torch.zeros(1024)})
        ckpt.snapshots.wait()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("rank", os.environ["LOCAL_RANK"], "up", flush=True)
    time.sleep(120)
"""


def _raw_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(x.split("=", 1) for x in raw.decode(errors="replace").split("\0") if "=" in x)


def _wait(what: Any, timeout: float, why: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(why)


def test_a_killed_warm_worker_is_seen_with_its_rank_and_the_attempt_dies_whole(
    tmp_path: Path,
) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    events: list[Any] = []
    sched = LocalScheduler(events.append, stdout=sys.stdout.buffer, stderr=sys.stderr.buffer,
                           warm_standby=True, warm_workers=True)  # fmt: skip
    cmd = (sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "2", str(job))  # fmt: skip
    logs = [tmp_path / f"attempt-{i}.log" for i in range(2)]
    try:
        first = sched.launch(LaunchSpec(cmd, 0, (), None, str(logs[0]), job_id="w1"))
        assert first.proc.wait(180) == 0, logs[0].read_text()
        first.wait_closed(5.0)
        zygotes = _wait(
            lambda: [p for p in job_processes("w1")
                     if Path(f"/proc/{p}/comm").read_bytes().strip() == b"tg-zygote"],
            90, "no zygote was forked by the standby",
        )  # fmt: skip
        shm = tmp_path / "shm"
        extra = {"TRAINGUARD_SNAPSHOT_DIR": str(shm), "TG_TEST_CKPT": str(tmp_path / "ckpt")}
        second = sched.launch(
            LaunchSpec(cmd, 1, (), None, str(logs[1]), job_id="w1", extra_env=extra)
        )
        note = second.start_note or ""
        assert note.startswith("warm start: ") and f"warm workers: zygote pid {zygotes[0]}" in note
        ranks = _wait(lambda: len(second.ranks.rank_pids()) == 2 and second.ranks.rank_pids(),
                      60, f"ranks not found:\n{logs[1].read_text()}")  # fmt: skip
        for local, pid in ranks.items():
            # Forked by the zygote, the worker rewrote the environment the kernel shows
            # (zygote.impersonate) to its own, as a cold worker's; trainguard's reading
            # (the copy the zygote wrote for it) agrees.
            assert _raw_environ(pid)["LOCAL_RANK"] == str(local)
            assert Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split()[1] == str(
                zygotes[0]
            )  # ppid: the zygote
            env = read_environ(pid)
            assert env["LOCAL_RANK"] == str(local) and env["TRAINGUARD_ATTEMPT"] == "1"
            assert os.getsid(pid) == pid  # a session of its own, as torchrun's Popen gives
        assert set(ranks.values()) <= set(job_processes("w1"))  # the leftover sweep sees them
        _wait(lambda: logs[1].read_text().count(" up") == 2, 60, "workers did not start")

        os.kill(ranks[1], signal.SIGKILL)
        death = _wait(
            lambda: [e.exit for e in events if isinstance(e, AttemptProcessExit)
                     and e.attempt == 1 and e.exit.pid == ranks[1]],
            10, "the killed warm worker's death was not seen",
        )[0]  # fmt: skip
        assert (death.source, death.rank, death.local_rank, death.signal) == ("rank", 1, 1, 9)

        # The fast kill (decision 0270): agent frozen, the flush signal to the ranks that
        # catch it (0261: found through the worker's own environment), then SIGTERM, SIGKILL.
        asked = time.time()
        second.kill(0.2, flush_wait=30.0)
        second.wait_closed(5.0)
        [flushed] = shm.glob("trainguard-*/*/rank_00000/flushed.json")
        assert flushed.stat().st_mtime >= asked - 0.01
        assert "memory snapshots flushed by 1 of 1 rank(s)" in logs[1].read_text()
        assert second.proc.returncode is not None
        tree = [*ranks.values(), second.launcher_pid, zygotes[0]]
        _wait(lambda: all(_zombie_or_gone(p) for p in tree), 10,
              f"still running: {[(p, _state(p)) for p in tree]}")  # fmt: skip
    finally:
        sched.close()
    _wait(lambda: job_processes("w1") == [], 15, f"leftovers: {job_processes('w1')}")
    assert sched._environ_dir is not None and not os.path.exists(sched._environ_dir)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
    except OSError:
        return "gone"


def _zombie_or_gone(pid: int) -> bool:
    return _state(pid) in ("Z", "X", "gone")


def _zygote_of(job_id: str, not_: tuple[int, ...] = ()) -> int:
    [pid] = _wait(
        lambda: [p for p in job_processes(job_id) if p not in not_
                 and Path(f"/proc/{p}/comm").read_bytes().strip() == b"tg-zygote"],
        90, "no zygote was forked by the standby",
    )  # fmt: skip
    return int(pid)


def test_workers_the_zygote_cannot_start_start_cold_and_the_log_says_why(
    tmp_path: Path,
) -> None:
    job = tmp_path / "job.py"
    job.write_text("import os; print('attempt', os.environ['TRAINGUARD_ATTEMPT'], flush=True)\n")
    sched = LocalScheduler(lambda ev: None, stdout=sys.stdout.buffer, stderr=sys.stderr.buffer,
                           warm_standby=True, warm_workers=True)  # fmt: skip
    cmd = (sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "1", str(job))  # fmt: skip
    logs = [tmp_path / f"attempt-{i}.log" for i in range(3)]

    def run(attempt: int) -> str:
        att = sched.launch(LaunchSpec(cmd, attempt, (), None, str(logs[attempt]), job_id="w2"))
        assert att.proc.wait(180) == 0, logs[attempt].read_text()
        att.wait_closed(5.0)
        assert f"attempt {attempt}" in logs[attempt].read_text()
        return att.start_note or ""

    try:
        run(0)
        first = _zygote_of("w2")
        # Read by OpenMP when torch was imported: the parked zygote has the old value, so the
        # agent is warm (the interpreter would be the same) but starts its worker with Popen.
        sched.base_env["OMP_PROC_BIND"] = "close"
        note = run(1)
        assert note.startswith("warm start: ") and "warm workers: zygote pid" in note, note
        why = "the worker environment differs from the zygote's (OMP_PROC_BIND)"
        assert f"# trainguard: cold workers: {why}\n" in logs[1].read_text()
        # A dead zygote: the agent is still warm, its workers cold, and the start line says so.
        second = _zygote_of("w2", not_=(first,))
        os.kill(second, signal.SIGKILL)
        _wait(lambda: _zombie_or_gone(second), 10, "the zygote did not die")
        note = run(2)
        assert note.startswith("warm start: ") and "; cold workers: the zygote died" in note, note
    finally:
        sched.close()
