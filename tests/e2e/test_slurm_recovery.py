"""End-to-end recovery on a real Slurm: real sbatch, real 2-node torchrun (gloo), real faults.

The cluster is ``scripts/slurm-local.sh`` (four logical nodes n1..n4 on this host, one
slurmd each, four stand-in GPUs per node); the job is ``tests/slurm/train_job.sh``:
``srun --kill-on-bad-exit=1 torchrun --nnodes=2 ...`` running ``tests/jobs/tiny_train.py``,
one rank per node, checkpointing every 5 steps. trainguard is the reconcile loop of
``trainguard slurm watch`` driven pass by pass (``tests/slurm/watcher.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm.harness import LocalSlurm, slurm, slurm_cluster, wait_until, xid_line
from slurm.watcher import Watcher
from trainguard.model.records import AttemptState, IncidentState, JobState

pytestmark = pytest.mark.slow

__all__ = ["slurm", "slurm_cluster"]  # fixtures, re-exported for pytest

RESUMED_RE = re.compile(r"trainguard: resumed from (\S+) \(step (\d+), source=([^;)]+)[;)]")


@pytest.fixture
def watcher(slurm: LocalSlurm, tmp_path: Path) -> Iterator[Watcher]:
    w = Watcher(slurm, tmp_path)
    yield w
    w.close()


def _running_at_step(w: Watcher, job_id: str, step: int, timeout: float = 60) -> None:
    w.run_until(
        lambda: max(w.steps(job_id), default=0) >= step, timeout, f"job {job_id} at step {step}"
    )


def _drained(slurm: LocalSlurm, node: str) -> bool:
    return "DRAIN" in slurm.node(node)["state_flags"]


def _resumed(w: Watcher, job_id: str) -> tuple[str, int, str]:
    m = RESUMED_RE.search(w.output(job_id).read_text())
    assert m, "the requeued attempt did not report a resume"
    return m.group(1), int(m.group(2)), m.group(3)


def _last_step_of_attempt_0(w: Watcher, job_id: str) -> int:
    """The last step attempt 0 printed (the job appends its attempts' output)."""
    text = w.output(job_id).read_text()
    before = text[: text.index("attempt 1 of job")]
    return max(int(m) for m in re.findall(r"^step=(\d+) ", before, re.MULTILINE))


def _assert_verified_restart(w: Watcher, job_id: str, step: int) -> None:
    """The restarted attempt restored ``step`` and went on from it (verification)."""
    mid = w.managed_job_id(job_id)
    (inc,) = w.store.incidents.list_incidents(job_id=mid)
    att = w.store.jobs.get_attempt(mid, inc.recovery_attempt or 0)
    assert att.state is AttemptState.VERIFIED
    assert att.first_step is not None and att.first_step >= step
    assert att.last_step is not None and att.last_step > att.first_step
    # The output of the new attempt starts at the restored step: nothing before it was
    # trained again from scratch. (With --open-mode=append the old attempt's lines are
    # still there, before the resume line.)
    text = w.output(job_id).read_text()
    after = text[text.index("trainguard: resumed from") :]
    steps = [int(m.group(1)) for m in re.finditer(r"^step=(\d+) ", after, re.MULTILINE)]
    # Each node's lines reach the shared file in its own order: another rank's first step
    # may come before the resume line counted from, so the floor is checked, not equality.
    assert steps and min(steps) >= step + 1, (step, steps[:10])


def test_xid_on_n2_drains_n2_requeues_without_it_and_resumes(
    slurm: LocalSlurm, watcher: Watcher, tmp_path: Path
) -> None:
    w = watcher
    ck = tmp_path / "ck"
    jid = w.submit(ck)
    _running_at_step(w, jid, 12)
    oj = w.job(jid)
    assert oj.nodes == ("n1", "n2") and oj.attempt == 0 and oj.opt_in is not None
    bad = next(d for d in oj.devices if d.host == "n2")
    slurm.append_kernel_line("n2", xid_line(bad.pci_bus_id, 79))
    w.run_until(lambda: w.incident_state(jid) == "recovered", 90, "the recovery")

    mid = w.managed_job_id(jid)
    (inc,) = w.store.incidents.list_incidents(job_id=mid)
    assert (inc.kind.value, inc.domain.value) == ("xid", "hardware")
    assert inc.culprit.device_uuid == bad.uuid  # n2's card, not the same slot on n1
    # n2 is drained, with a reason naming trainguard, the incident and the evidence.
    n2 = slurm.node("n2")
    assert "DRAIN" in n2["state_flags"]
    assert f"trainguard incident {inc.id}" in n2["reason"] and "Xid" in n2["reason"]
    assert bad.uuid in n2["reason"] and "79" in n2["reason"]
    assert not any(_drained(slurm, n) for n in ("n1", "n3", "n4"))
    # Requeued in place (same job id, restart 1) excluding n2; running elsewhere.
    job = slurm.job(jid)
    assert job["Restarts"] == "1" and "n2" in job["ExcNodeList"]
    assert job["JobState"] == "RUNNING" and "n2" not in w.job(jid).nodes
    # Resumed from the checkpoint trainguard selected (the resume request), verified.
    path, step, source = _resumed(w, jid)
    assert source == ".trainguard-resume.json"
    assert inc.checkpoint_step == step and inc.checkpoint_path == path and step % 5 == 0
    _assert_verified_restart(w, jid, step)
    # The store: device quarantined with a repair record; every action verified.
    assert w.store.devices.get_device_state(bad.uuid).value == "quarantined"
    results = [a for a in w.audit() if a.kind.value == "result" and a.incident_id == inc.id]
    assert results and all(a.data.get("outcome") == "converged" for a in results)
    assert w.store.jobs.get_job(mid).state is JobState.RUNNING


def test_a_killed_task_is_requeued_without_draining(
    slurm: LocalSlurm, watcher: Watcher, tmp_path: Path
) -> None:
    w = watcher
    # This job appends to its output on requeue (--open-mode=append): progress must be
    # read from where the new attempt starts, not from the old attempt's lines.
    jid = w.submit(tmp_path / "ck", sbatch=("--open-mode=append",))
    _running_at_step(w, jid, 8)
    assert slurm.kill_tasks("n2"), "no rank found on n2"
    w.run_until(lambda: w.incident_state(jid) == "recovered", 90, "the recovery")

    (inc,) = w.store.incidents.list_incidents(job_id=w.managed_job_id(jid))
    assert inc.domain.value not in ("hardware", "node")
    assert [a["type"] for a in inc.actions] == ["restart"]
    assert not any(_drained(slurm, n) for n in ("n1", "n2", "n3", "n4"))
    job = slurm.job(jid)
    assert job["Restarts"] == "1" and job["JobState"] == "RUNNING"
    text = w.output(jid).read_text()
    assert text.index("attempt 0 of job") < text.index("attempt 1 of job")  # appended
    _, step, _ = _resumed(w, jid)
    _assert_verified_restart(w, jid, step)
    assert inc.failed_step == _last_step_of_attempt_0(w, jid)


def test_a_node_slurm_declares_down_requeues_the_job_and_the_failed_step_is_its_last(
    slurm: LocalSlurm, watcher: Watcher, tmp_path: Path
) -> None:
    """Issue 13: Slurm finds the node dead first and requeues the job by itself; the
    incident's failed step is the last step the job printed, not what the previous
    pass had read (the job runs on for a while after that pass)."""
    w = watcher
    jid = w.submit(tmp_path / "ck", sbatch=("--open-mode=append",))
    _running_at_step(w, jid, 8)
    before = max(w.steps(jid))
    wait_until(lambda: max(w.steps(jid)) >= before + 3, 20, "steps past the last pass")
    slurm.run("scontrol", "update", "NodeName=n2", "State=DOWN", "Reason=dead")
    w.run_until(lambda: w.incident_state(jid) == "recovered", 90, "the recovery")

    (inc,) = w.store.incidents.list_incidents(job_id=w.managed_job_id(jid))
    assert inc.domain.value == "node" and inc.culprit.host == "n2"
    assert int(slurm.job(jid)["Restarts"]) >= 1 and "n2" not in w.job(jid).nodes
    last = _last_step_of_attempt_0(w, jid)
    assert last >= before + 3
    assert inc.failed_step == last
    assert inc.lost_steps == last - (inc.checkpoint_step or 0)
    _, step, _ = _resumed(w, jid)
    _assert_verified_restart(w, jid, step)


def test_node_failure_is_observed_and_the_job_recovers_on_other_nodes(
    slurm: LocalSlurm, watcher: Watcher, tmp_path: Path
) -> None:
    w = watcher
    jid = w.submit(tmp_path / "ck")
    _running_at_step(w, jid, 8)
    assert w.job(jid).nodes == ("n1", "n2")
    slurm.kill_slurmd("n2")
    w.run_until(lambda: w.incident_state(jid) == "recovered", 120, "the recovery")

    mid = w.managed_job_id(jid)
    (inc,) = w.store.incidents.list_incidents(job_id=mid)
    assert inc.domain.value == "node" and inc.culprit.host == "n2"
    # The evidence: n2's slurmd refused connections (probed each pass), or Slurm's own
    # event (the node stopped responding, went DOWN, the job NODE_FAILed).
    assert any(
        "n2" in e
        and any(w in e for w in ("refuses connections", "not responding", "DOWN", "NODE_FAIL"))
        for e in inc.evidence
    ), inc.evidence
    n2 = slurm.node("n2")
    assert "DRAIN" in n2["state_flags"] and "trainguard" in n2["reason"]
    oj = w.job(jid)
    assert oj.attempt >= 1 and "n2" not in oj.nodes and len(oj.nodes) == 2
    _, step, _ = _resumed(w, jid)
    _assert_verified_restart(w, jid, step)


def test_a_hang_is_requeued_after_the_hang_timeout(slurm: LocalSlurm, tmp_path: Path) -> None:
    w = Watcher(slurm, tmp_path, policy={"hang_timeout_seconds": 15})
    try:
        jid = w.submit(
            tmp_path / "ck",
            extra=("--hang-at-step", "13", "--fault-attempt", "0", "--pg-timeout", "600"),
        )
        _running_at_step(w, jid, 12)
        w.run_until(lambda: w.incident_state(jid) == "recovered", 120, "the recovery")
        (inc,) = w.store.incidents.list_incidents(job_id=w.managed_job_id(jid))
        assert inc.kind.value == "hang"
        assert inc.detected_at - (inc.fault_at or 0) >= 15  # not before the timeout
        assert [a["type"] for a in inc.actions] == ["restart"]
        assert not any(_drained(slurm, n) for n in ("n1", "n2", "n3", "n4"))
        _, step, _ = _resumed(w, jid)
        assert step == 10
        _assert_verified_restart(w, jid, step)
    finally:
        w.close()


def test_a_repeated_application_error_is_stopped_as_futile_without_drain(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    w = Watcher(slurm, tmp_path, policy={"futile_after": 2, "max_restarts": 5})
    try:
        jid = w.submit(tmp_path / "ck", extra=("--fail-at-step", "8"))
        w.run_until(lambda: w.incident_state(jid) == "stopped", 150, "the futile stop")
        mid = w.managed_job_id(jid)
        incidents = w.store.incidents.list_incidents(job_id=mid)
        # The first failure is restarted (the restart may verify before it fails again:
        # then the second failure is a new incident); the same error again stops it.
        actions = [a["type"] for i in incidents for a in i.actions]
        assert actions == ["restart", "stop"]
        inc = incidents[-1]
        assert inc.state is IncidentState.STOPPED and "futile" in (inc.reason or "")
        assert all(i.domain.value == "application" for i in incidents)
        assert incidents[0].signature == inc.signature and "injected failure" in (
            inc.signature or ""
        )
        assert w.store.jobs.get_job(mid).state is JobState.STOPPED
        # Restarted once, failed the same way, never requeued again (COMPLETING is the
        # moment before FAILED: Slurm is still cleaning up the job's steps).
        job = wait_until(
            lambda: (j := slurm.job(jid))["JobState"] != "COMPLETING" and j,
            30,
            "Slurm to finish the job",
        )
        assert job["Restarts"] == "1" and job["JobState"] in ("FAILED", "CANCELLED")
        w.run_once()
        assert slurm.job(jid)["Restarts"] == "1"
        assert not any(_drained(slurm, n) for n in ("n1", "n2", "n3", "n4"))
    finally:
        w.close()


def test_observe_mode_touches_nothing_and_records_the_plan(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    w = Watcher(slurm, tmp_path, mode="observe")
    try:
        jid = w.submit(tmp_path / "ck")
        _running_at_step(w, jid, 8)
        bad = next(d for d in w.job(jid).devices if d.host == "n2")
        slurm.append_kernel_line("n2", xid_line(bad.pci_bus_id, 79))
        w.run_until(lambda: w.incident_state(jid) == "observed", 30, "the observed incident")
        for _ in range(4):
            w.run_once()
        (inc,) = w.store.incidents.list_incidents(job_id=w.managed_job_id(jid))
        kinds = [a["type"] for a in (inc.plan or {}).get("actions", [])]
        assert kinds == ["quarantine", "restart"] and inc.plan["mode"] == "observe"
        assert inc.actions == ()
        # Slurm is untouched: no drain, same attempt, nothing excluded, still training.
        assert not any(_drained(slurm, n) for n in ("n1", "n2", "n3", "n4"))
        job = slurm.job(jid)
        assert job["Restarts"] == "0" and job["JobState"] == "RUNNING"
        assert job["ExcNodeList"] == "(null)"
        before = max(w.steps(jid))
        wait_until(lambda: max(w.steps(jid)) > before, 20, "more progress")
        assert not [a for a in w.audit() if a.kind.value == "intent"]
    finally:
        w.close()


def test_not_enough_healthy_nodes_holds_the_job_pending_with_a_reason(
    slurm: LocalSlurm, watcher: Watcher, tmp_path: Path
) -> None:
    w = watcher
    for node in ("n3", "n4"):
        slurm.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=maintenance")
    jid = w.submit(tmp_path / "ck")
    _running_at_step(w, jid, 8)
    bad = next(d for d in w.job(jid).devices if d.host == "n2")
    slurm.append_kernel_line("n2", xid_line(bad.pci_bus_id, 79))
    mid = w.managed_job_id(jid)
    w.run_until(
        lambda: w.store.jobs.get_job(mid).state is JobState.WAITING,
        60,
        "the job to wait for capacity",
    )
    job = slurm.job(jid)
    assert job["JobState"] == "PENDING" and job["Restarts"] == "1"
    assert "waiting for capacity" in job["AdminComment"] and "n2" in job["ExcNodeList"]
    (inc,) = w.store.incidents.list_incidents(job_id=mid)
    assert inc.state is IncidentState.VERIFYING
    assert "waiting for capacity" in (w.store.jobs.get_job(mid).reason or "")
    # An operator's drain keeps its reason; ours names trainguard.
    assert slurm.node("n3")["reason"] == "maintenance" and _drained(slurm, "n2")
    # Capacity comes back: the job starts without n2 and is verified.
    slurm.run("scontrol", "update", "NodeName=n3", "State=RESUME")
    w.run_until(lambda: w.incident_state(jid) == "recovered", 90, "the recovery")
    assert w.job(jid).nodes == ("n1", "n3")
    assert w.store.jobs.get_job(mid).state is JobState.RUNNING
