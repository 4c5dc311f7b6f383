"""Decision 0381: a job's start on too few devices (policy/start.py), and the policy
that stops instead of waiting for capacity (``wait_for_capacity: false``)."""

from __future__ import annotations

import pytest
from test_policy import attribution, inventory, snapshot

from trainguard.controller.policies import load_policy_text, parse_policy, resolve
from trainguard.model import Culprit, Domain, HealthState, IncidentKind
from trainguard.model.plan import DeviceStatus, Quarantine, RecoveryPolicy, Stop, WaitForCapacity
from trainguard.policy import decide
from trainguard.policy.hang import no_progress_hint
from trainguard.policy.start import default_need, start_devices


def test_the_start_takes_need_devices_when_enough_are_schedulable() -> None:
    statuses = inventory(3, {1: HealthState.SUSPECT})
    assert default_need(statuses) == 3
    start = start_devices(statuses, 2, None)
    assert (start.count, start.reason, start.note) == (2, None, None)


def test_min_need_starts_short_and_says_so() -> None:
    statuses = inventory(2, {1: HealthState.QUARANTINED})
    assert default_need(statuses) == 1
    start = start_devices(statuses, 2, 1)
    assert start.count == 1 and start.note == "starting with 1 of 2 devices (--min-need 1)"


def test_too_few_refuses_with_the_cards_out_and_how_to_return_one() -> None:
    statuses = (
        *inventory(1),
        DeviceStatus(inventory(2)[1].device, HealthState.QUARANTINED, "bad card"),
    )
    start = start_devices(statuses, 2, None)
    assert start.count is None
    assert start.reason is not None
    assert start.reason.startswith("need 2 healthy device(s), 1 available")
    assert "GPU-0001 (quarantined: bad card)" in start.reason
    assert "trainguard devices release" in start.reason


def test_a_policy_that_does_not_wait_stops_where_another_would_wait() -> None:
    # 2 devices, one already quarantined, the other now fails: none left, one may return.
    devices = inventory(2, {0: HealthState.QUARANTINED})
    attr = attribution(IncidentKind.XID, Domain.HARDWARE, Culprit(device_uuid="GPU-0001"))
    waits = decide(snapshot(devices=devices, assigned=("GPU-0001",), attribution=attr,
                            policy=RecoveryPolicy(need=1)))  # fmt: skip
    assert isinstance(waits.actions[-1], WaitForCapacity)
    stops = decide(snapshot(devices=devices, assigned=("GPU-0001",), attribution=attr,
                            policy=RecoveryPolicy(need=1, wait_for_capacity=False)))  # fmt: skip
    assert [type(a) for a in stops.actions] == [Quarantine, Stop]
    stop = stops.actions[-1]
    assert isinstance(stop, Stop)
    assert stop.reason.startswith("need 1 healthy device(s), only 0 available")
    assert stop.advice is not None and "trainguard devices release" in stop.advice


def test_wait_for_capacity_is_a_policy_field() -> None:
    doc = load_policy_text("name: p\nwait_for_capacity: false\n")
    assert doc.wait_for_capacity is False
    assert parse_policy(doc.to_json()) == doc
    assert resolve(doc, need=2).wait_for_capacity is False
    assert resolve(load_policy_text("name: q"), need=2).wait_for_capacity is True
    with pytest.raises(ValueError, match="wait_for_capacity"):
        load_policy_text("name: p\nwait_for_capacity: 1\n")


def test_the_no_progress_hint_names_the_ways_to_report_progress() -> None:
    for pattern in (None, r"it (\d+)"):
        hint = no_progress_hint(pattern)
        for name in ("--progress-pattern", "report_progress", "trainguard.integrations"):
            assert name in hint
