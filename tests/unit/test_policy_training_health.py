"""Checkpoint gating and futility after a training-health event (decisions 0520, 0521):
``decide()`` restores the newest checkpoint from *before* the event, lists the suspect
ones, and stops when the same event recurs at the same step; never quarantines for it."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st
from test_policy import attribution, ckpt, snapshot

from trainguard.diagnose.training_health import (
    HealthEvent,
    health_attribution,
    health_finding,
)
from trainguard.model import Culprit, Domain, IncidentKind
from trainguard.model.plan import PriorFailure, Quarantine, Restart, Stop
from trainguard.policy import decide
from trainguard.policy.checkpoint_choice import (
    RestorePoint,
    is_suspect,
    restore_point,
    select_checkpoint,
)


def health(step: int, kind: str = "nan_loss", metric: str = "grad_norm", rank: int = 0):  # type: ignore[no-untyped-def]
    f = health_finding(HealthEvent(kind, step, metric, float("nan"), rank=rank), at=1.0)
    a = health_attribution([f], Culprit(rank=rank, device_uuid="GPU-0000"))
    assert a is not None
    return a


def test_the_restore_point_is_the_newest_checkpoint_before_the_event() -> None:
    snap = snapshot(attribution=health(17), checkpoints=(ckpt(25), ckpt(20), ckpt(15), ckpt(10)))
    plan = decide(snap)
    restart = plan.actions[-1]
    assert isinstance(restart, Restart) and restart.checkpoint is not None
    assert restart.checkpoint.step == 15
    assert [c.step for c in plan.skipped_checkpoints] == [25, 20]
    assert all(c.reason and c.reason.startswith("suspect") for c in plan.skipped_checkpoints)
    assert not any(isinstance(a, Quarantine) for a in plan.actions)
    assert any("newest from before step 17" in r for r in plan.reasons)


def test_a_checkpoint_at_the_event_step_is_suspect_and_none_before_starts_fresh() -> None:
    plan = decide(snapshot(attribution=health(10), checkpoints=(ckpt(10),)))
    restart = plan.actions[-1]
    assert isinstance(restart, Restart) and restart.checkpoint is None
    assert any("no valid checkpoint from before step 10" in r for r in plan.reasons)


def test_without_an_event_the_newest_valid_checkpoint_is_restored_as_before() -> None:
    plan = decide(snapshot(attribution=attribution(), checkpoints=(ckpt(20), ckpt(10))))
    restart = plan.actions[-1]
    assert isinstance(restart, Restart) and restart.checkpoint is not None
    assert restart.checkpoint.step == 20 and plan.skipped_checkpoints == ()


def _prior(a, attempt: int) -> PriorFailure:  # type: ignore[no-untyped-def]
    return PriorFailure(
        attempt=attempt,
        signature=a.signature,
        domain=a.domain.value,
        kind=a.kind.value,
        culprit=a.culprit,
    )


def test_the_same_event_at_the_same_step_again_is_futile_without_quarantine() -> None:
    first = health(17)
    snap = snapshot(
        attempt=1,
        restarts_used=1,
        attribution=health(17),
        history=(_prior(first, 0),),
        checkpoints=(ckpt(15),),
    )
    plan = decide(snap)
    stop = plan.actions[-1]
    assert isinstance(stop, Stop) and "futile" in stop.reason and "step 17" in stop.reason
    assert "not a GPU" in stop.reason
    assert not any(isinstance(a, Quarantine) for a in plan.actions)


def test_the_same_kind_of_event_at_another_step_restarts_again() -> None:
    snap = snapshot(
        attempt=1,
        restarts_used=1,
        attribution=health(30),
        history=(_prior(health(17), 0),),
        checkpoints=(ckpt(25), ckpt(15)),
    )
    restart = decide(snap).actions[-1]
    assert isinstance(restart, Restart) and restart.checkpoint is not None
    assert restart.checkpoint.step == 25


def test_a_replica_mismatch_is_not_quarantined_on_its_first_occurrence() -> None:
    a = health(9, kind="replica_mismatch", metric="parameters", rank=1)
    assert a.domain is Domain.UNKNOWN and a.kind is IncidentKind.APP_ERROR
    plan = decide(snapshot(attribution=a, checkpoints=(ckpt(12), ckpt(8))))
    assert not any(isinstance(x, Quarantine) for x in plan.actions)
    restart = plan.actions[-1]
    assert isinstance(restart, Restart) and restart.checkpoint is not None
    assert restart.checkpoint.step == 8


def test_a_replica_mismatch_naming_the_same_device_again_quarantines_it() -> None:
    first = health(9, kind="replica_mismatch", metric="parameters", rank=1)
    again = health(31, kind="replica_mismatch", metric="parameters", rank=1)
    snap = snapshot(
        attempt=1, restarts_used=1, attribution=again, history=(_prior(first, 0),),
        checkpoints=(ckpt(30), ckpt(8)),
    )  # fmt: skip
    plan = decide(snap)
    [q] = [a for a in plan.actions if isinstance(a, Quarantine)]
    assert q.resource_id == "GPU-0000"
    restart = plan.actions[-1]
    assert isinstance(restart, Restart) and "GPU-0000" not in restart.devices
    # Another device named the second time: still only suspect.
    other = health(31, kind="replica_mismatch", metric="parameters", rank=1)
    other = dataclasses.replace(other, culprit=Culprit(rank=1, device_uuid="GPU-0001"))
    plan = decide(dataclasses.replace(snap, attribution=other))
    assert not any(isinstance(a, Quarantine) for a in plan.actions)


def test_a_replica_mismatch_at_the_same_step_again_is_futile_without_quarantine() -> None:
    first = health(9, kind="replica_mismatch", metric="parameters", rank=1)
    snap = snapshot(
        attempt=1, restarts_used=1, attribution=first, history=(_prior(first, 0),),
        checkpoints=(ckpt(8),),
    )  # fmt: skip
    plan = decide(snap)
    assert isinstance(plan.actions[-1], Stop) and "futile" in plan.actions[-1].reason
    assert not any(isinstance(a, Quarantine) for a in plan.actions)


def test_the_withheld_resume_request_never_offers_a_suspect_checkpoint() -> None:
    planned = ckpt(15)
    assert restore_point(planned, withheld=True, newest=ckpt(20), event_step=17) == RestorePoint(
        planned.path, 15
    )
    assert restore_point(planned, withheld=True, newest=ckpt(16), event_step=17).step == 16


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.integers(1, 500), min_size=0, max_size=12, unique=True),
    invalid=st.sets(st.integers(1, 500)),
    event=st.one_of(st.none(), st.integers(1, 500)),
)
def test_the_restored_checkpoint_is_never_suspect_and_is_the_newest_eligible(
    steps: list[int], invalid: set[int], event: int | None
) -> None:
    """Safety: whatever the catalog holds, the chosen checkpoint is valid, saved before
    the event, and no eligible one is newer; everything newer is listed as skipped."""
    cks = tuple(ckpt(s, valid=s not in invalid) for s in sorted(steps, reverse=True))
    chosen, skipped = select_checkpoint(cks, event)
    eligible = [c for c in cks if c.valid and not is_suspect(c, event)]
    if not eligible:
        assert chosen is None and len(skipped) == len(cks)
        return
    assert chosen == eligible[0]
    assert chosen.step is not None and (event is None or chosen.step < event)
    assert [c.step for c in skipped] == [c.step for c in cks if c.step > chosen.step]
    assert not any(c.valid for c in skipped)


def test_an_attempts_own_health_event_fails_it_and_anothers_does_not() -> None:
    from trainguard.policy.evidence import Route, route_finding

    f = health_finding(HealthEvent("loss_spike", 40, "loss", 9.0, 1.0, 0.1), at=1.0)
    assert route_finding(f, attempt_devices={"GPU-0000"}, own=True) is Route.RECOVER
    assert route_finding(f, attempt_devices={"GPU-0000"}) is Route.OBSERVE


def test_a_health_event_is_the_cause_unless_hardware_evidence_won() -> None:
    from trainguard.diagnose.attribution import with_health_event
    from trainguard.model import Device, Finding, Severity

    dev = Device(index=0, uuid="GPU-0000", pci_bus_id="0000:10:00.0", host="localhost")
    f = health_finding(HealthEvent("nan_loss", 12, "loss", float("nan"), rank=0), at=1.0)
    crash = attribution()
    got = with_health_event(crash, [f], [dev])
    assert got.signature == "nan_loss:loss@step:12" and got.culprit.device_uuid == "GPU-0000"
    xid = Finding(kind="xid", domain=Domain.HARDWARE, at=1.0, source="kernel",
                  message="Xid 79", severity=Severity.FATAL)  # fmt: skip
    hw = attribution(IncidentKind.XID, Domain.HARDWARE, findings=(xid,))
    assert with_health_event(hw, [f, xid], [dev]) is hw
