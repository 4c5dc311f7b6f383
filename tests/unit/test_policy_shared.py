"""The pure policy pieces `trainguard run` and the cluster reconciler share (0130):
hang detection from the policy, where a hardware finding goes, the breaker verdict,
the restart budget, and what the evidence isolates."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainguard.model.devices import Device
from trainguard.model.findings import Attribution, Culprit, Domain, Finding, IncidentKind, Severity
from trainguard.model.health import HealthState
from trainguard.model.plan import (
    DeviceStatus,
    Mode,
    Quarantine,
    RecoveryPolicy,
    RecoverySnapshot,
)
from trainguard.policy import decide
from trainguard.policy.breaker import BreakerConfig, quarantine_verdict
from trainguard.policy.budget import BudgetEntry, budget_refills, restarts_used
from trainguard.policy.decide import evidence_resources
from trainguard.policy.evidence import Route, route_finding
from trainguard.policy.hang import hang_config, hang_detector

# --- hang ---------------------------------------------------------------------------


def test_the_default_policy_detects_hangs_adaptively() -> None:
    cfg = hang_config(RecoveryPolicy())
    assert cfg.hang_timeout_seconds is None
    assert (cfg.hang_floor_seconds, cfg.hang_multiple, cfg.hang_startup_seconds) == (
        60.0,
        10.0,
        600.0,
    )
    det = hang_detector(RecoveryPolicy(hang_floor_seconds=2.0, hang_multiple=4.0), 0.0)
    for i in range(5):  # a step every second
        det.observe(i, float(i))
    assert det.timeout() == 4.0  # 4 x the slowest interval beats the 2 s floor
    assert det.check(7.9) is None
    found = det.check(8.1)
    assert found is not None and found.kind == "hang" and "last step 4" in found.message


def test_a_configured_timeout_is_fixed_after_start_up() -> None:
    policy = RecoveryPolicy(hang_timeout_seconds=5.0, hang_startup_seconds=30.0)
    det = hang_detector(policy, 100.0)
    assert det.timeout() == 30.0  # start-up: no two progress points yet
    det.observe(1, 101.0)
    det.observe(2, 101.5)
    assert det.timeout() == 5.0
    assert det.check(106.4) is None and det.check(106.6) is not None


def test_no_progress_at_all_is_a_hang_after_the_start_up_allowance() -> None:
    det = hang_detector(RecoveryPolicy(hang_startup_seconds=10.0), 50.0)
    assert det.check(59.9) is None
    found = det.check(60.1)
    assert found is not None and "of the start" in found.message


# --- where a finding goes -----------------------------------------------------------


def _finding(domain: Domain, severity: Severity, **culprit: str) -> Finding:
    return Finding(
        kind="xid" if domain is Domain.HARDWARE else "node_down",
        domain=domain,
        at=1.0,
        source="kernel",
        message="m",
        severity=severity,
        culprit=Culprit(**culprit),
    )


@pytest.mark.parametrize(
    ("finding", "device_uuid", "expected"),
    [
        (_finding(Domain.HARDWARE, Severity.FATAL, device_uuid="g0"), None, Route.RECOVER),
        # Resolved by the store from a PCI bus id: the resolution counts.
        (_finding(Domain.HARDWARE, Severity.FATAL, pci_bus_id="0000:01:00.0"), "g0", Route.RECOVER),
        (_finding(Domain.HARDWARE, Severity.WARNING, device_uuid="g0"), None, Route.EVIDENCE),
        (_finding(Domain.HARDWARE, Severity.FATAL, device_uuid="g9"), None, Route.QUARANTINE_IDLE),
        (_finding(Domain.HARDWARE, Severity.ERROR, device_uuid="g9"), None, Route.OBSERVE),
        (_finding(Domain.NODE, Severity.FATAL, host="h1"), None, Route.RECOVER),
        (_finding(Domain.NODE, Severity.FATAL, host="h2"), None, Route.OBSERVE),
        (_finding(Domain.NODE, Severity.ERROR, host="h1"), None, Route.OBSERVE),
        (_finding(Domain.HARDWARE, Severity.FATAL), None, Route.OBSERVE),  # names no card
    ],
)
def test_where_a_finding_goes(finding: Finding, device_uuid: str | None, expected: Route) -> None:
    route = route_finding(
        finding, attempt_devices={"g0", "g1"}, attempt_hosts={"h1"}, device_uuid=device_uuid
    )
    assert route is expected


# --- breaker --------------------------------------------------------------------------


configs = st.builds(
    BreakerConfig,
    max_share=st.floats(0.01, 1.0),
    window_seconds=st.floats(1.0, 1e5),
    min_population=st.integers(0, 10),
)


@given(configs, st.integers(0, 500), st.integers(0, 500))
def test_an_allowed_quarantine_never_exceeds_the_share(
    config: BreakerConfig, population: int, recent: int
) -> None:
    verdict = quarantine_verdict(
        config, resource_kind="device", population=population, recent=recent
    )
    if population >= config.min_population and population > 0:
        assert verdict.allow == ((recent + 1) / population <= config.max_share)
        assert verdict.tripped_now == (not verdict.allow)
    else:
        assert verdict.allow  # too few resources for the share rule


@given(configs, st.integers(0, 500), st.integers(0, 500))
def test_an_open_breaker_allows_nothing(
    config: BreakerConfig, population: int, recent: int
) -> None:
    verdict = quarantine_verdict(
        config, resource_kind="node", population=population, recent=recent, open_reason="x"
    )
    assert not verdict.allow and not verdict.tripped_now and "reset" in (verdict.reason or "")


# --- restart budget -------------------------------------------------------------------

entries = st.lists(
    st.builds(
        BudgetEntry,
        failed_step=st.none() | st.integers(0, 1000),
        restarts=st.integers(0, 5),
        recovered=st.booleans(),
    ),
    min_size=1,
    max_size=8,
)


def test_a_job_that_verifies_and_fails_at_the_same_step_again_uses_up_its_budget() -> None:
    # Each incident recovered, then the job failed at step 100 again: no refill, so
    # decide() stops it at max_restarts instead of restarting it for ever there.
    history = [BudgetEntry(100, 1, recovered=True)] * 3 + [BudgetEntry(100, 0, False)]
    assert restarts_used(history) == 3
    # Getting further after a verified recovery refills the budget.
    assert restarts_used([BudgetEntry(100, 2, True), BudgetEntry(150, 0, False)]) == 0
    # A recovery that never verified does not.
    assert restarts_used([BudgetEntry(100, 2, False), BudgetEntry(150, 1, False)]) == 3


@given(entries)
def test_the_budget_counts_restarts_since_the_last_refill(history: list[BudgetEntry]) -> None:
    used = restarts_used(history)
    assert 0 <= used <= sum(e.restarts for e in history)
    assert used >= history[-1].restarts  # the current incident's own restarts always count
    refills = [
        i
        for i in range(1, len(history))
        if budget_refills(
            recovered=history[i - 1].recovered,
            previous_failed_step=history[i - 1].failed_step,
            failed_step=history[i].failed_step,
        )
    ]
    start = refills[-1] if refills else 0
    assert used == sum(e.restarts for e in history[start:])


# --- isolation targets: one definition for decide() and the snapshot builder ---------

_DEVICES = tuple(
    Device(index=i, uuid=f"GPU-{i}", pci_bus_id=f"0000:{0x10 + i:02x}:00.0", host=f"h{i // 2}")
    for i in range(8)
)
culprits = st.builds(
    Culprit,
    device_uuid=st.none() | st.sampled_from([d.uuid for d in _DEVICES] + ["GPU-elsewhere"]),
    pci_bus_id=st.none() | st.sampled_from([d.pci_bus_id[:-2] for d in _DEVICES]),
    host=st.none() | st.sampled_from(["h0", "h1", "h2", "h3", "far"]),
)
evidence = st.builds(
    Finding,
    kind=st.sampled_from(["xid", "node_down", "network_error", "crash"]),
    domain=st.sampled_from([Domain.HARDWARE, Domain.NODE, Domain.NETWORK, Domain.UNKNOWN]),
    at=st.just(1.0),
    source=st.just("kernel"),
    message=st.just("m"),
    culprit=culprits,
)


@given(
    st.sampled_from([Domain.HARDWARE, Domain.NODE, Domain.UNKNOWN]),
    culprits,
    st.lists(evidence, max_size=4),
)
def test_the_snapshot_builder_and_decide_agree_on_what_the_evidence_isolates(
    domain: Domain, culprit: Culprit, findings: list[Finding]
) -> None:
    attribution = Attribution(
        kind=IncidentKind.CRASH,
        domain=domain,
        culprit=culprit,
        confidence=0.9,
        summary="s",
        findings=tuple(findings),
    )
    named_devices, named_hosts = evidence_resources(attribution, _DEVICES)
    plan = decide(
        RecoverySnapshot(
            now=2.0,
            job_id="j",
            attempt=0,
            restarts_used=0,
            policy=RecoveryPolicy(need=1),
            mode=Mode.ACT,
            attribution=attribution,
            devices=tuple(DeviceStatus(d, HealthState.HEALTHY) for d in _DEVICES),
            assigned=tuple(d.uuid for d in _DEVICES),
            checkpoints=(),
        )
    )
    quarantined = [a for a in plan.actions if isinstance(a, Quarantine)]
    assert {a.resource_id for a in quarantined if a.resource_kind == "device"} == named_devices
    assert {a.resource_id for a in quarantined if a.resource_kind == "node"} == named_hosts
