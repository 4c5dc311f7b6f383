"""Warm restarts end to end (decision 0271): real torchrun, real faults, one host.

While attempt 0 trains, ``trainguard run`` parks a standby torchrun agent (torch
imported, idle priority, no GPU). A crash, an XID or a hang must restart the job
*through that standby*: the parked process is attempt 1's agent, its ranks get the
new attempt's environment (devices, attempt number, resume path), and training
completes. When the standby cannot be used (here: it died), the attempt starts cold
and its log says why; the job recovers all the same.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _run_e2e import RunCase, _processes_with, devices_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TRAIN = ["--steps", "20", "--save-every", "3", "--step-sleep", "0.1", "--pg-timeout", "60"]


@pytest.fixture
def case(tmp_path: Path):  # type: ignore[no-untyped-def]
    c = RunCase(tmp_path)
    yield c
    c.kill()


def _standby(case: RunCase, timeout: float = 90.0) -> int:
    """The parked standby of this case's job (its environment says so)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _processes_with(TG_TEST_RECORD_DIR=str(case.records), TRAINGUARD_STANDBY="1")
        for pid, env in found:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
                comm = Path(f"/proc/{pid}/comm").read_bytes().strip()
                # Not its watchdog, nor its zygote (the same command line, decision 0310).
                if len(argv) > 1 and argv[1].endswith(b"standby.py") and comm != b"tg-zygote":
                    assert env["CUDA_VISIBLE_DEVICES"] == ""  # no GPU while parked
                    return pid
        time.sleep(0.1)
    raise AssertionError(f"no standby parked:\n{case.output()[-3000:]}")


def _start(case: RunCase, kind: str, run_args: list[str] | None = None) -> None:
    extra = ["--hang-at-step", "8", "--fault-rank", "1", "--fault-attempt", "0"]
    case.start(
        [*TRAIN, *(extra if kind == "hang" else [])],
        run_args=run_args,
        # 8 s, not 4: on a loaded machine a restarted attempt may pause that long.
        hang_timeout=8.0 if kind == "hang" else 30.0,
    )


def _fault(case: RunCase, kind: str) -> dict[str, Any]:
    rank1 = case.record(0, 1)
    if kind == "hang":
        return rank1
    case.wait_step(8)
    if kind == "xid":
        case.xid79_on(devices_of(rank1)[1]["pci_bus_id"], rank1["pid"])
    else:
        os.kill(rank1["pid"], signal.SIGKILL)
    return rank1


def _attempt_log(case: RunCase, attempt: int) -> str:
    return case.attempt_log(attempt)


@pytest.mark.parametrize("kind", ["crash", "xid", "hang"])
def test_a_fault_restarts_through_the_parked_standby(case: RunCase, kind: str) -> None:
    _start(case, kind)
    parked = _standby(case)
    deadline = time.monotonic() + 10
    while os.sched_getscheduler(parked) != os.SCHED_IDLE and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.sched_getscheduler(parked) == os.SCHED_IDLE  # costs the training nothing
    rank1 = _fault(case, kind)
    assert case.finish(200) == 0, case.output()[-3000:]

    [inc] = case.incidents()
    assert inc["kind"] == kind and inc["outcome"] == "recovered"
    log = _attempt_log(case, 1)
    assert f"# trainguard: warm start: standby pid {parked} " in log, log[:2000]
    # The user is told too: the restart's result says how attempt 1 started.
    assert f"attempt 1 requested; warm start: standby pid {parked} " in case.output()
    # The standby became attempt 1's agent, and its zygote forked the ranks (decision
    # 0310), with attempt 1's contract (devices without the XID'd one, the resume path),
    # not the parked one's.
    found = re.search(r"; warm workers: zygote pid (\d+)", log)
    assert found is not None, log[:2000]
    r0, r1 = case.record(1, 0), case.record(1, 1)
    assert r0["ppid"] == int(found.group(1)) and r1["ppid"] == int(found.group(1))
    assert "# trainguard: cold workers" not in log
    assert r0["env"]["TRAINGUARD_ATTEMPT"] == "1"
    assert r0["env"]["TRAINGUARD_RESUME_FROM"].endswith(f"step_{inc['checkpoint_step']:08d}")
    used = {d["uuid"] for d in devices_of(r0) + devices_of(r1)}
    if kind == "xid":
        assert devices_of(rank1)[1]["uuid"] not in used
        assert r0["env"]["CUDA_VISIBLE_DEVICES"] != case.record(0, 0)["env"]["CUDA_VISIBLE_DEVICES"]
    # The failed tree was killed directly, and quickly (decision 0270).
    first = _attempt_log(case, 0)
    assert "# trainguard stopped attempt 0: SIGKILL to process group" in first or kind == "crash"
    job, attempts = case.job()
    assert job.state.value == "completed" and len(attempts) == 2


def test_a_dead_standby_falls_back_to_a_cold_start_and_says_why(case: RunCase) -> None:
    _start(case, "crash")
    parked = _standby(case)
    os.kill(parked, signal.SIGKILL)
    _fault(case, "crash")
    assert case.finish(200) == 0, case.output()[-3000:]
    [inc] = case.incidents()
    assert inc["outcome"] == "recovered"
    log = _attempt_log(case, 1)
    assert "# trainguard: cold start: the standby died" in log, log[:2000]
    assert "attempt 1 requested; cold start: the standby died" in case.output()
    assert case.record(1, 0)["ppid"] != parked
    job, attempts = case.job()
    assert job.state.value == "completed" and len(attempts) == 2


def test_no_warm_standby_parks_nothing(case: RunCase) -> None:
    _start(case, "crash", run_args=["--no-warm-standby"])
    case.wait_step(4)
    assert not _processes_with(TG_TEST_RECORD_DIR=str(case.records), TRAINGUARD_STANDBY="1")
    _fault(case, "crash")
    assert case.finish(200) == 0, case.output()[-3000:]
    assert "warm start" not in _attempt_log(case, 1)
    assert "warm start" not in case.output() and "cold start" not in case.output()


def _proc(pid: int) -> tuple[list[bytes], dict[str, str], bytes]:
    """What outside tools read of a process: its command line, environment and name."""
    base = Path(f"/proc/{pid}")
    argv = base.joinpath("cmdline").read_bytes().split(b"\0")
    while argv and argv[-1] == b"":
        argv.pop()
    env = dict(
        item.decode().split("=", 1)
        for item in base.joinpath("environ").read_bytes().split(b"\0")
        if b"=" in item
    )
    return argv, env, base.joinpath("comm").read_bytes().strip()


def test_warm_ranks_look_like_cold_ones_to_outside_tools(case: RunCase) -> None:
    """ps, pgrep -f, profilers and scripts that read /proc find a warm rank by its script,
    its environment (LOCAL_RANK, RANK, the attempt) and its name, as they find a cold one."""
    case.start(["--steps", "60", "--save-every", "3", "--step-sleep", "0.1", "--pg-timeout", "60"])
    cold = case.record(0, 1)
    cold_argv, cold_env, cold_comm = _proc(cold["pid"])
    assert cold_env["LOCAL_RANK"] == "1"
    # `trainguard ps` lists the job's ranks: pid, rank, device, cold.
    listed = {r["rank"]: r for r in case.cli_json("ps")}
    assert listed[1]["pid"] == cold["pid"] and listed[1]["start"] == "cold"
    assert listed[1]["local_rank"] == 1 and listed[1]["attempt"] == 0
    assert listed[1]["device"] == devices_of(cold)[1]["uuid"]
    case.wait_step(8)
    os.kill(cold["pid"], signal.SIGKILL)
    warm = case.record(1, 1)
    argv, env, comm = _proc(warm["pid"])
    listed = {r["rank"]: r for r in case.cli_json("ps") if r["attempt"] == 1}
    assert listed[1]["pid"] == warm["pid"] and listed[1]["start"] == "warm"
    assert "; warm workers: zygote pid" in _attempt_log(case, 1)
    assert argv == cold_argv
    assert comm == cold_comm != b"tg-zygote"
    assert env["LOCAL_RANK"] == "1" and env["RANK"] == "1"
    assert env["TRAINGUARD_ATTEMPT"] == "1"
    assert "TRAINGUARD_TITLE_SPACE" not in env
    script = next(a for a in argv if a.endswith(b".py")).decode()
    found = subprocess.run(["pgrep", "-f", script], capture_output=True, text=True).stdout
    assert str(warm["pid"]) in found.split()
    # The agent too shows the launcher's command line, not standby.py's.
    agent = re.search(r"warm start: standby pid (\d+)", _attempt_log(case, 1))
    assert agent is not None
    agent_argv, agent_env, _ = _proc(int(agent.group(1)))
    assert not any(a.endswith(b"standby.py") for a in agent_argv), agent_argv
    assert b"--nproc-per-node" in agent_argv or b"--nproc_per_node" in agent_argv, agent_argv
    assert agent_env["TRAINGUARD_ATTEMPT"] == "1" and "TRAINGUARD_STANDBY" not in agent_env
    assert case.finish(200) == 0, case.output()[-3000:]


# Trains until its rank 1 is killed (attempt 0); restarted, every rank fails at once with
# the same KeyError (an application error), from the script's own frames.
FAILING_JOB = """
import os, time

def fetch(batch):
    return batch["labels"]

def main():
    attempt = int(os.environ["TRAINGUARD_ATTEMPT"])
    for step in range(1, 100000):
        if attempt >= 1:
            fetch({})
        print(f"step={step} loss=1.0", flush=True)
        time.sleep(0.2)

if __name__ == "__main__":
    main()
"""


def _tracebacks(log: str) -> list[list[str]]:
    """Each traceback in ``log``: its ``File ...`` lines and the closing exception line."""
    found, current = [], None
    for line in log.splitlines():
        if line.endswith("Traceback (most recent call last):"):
            current = []
        elif current is not None:
            if line.lstrip().startswith('File "'):
                current.append(line.strip())
            elif line and not line.startswith((" ", "\t")):
                found.append([*current, line])
                current = None
    return found


def test_a_warm_attempts_traceback_has_no_trainguard_frame(case: RunCase) -> None:
    """The user's traceback after a warm restart is the one a cold worker prints: from
    the script's ``<module>`` on, without zygote.py, standby.py or runpy frames (0495);
    torchrun's own report of the failure carries none either."""
    script = case.tmp / "failing.py"
    script.write_text(FAILING_JOB)
    case.start_command(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc-per-node", "2", str(script)],
        env={"TG_TEST_RECORD_DIR": str(case.records)},
    )  # fmt: skip
    _standby(case)
    case.wait_output(r"^step=3 ")
    pid, _ = case.rank_process(0, 1)
    os.kill(pid, signal.SIGKILL)
    assert case.finish(200) != 0, case.output()[-3000:]
    log = _attempt_log(case, 1)
    assert "; warm workers: zygote pid" in log, log[:2000]
    for name in ("zygote.py", "standby.py", "runpy"):
        assert name not in log, log[-4000:]
    worker = [tb for tb in _tracebacks(log) if tb[-1].endswith("KeyError: 'labels'")]
    assert len(worker) == 2, log[-4000:]
    for tb in worker:
        assert tb[:-1] == [
            f'File "{script}", line 16, in <module>',
            f'File "{script}", line 11, in main',
            f'File "{script}", line 5, in fetch',
        ], tb
