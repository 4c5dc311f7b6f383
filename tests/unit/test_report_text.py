"""``trainguard report``'s text: actions read as sentences, evidence once (issue 14, item 10)."""

from __future__ import annotations

from pathlib import Path

from trainguard.model import Attribution, Culprit, Domain, HealthState, IncidentKind
from trainguard.model.records import AttemptState, IncidentState
from trainguard.signals.inventory import simulated
from trainguard.store import Store
from trainguard.store.report import EVIDENCE_WIDTH, build_report, dedupe_evidence, format_report

T0 = 1_764_400_000.0
XID = "NVRM: Xid (PCI:0000:11:00): 79, pid=1180, name=python, GPU has fallen off the bus."
# torchrun's own failure summary, as a crash finding quotes it.
CHILD_FAILED = [
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    "tiny_train.py FAILED",
    "Root Cause (first observed failure):",
    "  exitcode  : -9 (pid: 18194)  (SIGKILL)",
]
RUN_HOLDER = "vm:21938:301429:73fe0e86-5b1c-4b1e-9a53-9f2d1c3e4a5b"


def _report(tmp_path: Path) -> dict:
    devs = simulated(3)
    with Store.open(tmp_path / "s.db") as s:
        s.devices.register_devices(devs, at=T0)
        s.jobs.create_job(name="demo", command=["torchrun"], need=2, at=T0, job_id="j1")
        s.jobs.start_attempt("j1", 0, devs[:2], at=T0)
        inc = s.incidents.open_incident(
            "j1",
            0,
            Attribution(
                kind=IncidentKind.XID,
                domain=Domain.HARDWARE,
                culprit=Culprit(device_uuid=devs[1].uuid, rank=1),
                confidence=0.95,
                summary="XID 79 on rank 1's device",
                # As the run loop records it: the tagged line, the raw line, repeats.
                evidence=(f"[kernel_log] {XID}", XID, "step=9 loss=1.0", "step=9 loss=1.0", ""),
            ),
            detected_at=T0 + 1,
        )
        s.incidents.add_incident_action(
            inc.id,
            {
                "type": "restart",
                "summary": "attempt 1 on 0,2 from step 8",
                "attempt": 1,
                "checkpoint": "/ck/step_00000008",
                "checkpoint_step": 8,
                "delay_seconds": 0.0,
                "devices": [devs[0].uuid, devs[2].uuid],
                "env": {},
                "skipped_checkpoints": [{"path": "/ck/step_00000012", "reason": "sha256 mismatch"}],
                "intent_id": 19,
            },
            at=T0 + 2,
        )
        return build_report(s, inc.id)


def test_actions_are_text_not_python_reprs(tmp_path: Path) -> None:
    text = format_report(_report(tmp_path))
    actions = text[text.index("Actions") : text.index("Repair:")]
    for repr_mark in ("['", "{'", "={}", "=[]", "=0.0", "intent_id"):
        assert repr_mark not in actions, actions
    assert "restart: attempt 1 on 0,2 from step 8" in actions
    assert "skipped /ck/step_00000012 (sha256 mismatch)" in actions
    assert "checkpoint /ck/step_00000008" in actions


def test_evidence_is_shown_once(tmp_path: Path) -> None:
    report = _report(tmp_path)
    assert report["evidence"] == [f"[kernel_log] {XID}", "step=9 loss=1.0"]
    text = format_report(report, evidence=True)
    assert text.count(XID) == 1 and text.count("step=9 loss=1.0") == 1


def test_raw_evidence_is_folded_behind_the_evidence_flag(tmp_path: Path) -> None:
    report = _report(tmp_path)
    long_line = "[output] " + "x" * 300
    report["evidence"] = [*report["evidence"], long_line, *CHILD_FAILED]
    text = format_report(report)
    evidence = text[text.index("\nEvidence") : text.index("\nActions")].splitlines()[2:]
    assert evidence == [
        f"  [kernel_log] {XID}",
        "  [output] " + "x" * (EVIDENCE_WIDTH - len("[output] ") - 1) + "…",
        f"  ({1 + len(CHILD_FAILED)} more line(s): trainguard report 1 --evidence)",
    ]
    assert "ChildFailedError" not in text
    full = format_report(report, evidence=True)
    assert long_line in full and all(line in full for line in CHILD_FAILED)
    assert "--evidence)" not in full


def test_dedupe_keeps_order_and_distinct_lines() -> None:
    lines = ["b", "[x] a", "a", "b", "c", "[y] c"]
    assert dedupe_evidence(lines) == ["b", "[x] a", "[y] c"]


def _demo_like(tmp_path: Path) -> dict:
    """The demo's first incident as the run loop records it: XID 79 on rank 1's card
    at step 10, the card quarantined by the run, a restart from step 8 that verified."""
    devs = simulated(3)
    summary = f"XID 79 on device {devs[1].uuid} (rank 1): {XID}"
    with Store.open(tmp_path / "s.db") as s:
        s.devices.register_devices(devs, at=T0)
        s.jobs.create_job(name="demo", command=["torchrun"], need=2, at=T0, job_id="j1")
        s.jobs.start_attempt("j1", 0, devs[:2], at=T0)
        for step in range(1, 11):
            s.jobs.update_attempt_progress("j1", 0, step, at=T0 + step * 0.5)
        s.jobs.finish_attempt(
            "j1", 0, AttemptState.FAILED, at=T0 + 5.1, reason=f"failed: {summary}"
        )
        inc = s.incidents.open_incident(
            "j1",
            0,
            Attribution(
                kind=IncidentKind.XID,
                domain=Domain.HARDWARE,
                culprit=Culprit(device_uuid=devs[1].uuid, rank=1, host="localhost"),
                confidence=0.95,
                summary=summary,
                evidence=(f"[kernel_log] [ 3919.471735] {XID}",),
            ),
            detected_at=T0 + 5.1,
            fault_at=T0 + 5.0,
            failed_step=10,
            actor=RUN_HOLDER,
        )
        s.devices.transition_device(
            devs[1].uuid, HealthState.QUARANTINED, summary, RUN_HOLDER, T0 + 5.2,
            job_id="j1", incident_id=inc.id,
        )  # fmt: skip
        s.incidents.update_incident(
            inc.id, at=T0 + 5.3, state=IncidentState.ACTING, checkpoint_step=8,
            checkpoint_path="/ck/step_00000008", recovery_attempt=1, actor=RUN_HOLDER,
        )  # fmt: skip
        s.jobs.start_attempt("j1", 1, [devs[0], devs[2]], at=T0 + 5.4, checkpoint_step=8)
        s.incidents.update_incident(
            inc.id, at=T0 + 5.5, state=IncidentState.VERIFYING, actor=RUN_HOLDER
        )
        s.incidents.update_incident(
            inc.id, at=T0 + 9.0, state=IncidentState.RECOVERED,
            note="verified: steps 9 -> 21 at 5.85 steps/s; all 2 ranks reported",
            note_details={"first_step": 9, "last_step": 21, "ranks_source": "the ranks seen"},
            actor=RUN_HOLDER,
        )  # fmt: skip
        return build_report(s, inc.id)


def test_the_header_speaks_of_the_incident_as_a_whole(tmp_path: Path) -> None:
    text = format_report(_demo_like(tmp_path))
    uuid = "GPU-00000000-0000-4000-8000-000000000001"
    assert text.splitlines()[:8] == [
        "Incident 1: xid (hardware), recovered",
        "  job: j1 (demo)",
        f"  cause: XID 79 on device {uuid} (rank 1): {XID}",
        f"  culprit: device {uuid}, rank 1 on localhost",
        "  failures: 1, restarts: 1 (job total 1), recovered by attempt 1",
        "  lost work: 2 step(s), about 1.0 s at 2 steps/s",
        "  time to detect: 0.10 s, to act: 0.30 s, to verified recovery: 4.00 s (from fault)",
        "",
    ]


def test_per_failure_figures_are_in_the_timeline_and_the_cause_is_said_once(
    tmp_path: Path,
) -> None:
    text = format_report(_demo_like(tmp_path))
    timeline = text[text.index("Timeline") : text.index("Affected")].splitlines()
    whats = [line.split("  ", 2)[-1] for line in timeline[1:] if line.strip()]
    assert whats[:3] == ["fault", "detected xid (hardware)", "attempt 0 failed at step 10"]
    assert whats[-1] == "verified: steps 9 -> 21 at 5.85 steps/s; all 2 ranks reported"
    # The kernel line once in the header (the evidence keeps its own tagged copy).
    assert text.count(XID) == 2 and text.count("cause: XID 79 on device") == 1
    assert "Checkpoint restored" not in text and "failed at step 10)" not in text


def test_people_read_actor_names_and_json_keeps_the_holder_id(tmp_path: Path) -> None:
    report = _demo_like(tmp_path)
    text = format_report(report)
    assert RUN_HOLDER not in text
    assert (
        "  GPU-00000000-0000-4000-8000-000000000001 -> quarantined at "
        f"{report['affected']['health_changes'][0]['at']} by trainguard run"
    ) in text.splitlines()
    assert report["affected"]["health_changes"][0]["actor"] == RUN_HOLDER
    verified = [t for t in report["timeline"] if t["what"].startswith("verified: ")]
    assert verified[0]["details"] == {
        "first_step": 9,
        "last_step": 21,
        "ranks_source": "the ranks seen",
    }
