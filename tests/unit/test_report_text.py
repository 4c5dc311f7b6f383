"""``trainguard report``'s text: actions read as sentences, evidence once (issue 14, item 10)."""

from __future__ import annotations

from pathlib import Path

from trainguard.model import Attribution, Culprit, Domain, IncidentKind
from trainguard.signals.inventory import simulated
from trainguard.store import Store
from trainguard.store.report import build_report, dedupe_evidence, format_report

T0 = 1_764_400_000.0
XID = "NVRM: Xid (PCI:0000:11:00): 79, pid=1180, name=python, GPU has fallen off the bus."


def _report(tmp_path: Path) -> dict:
    devs = simulated(3)
    with Store.open(tmp_path / "s.db") as s:
        s.register_devices(devs, at=T0)
        s.create_job(name="demo", command=["torchrun"], need=2, at=T0, job_id="j1")
        s.start_attempt("j1", 0, devs[:2], at=T0)
        inc = s.open_incident(
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
        s.add_incident_action(
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
    text = format_report(report)
    assert text.count(XID) == 1 and text.count("step=9 loss=1.0") == 1


def test_dedupe_keeps_order_and_distinct_lines() -> None:
    lines = ["b", "[x] a", "a", "b", "c", "[y] c"]
    assert dedupe_evidence(lines) == ["b", "[x] a", "[y] c"]
