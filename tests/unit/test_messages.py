"""Messages a user can act on (issue 14, item 9): say what is known, name the way out."""

from __future__ import annotations

from pathlib import Path

from trainguard.diagnose.attribution import attempt_failure_reason, attribute, hardware_reason
from trainguard.diagnose.detectors import HangConfig, HangDetector, hang_message
from trainguard.model import Culprit, Domain, Finding, HealthState, Severity
from trainguard.model.actors import actor_name
from trainguard.model.records import AuditKind
from trainguard.policy.hang import no_progress_hint
from trainguard.policy.verify import (
    RestartObservation,
    StepClock,
    VerifyRules,
    first_progress_note,
    verify_restart,
)
from trainguard.signals.inventory import simulated
from trainguard.store import Store

T0 = 1_700_000_000.0


def _app_error(rank: int | None, host: str | None = None) -> Finding:
    return Finding(
        kind="python_exception",
        domain=Domain.APPLICATION,
        at=T0,
        source="output",
        message="ValueError: batch has no labels",
        evidence=("ValueError: batch has no labels",),
        culprit=Culprit(rank=rank, host=host),
        signature="python_exception:ValueError",
        severity=Severity.FATAL,
    )


def test_an_error_without_a_rank_never_says_rank_none() -> None:
    a = attribute([_app_error(None)], (), failed_at=T0 + 1)
    assert "None" not in a.summary, a.summary
    assert "a rank the evidence does not name" in a.summary
    on_host = attribute([_app_error(None, host="node7")], (), failed_at=T0 + 1)
    assert "host node7" in on_host.summary and "None" not in on_host.summary
    known = attribute([_app_error(3, host="node7")], (), failed_at=T0 + 1)
    assert "rank 3 on node7" in known.summary


def test_culprit_describe_says_only_what_is_known() -> None:
    assert Culprit().describe() == "a rank the evidence does not name"
    assert Culprit(host="n7").describe() == "host n7 (rank not named)"
    assert Culprit(rank=2, host="n7").describe() == "rank 2 on n7"
    assert Culprit(pci_bus_id="0000:11:00.0").describe() == "device 0000:11:00.0"
    assert Culprit(device_uuid="GPU-1", rank=1).describe() == "device GPU-1 (rank 1)"


def test_a_job_that_never_showed_progress_is_told_how_to_show_it() -> None:
    hint = no_progress_hint(None)
    hang = HangDetector(
        HangConfig(hang_timeout_seconds=1.0, hang_startup_seconds=2.0),
        started_at=T0,
        no_progress_hint=hint,
    )
    finding = hang.check(T0 + 3)
    assert finding is not None
    for name in (
        "--progress-pattern",
        "trainguard.train.report_progress",
        "trainguard.integrations",
    ):
        assert name in finding.message, finding.message
    custom = no_progress_hint(r"it (\d+)")
    assert "--progress-pattern 'it (\\\\d+)'" in custom


def test_a_job_that_made_progress_and_stopped_gets_no_hint() -> None:
    hang = HangDetector(
        HangConfig(hang_timeout_seconds=1.0, hang_startup_seconds=2.0),
        started_at=T0,
        no_progress_hint="X",
    )
    hang.observe(1, T0 + 1)
    hang.observe(2, T0 + 1.5)
    finding = hang.check(T0 + 10)
    assert finding is not None and "X" not in finding.message


# --- one wording for a hang and a restart's first step, in every mode (decision 0376) ---


def test_hang_message_says_how_long_against_what_and_the_last_step() -> None:
    assert (
        hang_message(stalled_for=12.34, timeout=10.0, last_step=7)
        == "no progress for 12.3 s (timeout 10 s); last step 7"
    )
    assert (
        hang_message(stalled_for=700.0, timeout=600.0, last_step=None, hint="say step=N")
        == "no progress within 600 s of the start: say step=N"
    )
    assert (
        hang_message(stalled_for=61.0, timeout=60.0, last_step=None, alive=True)
        == "no progress and no sign of life for 61.0 s (timeout 60 s)"
    )


def test_the_hang_detectors_finding_is_worded_by_hang_message() -> None:
    hang = HangDetector(
        HangConfig(hang_timeout_seconds=2.0, hang_startup_seconds=2.0), started_at=T0
    )
    hang.observe(4, T0 + 1)
    hang.observe(5, T0 + 2)
    finding = hang.check(T0 + 5)
    assert finding is not None
    assert finding.message == hang_message(stalled_for=3.0, timeout=2.0, last_step=5)
    assert finding.details["since"] == T0 + 2


def test_a_failed_attempts_reason_is_the_diagnosis_or_the_detectors_words() -> None:
    hang = HangDetector(
        HangConfig(hang_timeout_seconds=1.0, hang_startup_seconds=1.0), started_at=T0
    ).check(T0 + 2)
    assert hang is not None
    crash = _app_error(0)
    a = attribute([crash], (), failed_at=T0 + 1)
    assert attempt_failure_reason(a) == f"failed: {a.summary}"
    assert attempt_failure_reason(a, crash) == f"failed: {a.summary}"
    assert attempt_failure_reason(a, hang) == f"failed: {hang.message}"


def test_a_restarts_first_step_is_noted_in_one_wording() -> None:
    assert first_progress_note(120, 2) == "first progress after restart: step 120 (attempt 2)"


# --- one line per fact (issue 30, item 3) ---

KERNEL = (
    "[ 3919.471735] NVRM: Xid (PCI:0000:11:00): 79, pid=17382, name=python, "
    "GPU has fallen off the bus."
)
UUID1 = "GPU-00000000-0000-4000-8000-000000000001"


def _xid_findings() -> list[Finding]:
    """What a run sees for the demo's XID: the kernel's line, and the scheduler's reason
    for the attempt it failed, which quotes that line."""
    xid = Finding(
        kind="xid",
        domain=Domain.HARDWARE,
        at=T0,
        source="kernel_log",
        message=KERNEL,
        evidence=(KERNEL,),
        culprit=Culprit(pci_bus_id="0000:11:00.0", host="localhost"),
        signature="xid:79",
        severity=Severity.FATAL,
        xid=79,
    )
    restated = Finding(
        kind="crash",
        domain=Domain.UNKNOWN,
        at=T0,
        source="scheduler",
        message=f"xid on localhost: {KERNEL}",
        culprit=Culprit(host="localhost"),
        severity=Severity.FATAL,
    )
    return [xid, restated]


def test_the_xid_reason_names_the_device_once_and_holds_the_kernel_line_once() -> None:
    devices = simulated(2)
    a = attribute(_xid_findings(), devices, failed_at=T0 + 0.1)
    assert a.summary == (
        f"XID 79 on device {UUID1} (rank 1): "
        "NVRM: Xid (PCI:0000:11:00): 79, pid=17382, name=python, GPU has fallen off the bus."
    )
    # The scheduler's restatement is not evidence either: the line is there once.
    assert a.evidence == (f"[kernel_log] {KERNEL}",)


def test_the_xid_reason_adds_the_ranks_death_when_it_says_something_new() -> None:
    xid = _xid_findings()[0]
    death = Finding(
        kind="crash",
        domain=Domain.UNKNOWN,
        at=T0,
        source="process:rank",
        message="rank 1 (pid 17382) killed by SIGKILL",
        culprit=Culprit(rank=1),
        severity=Severity.FATAL,
    )
    assert hardware_reason(xid, Culprit(device_uuid=UUID1, rank=1), death) == (
        f"XID 79 on device {UUID1} (rank 1): NVRM: Xid (PCI:0000:11:00): 79, pid=17382, "
        "name=python, GPU has fallen off the bus.; rank 1 (pid 17382) killed by SIGKILL"
    )


def test_the_verify_verdict_is_a_short_phrase_with_its_figures_in_details() -> None:
    v = verify_restart(
        RestartObservation(
            now=T0 + 10,
            started_at=T0,
            restored_step=8,
            first_step=9,
            first_at=T0 + 1,
            last_step=21,
            last_at=T0 + 4,
            rate=5.85,
            baseline_rate=5.9,
            rate_clock=StepClock.BATCHED,
            baseline_clock=StepClock.BATCHED,
            expected_ranks=frozenset({0, 1}),
            reported_ranks=frozenset({0, 1}),
            ranks_source="the ranks that reported before the failure",
        ),
        VerifyRules(window_seconds=2.0),
    )
    assert v.reason == "steps 9 -> 21 at 5.85 steps/s; rate not checked; all 2 ranks reported"
    assert v.details["ranks_source"] == "the ranks that reported before the failure"
    assert v.details["rate_unchecked"] and "trainguard.train" in v.details["rate_unchecked"]


def test_actors_read_as_names_people_know() -> None:
    assert actor_name("vm:21938:301429:73fe0e86-5b1c-4b1e-9a53-9f2d1c3e4a5b") == "trainguard run"
    assert actor_name("node7:21938:301429:") == "trainguard run"  # no boot id known
    assert actor_name("gpu-head-1:4242:9f3a0c") == "serve@gpu-head-1"
    assert actor_name("trainguard-run") == "trainguard run"
    for human in ("operator:alice", "token:ci", "agent:node7", "trainguard", "job:job-1"):
        assert actor_name(human) == human
    assert actor_name("") == "-" and actor_name(None) == "-"


def test_an_incident_update_without_a_note_says_what_changed(tmp_path: Path) -> None:
    devs = simulated(2)
    with Store.open(tmp_path / "s.db") as s:
        s.devices.register_devices(devs, at=T0)
        s.jobs.create_job(name="j", command=["torchrun"], need=2, at=T0, job_id="j1")
        s.jobs.start_attempt("j1", 0, devs, at=T0)
        inc = s.incidents.open_incident(
            "j1", 0, attribute([_app_error(0)], devs, T0 + 1), detected_at=T0
        )
        s.incidents.update_incident(
            inc.id, at=T0 + 1, checkpoint_step=8, failed_step=10, acted_at=T0 + 1
        )
        s.incidents.update_incident(
            inc.id,
            at=T0 + 1,
            checkpoint_path="/work/wt/readable/demo-run/recovery/checkpoints/step_00000008",
            repair="XID 79 (GPU_HAS_FALLEN_OFF_THE_BUS): NVIDIA's immediate action RESTART_BM",
        )
        s.incidents.update_incident(inc.id, at=T0 + 2, note="first progress after restart: step 9")
        notes = [e.message for e in s.audit.list_audit(subject=f"incident:{inc.id}")][-3:]
    assert notes == [
        "incident 1 updated: checkpoint step 8, failed step 10",
        "incident 1 updated: checkpoint path …/step_00000008, repair set",
        "incident 1 updated: first progress after restart: step 9",
    ]


def test_a_health_change_for_an_incidents_cause_points_at_the_incident(tmp_path: Path) -> None:
    devs = simulated(3)
    with Store.open(tmp_path / "s.db") as s:
        s.devices.register_devices(devs, at=T0)
        s.jobs.create_job(name="j", command=["torchrun"], need=2, at=T0, job_id="j1")
        s.jobs.start_attempt("j1", 0, devs[:2], at=T0)
        a = attribute(_xid_findings(), devs[:2], failed_at=T0 + 0.1)
        inc = s.incidents.open_incident("j1", 0, a, detected_at=T0 + 0.1)
        s.devices.transition_device(
            devs[1].uuid, HealthState.QUARANTINED, a.summary, "ctl", T0 + 1, incident_id=inc.id
        )
        s.devices.transition_device(
            devs[2].uuid, HealthState.QUARANTINED, "same host", "ctl", T0 + 1, incident_id=inc.id
        )
        lines = [e.message for e in s.audit.list_audit(kind=AuditKind.HEALTH)]
        # The device's own record keeps the whole reason (the devices table shows it).
        assert s.devices.get_device(devs[1].uuid).reason == a.summary
    assert lines == [
        f"device 1 {UUID1} healthy -> quarantined (incident 1)",
        f"device 2 {devs[2].uuid} healthy -> quarantined: same host",
    ]


def test_approvals_name_who_asked_and_who_answered_as_a_person_reads_it() -> None:
    from trainguard.model.fleet import ApprovalState
    from trainguard.store import Store
    from trainguard.store.fleet import FleetStore

    holder = "vm:21938:301429:73fe0e86-aaaa-bbbb-cccc-000000000000"  # a run's lease holder
    with Store.open(":memory:") as store:
        fleet = FleetStore(store)
        asked = fleet.approvals.request_approval(
            kind="restart", subject="job:j", why="unknown twice", at=1.0, actor=holder
        )
        assert asked.to_json()["requested_by"] == holder  # the raw id stays in JSON
        assert asked.to_json()["requested_by_name"] == "trainguard run"
        fleet.approvals.decide_approval(
            asked.id, ApprovalState.DENIED, actor="trainguard run (no answer in 2 s)",
            reason="no answer is a no", at=3.0,
        )  # fmt: skip
        line = store.audit.list_audit()[-1].message
        assert line == (
            f"approval {asked.id} denied by trainguard run (no answer in 2 s): no answer is a no"
        )
