"""The "no progress signal" warning is said only when its premise holds and withdrawn
when a step disproves it (decision 0534): real job processes under the control plane
(tests/integration/_fleet.py), the store's audit and incidents read back."""

from __future__ import annotations

from pathlib import Path

import pytest
from _fleet import Fleet

from trainguard.controller.reconcile import ControlConfig
from trainguard.model.records import AuditKind
from trainguard.policy.verify import NO_STEP_SIGNAL_WARNING


def _notes(fleet: Fleet, job_id: str) -> list[dict[str, object]]:
    return [
        dict(e.data)
        for e in fleet.store.audit.list_audit(kind=AuditKind.NOTE, subject=f"job:{job_id}")
    ]


@pytest.fixture
def quick(store_target: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    # A start window short enough for a test: the rule, not its default, is under test.
    f = Fleet(store_target, tmp_path, config=ControlConfig(no_step_start_window=0.5))
    yield f
    f.close()


def test_a_warning_a_later_step_disproves_is_withdrawn(quick: Fleet) -> None:
    # Epoch lines (liveness, no step) for ~2.5 s, then steps: warned, then withdrawn;
    # the incident of a later crash carries no such warning.
    fj = quick.submit(
        "--no-steps", "--epoch-lines", "--steps-from", "50",
        "--fail-attempts", "0", "--fail-at", "80", "--every", "10",
    )  # fmt: skip
    quick.run_until(
        lambda: any(n.get("warning") == NO_STEP_SIGNAL_WARNING for n in _notes(quick, fj.job_id)),
        timeout=20,
    )
    quick.run_until(lambda: any("withdrawn" in n for n in _notes(quick, fj.job_id)), timeout=20)
    notes = _notes(quick, fj.job_id)
    assert {n["withdrawn"] for n in notes if "withdrawn" in n} == {
        n["warning"] for n in notes if "warning" in n
    }
    quick.run_until(lambda: quick.incident_state(fj.job_id) == "recovered", timeout=40)
    (inc,) = quick.store.incidents.list_incidents(job_id=fj.job_id)
    assert not any(w.startswith("no progress signal") for w in inc.warnings), inc.warnings
    # The note says what disproved it.
    (withdrawal,) = [n for n in _notes(quick, fj.job_id) if "withdrawn" in n]
    assert withdrawal["withdrawn"] == NO_STEP_SIGNAL_WARNING


def test_output_that_is_no_liveness_before_the_first_step_is_not_warned(quick: Fleet) -> None:
    # Lines that are no sign of training (a banner, "tick") for ~2 s before step 1:
    # never a missing progress signal, even past the start window.
    fj = quick.submit(
        "--no-steps", "--steps-from", "40", "--fail-attempts", "0", "--fail-at", "60",
        "--every", "10",
    )  # fmt: skip
    quick.run_until(lambda: quick.incident_state(fj.job_id) == "recovered", timeout=40)
    assert not any("warning" in n for n in _notes(quick, fj.job_id))
    (inc,) = quick.store.incidents.list_incidents(job_id=fj.job_id)
    assert not inc.warnings and inc.resumed_step is not None
