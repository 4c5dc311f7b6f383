"""A job that reports its own steps (trainguard.train) is not read off its output (0397).

The stand-in cluster runs a real job that prints ``step=N``; once the job has reported a
step through the control plane (what run's progress datagrams and serve's progress
endpoint do), the steps its output names are not its progress any more: a line such as
``injecting hang at step 8`` must not move the attempt past the step it really made.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from _fleet import Fleet

pytestmark = pytest.mark.slow


def test_reported_steps_outrank_the_steps_printed_in_the_output(fleet: Fleet) -> None:
    fj = fleet.submit("--interval", "0.05", ckpt=False)
    # Read off the output while the job reports nothing itself.
    fleet.run_until(lambda: (fleet.store.jobs.get_attempt(fj.job_id, 0).last_step or 0) >= 3)
    reported = fleet.store.jobs.get_attempt(fj.job_id, 0).last_step
    assert reported is not None
    fleet.cp.ingest_progress(fj.job_id, 0, reported)
    # The job prints many more steps; none of them is its progress now.
    path = fleet.observed(fj).output_path
    assert path is not None
    deadline = time.monotonic() + 10
    while f"step={reported + 5}\n" not in Path(path).read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    for _ in range(3):
        fleet.cp.run_once()
    assert fleet.store.jobs.get_attempt(fj.job_id, 0).last_step == reported
    # Its next report is.
    fleet.cp.ingest_progress(fj.job_id, 0, reported + 1)
    fleet.cp.run_once()
    assert fleet.store.jobs.get_attempt(fj.job_id, 0).last_step == reported + 1
