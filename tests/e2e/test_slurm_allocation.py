"""Recovery inside the allocation on a real Slurm (decisions 0510-0512): ``srun
--ntasks-per-node=1 trainguard run --spares 1 ... -- torchrun --nnodes 2 ...`` in a
3-node job submitted with ``--no-kill`` (``tests/slurm/alloc_job.sh``); real faults.

Each test asserts the state of the world: the job trained to its last step, the restart
ran on the survivor plus the spare, the bad node was never used again by the job, and
the store (the leader's, in the job's working directory) says so.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from slurm.harness import ROOT, LocalSlurm, slurm, slurm_cluster, wait_until, xid_line
from trainguard.store import Store
from trainguard.store.fleet import FleetStore

pytestmark = pytest.mark.slow

__all__ = ["slurm", "slurm_cluster"]  # fixtures, re-exported for pytest

JOB = Path(__file__).resolve().parents[1] / "slurm" / "alloc_job.sh"
NODES_RE = re.compile(r"^# trainguard: nodes (\S+) \((\w+): ", re.MULTILINE)


def _submit(
    slurm: LocalSlurm, work: Path, *, nodes: int = 3, spares: int = 1,
    tg: tuple[str, ...] = (), train: tuple[str, ...] = (), steps: int = 60,
) -> str:  # fmt: skip
    os.environ["PYTHONPATH"] = str(ROOT / "src")  # every node's trainguard is this tree's
    slurm.env["PYTHONPATH"] = str(ROOT / "src")
    work.mkdir(parents=True, exist_ok=True)
    return slurm.sbatch(
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        "--no-kill",
        "--job-name=alloc",
        f"--chdir={work}",
        f"--output={work}/out.txt",
        str(JOB),
        sys.executable,
        str(nodes - spares),
        f"--spares={spares}",
        "--checkpoint-dir=ck",
        "--log-dir=logs",
        f"--inventory={slurm.inventory}",
        f"--kernel-log={slurm.dir}/nodes/{{node}}/kern.log",
        *tg,
        "--",
        "--steps", str(steps), "--ckpt-dir", "ck", "--save-every", "5",
        "--step-sleep", "0.15", "--pg-timeout", "20",
        *train,
    )  # fmt: skip


def _steps(work: Path) -> list[int]:
    text = (work / "out.txt").read_text(errors="replace") if (work / "out.txt").exists() else ""
    return [int(m) for m in re.findall(r"^step=(\d+) ", text, re.MULTILINE)]


def _ended(slurm: LocalSlurm, jid: str) -> str:
    state = slurm.job(jid).get("JobState", "")
    return state if state not in ("", "PENDING", "RUNNING", "COMPLETING", "CONFIGURING") else ""


def _placements(work: Path) -> list[tuple[int, tuple[str, ...], str]]:
    out = []
    for log in sorted((work / "logs").glob("attempt-*.log")):
        n = int(log.stem.split("-")[1])
        m = NODES_RE.search(log.read_text(errors="replace"))
        assert m, f"{log} names no nodes"
        out.append((n, tuple(m.group(1).split(",")), m.group(2)))
    return sorted(out)


def _store(work: Path) -> Store:
    return Store.open(str(work / ".trainguard" / "state.db"))


def _assert_finished_on_the_spare(work: Path, bad: str, steps: int) -> None:
    text = (work / "out.txt").read_text(errors="replace")
    assert f"done steps={steps}" in text, text[-3000:]
    placements = _placements(work)
    assert placements[0][1] == ("n1", "n2") and len(placements) == 2, placements
    _n, nodes, kind = placements[1]
    assert kind == "spare" and "n3" in nodes and bad not in nodes  # the spare, not the bad one
    store = _store(work)
    try:
        (job,) = store.jobs.list_jobs()
        assert job.state.value == "completed"
        (inc,) = store.incidents.list_incidents(job_id=job.id)
        assert inc.state.value == "recovered"
        results = [a.message for a in store.audit.list_audit() if a.kind.value == "result"]
        assert any(f"spare n3 replaces {bad}" in m for m in results), results
    finally:
        store.close()


def test_a_rank_crash_restarts_on_the_survivor_and_the_spare(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    work = tmp_path / "job"
    jid = _submit(slurm, work, train=("--fail-at-step", "12", "--fault-rank", "1",
                                      "--fault-attempt", "0"))  # fmt: skip
    wait_until(lambda: _ended(slurm, jid), 180, f"job {jid} to end")
    assert slurm.job(jid)["JobState"] == "COMPLETED", (work / "out.txt").read_text()[-3000:]
    assert slurm.job(jid).get("Restarts") == "0"  # never left the allocation
    text = (work / "out.txt").read_text(errors="replace")
    # The node whose rank failed first is the one left out (rank 1's node).
    bad = re.search(r"spare n3 replaces (n[12])", text)
    assert bad, text[-3000:]
    _assert_finished_on_the_spare(work, bad.group(1), 60)
    assert (
        "warm start"
        in (work / ".trainguard" / "alloc")
        .joinpath(f"{jid}-r0", "nodes", "n3", "attempt-1.log")
        .read_text()
    )  # the spare joined warm


def test_a_dead_node_is_left_out_and_the_spare_takes_its_place(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    work = tmp_path / "job"
    jid = _submit(slurm, work, steps=80)
    wait_until(lambda: max(_steps(work), default=0) >= 12, 120, "step 12")
    proc = slurm.script("node-kill", "n2")
    assert proc.returncode == 0, proc.stderr
    # The job ends when the step does (n2's part ends with its node: Slurm says when).
    wait_until(lambda: _ended(slurm, jid), 240, f"job {jid} to end")
    _assert_finished_on_the_spare(work, "n2", 80)
    store = _store(work)
    try:
        kinds = {f["kind"] for f in FleetStore(store).findings.findings_after(0)}
        assert "node_down" in kinds  # n2's agent went away: a node finding of n2
    finally:
        store.close()
    # The drain was asked for (the test cluster's user may: root), with trainguard's reason.
    wait_until(lambda: "DRAIN" in slurm.node("n2")["state_flags"], 30, "n2 drained")
    assert "trainguard" in slurm.node("n2")["reason"]


def test_an_xid_leaves_the_node_out_drains_it_and_uses_the_spare(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    work = tmp_path / "job"
    jid = _submit(slurm, work, steps=80)
    wait_until(lambda: max(_steps(work), default=0) >= 12, 120, "step 12")
    import json

    pci = json.loads(Path(slurm.inventory).read_text())["n2"][0]["pci_bus_id"]
    slurm.append_kernel_line("n2", xid_line(pci, 79))
    wait_until(lambda: _ended(slurm, jid), 180, f"job {jid} to end")
    _assert_finished_on_the_spare(work, "n2", 80)
    assert "DRAIN" in slurm.node("n2")["state_flags"]


def test_no_spare_left_continues_on_fewer_nodes_when_min_nodes_allows(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    work = tmp_path / "job"
    jid = _submit(
        slurm, work, nodes=2, spares=0, tg=("--min-nodes=1",),
        train=("--fail-at-step", "12", "--fault-rank", "1", "--fault-attempt", "0",
               "--allow-world-size-change"),
    )  # fmt: skip
    wait_until(lambda: _ended(slurm, jid), 180, f"job {jid} to end")
    text = (work / "out.txt").read_text(errors="replace")
    assert slurm.job(jid)["JobState"] == "COMPLETED", text[-3000:]
    assert "done steps=60" in text
    (first, second) = _placements(work)
    assert first[1] == ("n1", "n2") and second[2] == "smaller" and len(second[1]) == 1


def test_no_spare_and_no_smaller_falls_back_to_the_requeue_path_and_says_why(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    work = tmp_path / "job"
    jid = _submit(
        slurm, work, nodes=2, spares=0,
        train=("--fail-at-step", "12", "--fault-rank", "1", "--fault-attempt", "0"),
    )  # fmt: skip
    wait_until(lambda: _ended(slurm, jid), 180, f"job {jid} to end")
    text = (work / "out.txt").read_text(errors="replace")
    assert slurm.job(jid)["JobState"] == "FAILED", text[-3000:]  # Slurm's path from here
    assert "back to Slurm's requeue path" in text and "needs at least 2" in text
    assert len(_placements(work)) == 1  # never restarted inside the allocation
    store = _store(work)
    try:
        (job,) = store.jobs.list_jobs()
        assert job.state.value == "stopped" and "requeue path" in (job.reason or "")
    finally:
        store.close()
