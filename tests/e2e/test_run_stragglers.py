"""``trainguard run`` and a slow rank: a real torchrun job (gloo, 4 ranks) whose rank on
one card works 30 % slower is named with its card within a minute, and the cost model's
restart takes the card out; healthy controls (evaluation phases, checkpoint saves with a
stalling file system, a slow data loader on every rank) give no finding at all."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
from _run_e2e import RunCase

from trainguard.store import Store
from trainguard.store.fleet import FleetStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

JOB = Path(__file__).resolve().parent.parent / "jobs" / "slow_rank.py"
TORCHRUN_4 = [sys.executable, "-m", "torch.distributed.run", "--standalone",
              "--nproc-per-node", "4", str(JOB)]  # fmt: skip
RUN = ["--devices", "5", "--need", "4", "--min-need", "4"]
SLOW_KINDS = {"straggler", "throughput_drop"}


def slow_findings(case: RunCase) -> list[dict]:
    store = Store.open(str(case.state))
    try:
        rows = FleetStore(store).findings.findings_between(0.0, time.time() + 60)
    finally:
        store.close()
    return [r["finding"] for r in rows if r["finding"]["kind"] in SLOW_KINDS]


def test_a_card_30_percent_slower_is_named_within_a_minute_and_taken_out(
    case: RunCase,
) -> None:
    env = {
        "TG_SLOW_DEVICE": "2", "TG_SLOW_FACTOR": "1.3", "TG_SLOW_FROM_STEP": "60",
        "TG_SAVE_EVERY": "100",
    }  # fmt: skip
    case.start_command(
        [*TORCHRUN_4, "--steps", "40000", "--ckpt-dir", str(case.ckpt)], RUN, env=env
    )
    began = case.wait_output(r"slow from step=\d+ at=([\d.]+)", timeout=120)
    slow_at = float(began.group(1))
    m = case.wait_output(r"trainguard: straggler: rank (\d+) ", timeout=90)
    named_at = time.time()
    assert named_at - slow_at <= 60.0, (named_at - slow_at, case.output()[-3000:])
    [f] = [f for f in slow_findings(case) if f["kind"] == "straggler"]
    rank = int(m.group(1))
    assert f["culprit"]["rank"] == rank
    devices = case.devices()
    slow_uuid = next(u for u, d in devices.items() if d["index"] == 2)
    assert f["culprit"]["device_uuid"] == slow_uuid, f
    # 40,000 steps left at ~0.07 s: running on slowly costs more than a restart.
    assert f["details"]["decision"] == "restart_without", f
    assert f["details"]["expected_loss_s"] > f["details"]["restart_cost_s"], f
    # The engine's one path for a bad card: quarantined, restarted on the spare.
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        incidents = case.incidents()
        if incidents and incidents[0].get("recovery_attempt"):
            break
        time.sleep(0.5)
    [inc] = case.incidents()
    assert inc["culprit"]["device_uuid"] == slow_uuid, inc
    assert case.devices()[slow_uuid]["state"] == "quarantined"
    assert inc["kind"] == "slow", inc
    # The restart is on the spare, and the job is fast again (the slow card is out).
    case.wait_output(r"attempt 1 verifying -> verified", timeout=60)
    _, attempts = case.job()
    assert slow_uuid not in {d.uuid for d in attempts[-1].devices}


def test_evaluation_saves_and_a_slow_loader_give_no_finding(case: RunCase) -> None:
    env = {
        "TG_EVAL_EVERY": "120", "TG_EVAL_S": "3",
        "TG_SAVE_EVERY": "50", "TG_SAVE_STALL_S": "1.5",
        "TG_LOADER_S": "0.01", "TG_LOADER_STALL_EVERY": "7", "TG_LOADER_STALL_S": "0.4",
    }  # fmt: skip
    # ~70 s: the watch's warm-up and 30 s baseline, then evaluations (steps 240 and 360),
    # saves and loader stalls judged in four more 10 s windows.
    case.start_command([*TORCHRUN_4, "--steps", "420", "--ckpt-dir", str(case.ckpt)], RUN, env=env)
    assert case.finish(timeout=200) == 0, case.output()[-3000:]
    assert slow_findings(case) == []
    assert not re.search(r"trainguard: (straggler|throughput_drop)", case.output())
    [] = case.incidents()
