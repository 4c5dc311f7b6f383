"""The serve reconciler and training health (decisions 0520, 0521): a Trainer's
``{'loss': nan, 'grad_norm': nan, ...}`` line in a running job's output, or a NaN loss
in a progress report, fails the attempt; the restart restores the newest checkpoint
from before the event and the suspect ones are moved aside. Real stand-in cluster,
real job, SQLite."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _fleet import Fleet

from trainguard.controller.checkpoint_care import REJECTED_DIR

pytestmark = pytest.mark.slow


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(str(tmp_path / "state.db"), tmp_path)
    yield f
    f.close()


def _suspects(root: Path) -> list[int]:
    notes = (root / REJECTED_DIR).glob("*.trainguard-note.json")
    out = []
    for note in notes:
        data = json.loads(note.read_text())
        assert data["reason"].startswith("suspect"), data
        out.append(int(data["step"]))
    return sorted(out)


def test_a_nan_in_a_trainer_log_line_rolls_back_before_it(fleet: Fleet) -> None:
    # The NaN line comes after step 10 is saved: checkpoint 10 is suspect, 5 restored.
    fj = fleet.submit("--every", "5", "--nan-log-attempts", "0", "--nan-log-at", "10")
    root = Path(str(fleet.store.jobs.get_job(fj.job_id).checkpoint_dir))
    fleet.run_until(lambda: fleet.incident_state(fj.job_id) == "recovered")
    (inc,) = fleet.store.incidents.list_incidents(job_id=fj.job_id)
    assert inc.signature == "nan_loss:grad_norm@step:10", inc  # both NaN: the norm first
    assert inc.checkpoint_step == 5 and inc.checkpoint_path == str(root / "step_00000005")
    assert 10 in _suspects(root)
    assert not [a for a in fleet.cp.fleet.ledger.list_actions(inc.id) if a.type == "quarantine"]
    assert any("newest from before step 10" in r for r in (inc.plan or {}).get("reasons", []))


def test_a_nan_loss_report_rolls_back_before_its_step(fleet: Fleet) -> None:
    fj = fleet.submit("--every", "5")
    root = Path(str(fleet.store.jobs.get_job(fj.job_id).checkpoint_dir))
    deadline = time.monotonic() + 30
    while not (root / "step_00000015").exists():
        assert time.monotonic() < deadline
        fleet.cp.run_once()
        time.sleep(0.05)
    # The job's own report of step 13: its loss went NaN (as report_progress sends it;
    # no rank named, so the restart is not expected to report per rank).
    for step in range(1, 13):
        fleet.cp.ingest_progress(fj.job_id, 0, step, loss=1.0)
    fleet.cp.ingest_progress(fj.job_id, 0, 13, loss=float("nan"))
    fleet.run_until(lambda: fleet.incident_state(fj.job_id) == "recovered")
    (inc,) = fleet.store.incidents.list_incidents(job_id=fj.job_id)
    assert inc.signature == "nan_loss:loss@step:13"
    assert inc.checkpoint_step == 10
    assert 15 in _suspects(root)
