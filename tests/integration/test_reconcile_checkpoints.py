"""The serve reconciler and checkpoints: a damaged newest one is moved out of the
job's way before the requeue (decision 0146), and the restart is verified by the
shared rule (policy/verify.py). Real stand-in cluster, real job, SQLite."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _fleet import Fleet

from trainguard.controller.checkpoint_care import REJECTED_DIR
from trainguard.controller.reconcile import ControlConfig

pytestmark = pytest.mark.slow


@pytest.fixture(params=[False, True], ids=["move-aside", "keep-in-place"])
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(
        str(tmp_path / "state.db"),
        tmp_path,
        config=ControlConfig(keep_rejected_in_place=request.param),
    )
    yield f
    f.close()


def test_a_damaged_newest_checkpoint_is_moved_aside_before_the_requeue(fleet: Fleet) -> None:
    fj = fleet.submit("--fail-attempts", "0", "--fail-at", "12", "--exit", "1")
    root = Path(str(fleet.store.jobs.get_job(fj.job_id).checkpoint_dir))
    deadline = time.monotonic() + 30
    while not (root / "step_00000010").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    state = root / "step_00000010" / "state.json"
    state.write_bytes(state.read_bytes().replace(b"10", b"99"))  # same size, wrong sha256
    fleet.run_until(lambda: fleet.incident_state(fj.job_id) == "recovered")

    (inc,) = fleet.store.incidents.list_incidents(job_id=fj.job_id)
    assert inc.checkpoint_step == 5 and inc.checkpoint_path == str(root / "step_00000005")
    # The last step the job printed before it failed, read before the incident opened.
    assert (inc.failed_step, inc.lost_steps) == (12, 7)
    assert inc.resumed_step is not None and 5 <= inc.resumed_step <= 55
    # Stock "step=N" lines carry no time of the job's: the rate was not compared (0300
    # compared pass read times and failed this restart), and the record says why (0320).
    verified = [t.what for t in inc.timeline if t.what.startswith("verified:")]
    assert len(verified) == 1 and "rate not checked" in verified[0], inc.timeline
    moved = root / REJECTED_DIR / "step_00000010"
    if fleet.cp.reconciler.config.keep_rejected_in_place:
        assert not moved.exists()
        return
    assert json.loads((moved / "state.json").read_text()) == {"step": 99}
    note = json.loads((root / REJECTED_DIR / "step_00000010.trainguard-note.json").read_text())
    assert note["path"] == str(root / "step_00000010") and note["by"] == "test-controller"
    audit = [
        a for a in fleet.store.audit.list_audit(job_id=fj.job_id) if "moved 1 of 1" in a.message
    ]
    assert audit and audit[0].data["moved"][0]["moved_to"] == str(moved)
