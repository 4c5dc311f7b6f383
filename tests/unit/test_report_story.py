"""``trainguard report`` tells the restart's story (decisions 0530-0532): what was
restored (an epoch-counted checkpoint as such), which damaged checkpoints were passed
over and where they went, how the restart was verified, and the job's warnings, with
the same fields in ``--json``; lost work said with its bound."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainguard.model import Attribution, Culprit, Domain, IncidentKind
from trainguard.model.records import AttemptState, AuditKind, IncidentState
from trainguard.signals.inventory import simulated
from trainguard.store import Store
from trainguard.store.report import build_report, format_report

T0 = 1_764_400_000.0


def _incident(tmp_path: Path, *, sparse: bool, epoch: bool = False) -> dict[str, Any]:
    """A crash at t=T0+23.6 after step 40 (2 steps/s); restored step 30 (or an epoch
    file), the damaged newest checkpoint moved aside, the restart verified on steps."""
    devs = simulated(2)
    with Store.open(tmp_path / "s.db") as s:
        s.devices.register_devices(devs, at=T0)
        s.jobs.create_job(name="titan", command=["torchrun"], need=2, at=T0, job_id="j1")
        s.jobs.start_attempt("j1", 0, devs, at=T0)
        stride = 10 if sparse else 1
        for step in range(stride, 41, stride):
            s.jobs.update_attempt_progress("j1", 0, step, at=T0 + step * 0.5)
        fault = T0 + 23.6 if sparse else T0 + 20.3
        s.jobs.finish_attempt("j1", 0, AttemptState.FAILED, at=fault, reason="crash")
        inc = s.incidents.open_incident(
            "j1", 0,
            Attribution(kind=IncidentKind.CRASH, domain=Domain.UNKNOWN,
                        culprit=Culprit(rank=1), confidence=0.6, summary="rank 1 killed"),
            detected_at=fault + 0.1, fault_at=fault, failed_step=40,
        )  # fmt: skip
        damaged = "/ck/step-40"
        s.incidents.record_plan(
            inc.id,
            {"actions": [{"type": "restart"}],
             "skipped_checkpoints": [{"path": damaged, "step": 40, "valid": False,
                                      "reason": "sha256 mismatch in shard 1"}]},
            at=fault + 0.2,
        )  # fmt: skip
        s.audit.append_audit(
            fault + 0.3, "trainguard", AuditKind.RESULT, "job:j1",
            "moved 1 of 1 rejected checkpoint(s) aside",
            {"moved": [{"path": damaged, "moved_to": "/ck/.trainguard-rejected/step-40",
                        "reason": "sha256 mismatch in shard 1", "error": None}]},
            job_id="j1", incident_id=inc.id,
        )  # fmt: skip
        path = "/ck/epoch_3.pt" if epoch else "/ck/step-30"
        s.incidents.add_incident_action(
            inc.id,
            {"type": "restart", "attempt": 1, "checkpoint": path,
             "checkpoint_step": None if epoch else 30,
             **({"checkpoint_epoch": 4} if epoch else {}),
             "summary": "attempt 1 " + ("from epoch_3.pt (epoch 4)" if epoch else "from step 30")},
            at=fault + 0.4,
        )  # fmt: skip
        s.jobs.start_attempt("j1", 1, devs, at=fault + 0.4)
        s.incidents.update_incident(
            inc.id, at=fault + 0.4, state=IncidentState.ACTING,
            checkpoint_path=path, checkpoint_step=None if epoch else 30,
            lost_steps=None if epoch else 10, recovery_attempt=1,
        )  # fmt: skip
        s.incidents.update_incident(inc.id, at=fault + 0.5, state=IncidentState.VERIFYING)
        s.incidents.update_incident(
            inc.id, at=fault + 12, state=IncidentState.RECOVERED, resumed_step=31,
            warning="no progress signal: example",
            note="verified: steps 31 -> 52 at 2.00 steps/s; rate not checked",
            note_details={"method": "steps", "first_step": 31, "last_step": 52, "rate": 2.0,
                          "baseline_rate": None, "rate_unchecked": "no pre-failure rate"},
        )  # fmt: skip
        return build_report(s, inc.id)


def test_json_has_the_restore_the_set_aside_the_verdict_and_the_warnings(
    tmp_path: Path,
) -> None:
    r = _incident(tmp_path, sparse=True)
    assert r["checkpoint"] == {"path": "/ck/step-30", "step": 30, "epoch": None,
                               "said": "from step 30"}  # fmt: skip
    assert r["resumed_step"] == 31 and r["warnings"] == ["no progress signal: example"]
    assert r["set_aside"] == [
        {"path": "/ck/step-40", "step": 40, "reason": "sha256 mismatch in shard 1",
         "moved_to": "/ck/.trainguard-rejected/step-40", "error": None}
    ]  # fmt: skip
    v = r["verification"]
    assert (v["verdict"], v["rate_checked"], v["rate_unchecked"]) == (
        "step_verified", False, "no pre-failure rate",
    )  # fmt: skip
    assert (v["first_step"], v["last_step"]) == (31, 52)


def test_sparse_output_lost_work_is_an_estimate_with_its_bound(tmp_path: Path) -> None:
    # Step 40 seen at T0+20, the crash at T0+23.6 at 2 steps/s: ≈ 7 unseen steps.
    lw = _incident(tmp_path, sparse=True)["lost_work"]
    got = (lw["steps"], lw["bound"], lw["counted_steps"], lw["said"])
    assert got == (17, "estimate", 10, "≈ 17")
    exact = _incident(tmp_path / "e", sparse=False)["lost_work"]
    assert (exact["steps"], exact["bound"], exact["said"]) == (10, "exact", "10")


def test_the_text_tells_why_work_was_lost_and_how_the_restart_was_verified(
    tmp_path: Path,
) -> None:
    text = format_report(_incident(tmp_path, sparse=True))
    story = text[text.index("\nRestart\n") : text.index("\nTimeline")]
    assert "  restored: from step 30 (/ck/step-30); first step trained after it: 31" in story
    assert (
        "  passed over, so the work after the restored step was lost: /ck/step-40 (step 40): "
        "sha256 mismatch in shard 1; moved to /ck/.trainguard-rejected/step-40"
    ) in story
    assert "  verified on steps: steps 31 -> 52" in story
    assert "rate not checked: no pre-failure rate" in story
    assert "  warning: no progress signal: example" in story
    assert "  lost work: ≈ 17 step(s) (10 counted from the last step seen" in text


def test_an_epoch_checkpoint_restore_is_said_as_one_never_from_the_beginning(
    tmp_path: Path,
) -> None:
    r = _incident(tmp_path, sparse=True, epoch=True)
    assert r["checkpoint"] == {"path": "/ck/epoch_3.pt", "step": None, "epoch": 4,
                               "said": "from epoch_3.pt (epoch 4)"}  # fmt: skip
    text = format_report(r)
    assert "  restored: from epoch_3.pt (epoch 4)" in text
    assert "from the beginning" not in text and "step None" not in text
