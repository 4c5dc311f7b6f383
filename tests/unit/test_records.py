"""State machines and JSON forms of the store records (model/records.py)."""

from __future__ import annotations

import pytest

from trainguard.model import Culprit, Device, Domain, IllegalTransition, IncidentKind
from trainguard.model.records import (
    ATTEMPT_TRANSITIONS,
    INCIDENT_TRANSITIONS,
    JOB_TRANSITIONS,
    AttemptRecord,
    AttemptState,
    IncidentRecord,
    IncidentState,
    JobState,
    TimelineEntry,
    check_attempt_transition,
    check_incident_transition,
    check_job_transition,
    iso_utc,
    parse_iso_utc,
)


def test_tables_cover_every_state_and_terminal_states_have_no_exit() -> None:
    for table, enum in (
        (JOB_TRANSITIONS, JobState),
        (ATTEMPT_TRANSITIONS, AttemptState),
        (INCIDENT_TRANSITIONS, IncidentState),
    ):
        assert set(table) == set(enum)
        for state, targets in table.items():
            assert state not in targets  # no self loops: a "change" that changes nothing is a bug
            if state.terminal:  # type: ignore[attr-defined]
                assert targets == frozenset()


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (AttemptState.STARTING, AttemptState.RUNNING),
        (AttemptState.STARTING, AttemptState.VERIFYING),
        (AttemptState.VERIFYING, AttemptState.VERIFIED),
        (AttemptState.VERIFYING, AttemptState.FAILED),
        (AttemptState.VERIFIED, AttemptState.COMPLETED),
        (AttemptState.RUNNING, AttemptState.FAILED),
    ],
)
def test_legal_attempt_transitions(old: AttemptState, new: AttemptState) -> None:
    assert check_attempt_transition(old, new) is new


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (AttemptState.COMPLETED, AttemptState.RUNNING),
        (AttemptState.FAILED, AttemptState.VERIFYING),
        (AttemptState.RUNNING, AttemptState.VERIFIED),  # must pass through verifying
        (AttemptState.STARTING, AttemptState.VERIFIED),
    ],
)
def test_illegal_attempt_transitions_raise(old: AttemptState, new: AttemptState) -> None:
    with pytest.raises(IllegalTransition, match="attempt"):
        check_attempt_transition(old, new)


def test_incident_machine() -> None:
    assert check_incident_transition(IncidentState.OPEN, IncidentState.OBSERVED)
    assert check_incident_transition(IncidentState.VERIFYING, IncidentState.ACTING)
    with pytest.raises(IllegalTransition):
        check_incident_transition(IncidentState.OPEN, IncidentState.RECOVERED)
    with pytest.raises(IllegalTransition):
        check_incident_transition(IncidentState.RECOVERED, IncidentState.ACTING)
    assert IncidentState.ACTING.outcome == "open"
    assert IncidentState.STOPPED.outcome == "stopped"


def test_job_machine() -> None:
    assert check_job_transition(JobState.RUNNING, JobState.RECOVERING)
    with pytest.raises(IllegalTransition):
        check_job_transition(JobState.COMPLETED, JobState.RUNNING)


def test_iso_round_trip() -> None:
    assert iso_utc(None) is None
    assert iso_utc(1764400000.5) == "2025-11-29T07:06:40.500Z"
    assert parse_iso_utc("2025-11-29T07:06:40.500Z") == 1764400000.5
    assert parse_iso_utc("2025-11-29T08:06:40.5+01:00") == 1764400000.5
    assert parse_iso_utc("2025-11-29T07:06:40.5") == 1764400000.5  # naive = UTC
    assert parse_iso_utc("1764400000.5") == 1764400000.5
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_iso_utc("yesterday")


def test_attempt_step_rate() -> None:
    dev = Device(0, "GPU-a", "0000:10:00.0")
    a = AttemptRecord(
        "j",
        0,
        (dev,),
        started_at=0.0,
        first_step=10,
        first_step_at=100.0,
        last_step=30,
        last_step_at=110.0,
    )
    assert a.step_rate == 2.0
    assert AttemptRecord("j", 0, (dev,), started_at=0.0).step_rate is None
    same = AttemptRecord(
        "j",
        0,
        (dev,),
        started_at=0.0,
        first_step=5,
        first_step_at=1.0,
        last_step=5,
        last_step_at=1.0,
    )
    assert same.step_rate is None


def test_incident_json_has_the_public_keys() -> None:
    inc = IncidentRecord(
        id=3,
        job_id="j",
        attempt=1,
        kind=IncidentKind.XID,
        domain=Domain.HARDWARE,
        detected_at=1764400000.0,
        culprit=Culprit(device_uuid="GPU-a", pci_bus_id="0000:c1:00.0", rank=1),
        timeline=(TimelineEntry(1764400000.0, "detected"),),
    )
    out = inc.to_json()
    for key in (
        "id",
        "job_id",
        "attempt",
        "kind",
        "domain",
        "culprit",
        "detected_at",
        "acted_at",
        "recovered_at",
        "checkpoint_step",
        "failed_step",
        "lost_steps",
        "outcome",
        "actions",
    ):
        assert key in out
    assert out["kind"] == "xid"
    assert out["culprit"] == {
        "device_uuid": "GPU-a",
        "pci_bus_id": "0000:c1:00.0",
        "rank": 1,
        "host": None,
    }
    assert out["detected_at"] == "2025-11-29T07:06:40.000Z"
    assert out["acted_at"] is None and out["recovered_at"] is None
    assert out["outcome"] == "open"
    assert out["timeline"] == [{"at": "2025-11-29T07:06:40.000Z", "what": "detected"}]


def test_parse_time_reads_durations_ago_iso_and_epoch_seconds() -> None:
    from trainguard.model.records import parse_time

    now = 1_764_400_000.0
    assert parse_time("90s", now) == now - 90
    assert parse_time("30m", now) == now - 1800
    assert parse_time("2h", now) == now - 7200
    assert parse_time("7d", now) == now - 7 * 86400
    assert parse_time("2w", now) == now - 14 * 86400
    assert parse_time("1.5h", now) == now - 5400
    assert parse_time("2025-11-29T07:06:40Z", now) == 1_764_400_000.0
    assert parse_time("1764400000", now) == 1_764_400_000.0
    for bad in ("", "30 days", "-2h", "inf", "2y"):
        with pytest.raises(ValueError, match="not a time"):
            parse_time(bad, now)
