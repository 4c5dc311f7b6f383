"""``trainguard simulate --measured``: the committed benchmark results in the CLI and on Llama 3."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from trainguard.simulate import load_scenario, simulate
from trainguard.simulate.measured import load_measured
from trainguard.simulate.scenario import with_overrides

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
RECOVERY = RESULTS / "recovery_latency.json"
SNAPSHOT = RESULTS / "snapshot_stall.json"


def tg(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "simulate", *args],
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_cli_reports_which_figure_came_from_which_file() -> None:
    out = tg("--scenario", "small", "--policy", "trainguard", "--measured", str(RECOVERY))
    assert out.returncode == 0, out.stderr
    restart = json.loads(RECOVERY.read_text())["kinds"]["crash"]["restart_s"]
    assert "measured figures (disk only" in out.stdout
    assert f"crash: restart incl. restore (s)\t{restart:.3g}\trecovery_latency.json" in out.stdout
    data = tg(
        "--scenario", "small", "--policy", "trainguard", "--json", "--memory-snapshots",
        "--measured", str(RECOVERY), "--measured", str(SNAPSHOT),
    )  # fmt: skip
    assert data.returncode == 0, data.stderr
    measured = json.loads(data.stdout)["scenario"]["measured"]
    assert measured["memory_snapshots"] is True
    assert {f["source"] for f in measured["figures"]} == {RECOVERY.name, SNAPSHOT.name}


def test_cli_bad_measured_input_is_one_line_exit_2(tmp_path: Path) -> None:
    garbled = tmp_path / "garbled.json"
    garbled.write_text('{"schema": "trainguard.recovery_latency/1", "kinds": {"crash": {}}}')
    cases = [
        (["--measured", str(tmp_path / "absent.json")], "cannot read"),
        (["--measured", str(garbled)], "missing field 'kinds.crash.detection_s'"),
        (["--measured", str(SNAPSHOT)], "needs a recovery_latency result"),
        (["--measured", str(RECOVERY), "--memory-snapshots"], "needs a snapshot_stall result"),
        (["--memory-snapshots"], "--memory-snapshots needs --measured"),
    ]
    for args, message in cases:
        out = tg("--scenario", "small", *args)
        assert out.returncode == 2, (args, out.stderr)
        assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "Traceback" not in out.stderr


def test_llama3_with_the_committed_measured_figures() -> None:
    # Six days of the calibrated scenario keep this fast; trainguard only.
    base = with_overrides(load_scenario("llama3"), duration_days=6, policies=("trainguard",))
    disk = load_measured([RECOVERY])
    memory = load_measured([RECOVERY, SNAPSHOT], memory_snapshots=True)
    runs = {
        name: simulate(sc, trials=1).runs["trainguard"][0].jobs[0]
        for name, sc in (
            ("assumed", base),
            ("disk", with_overrides(base, measured=disk)),
            ("memory", with_overrides(base, measured=memory)),
        )
    }
    for job in runs.values():
        assert abs(job.unaccounted_hours) < 1e-6
    # Same trace: the measured ~30 s restarts replace the assumed 240 + 60 s.
    per_restart = {k: j.lost_hours["restart"] * 3600 / max(1, j.restarts) for k, j in runs.items()}
    assert per_restart["disk"] < per_restart["assumed"] / 3
    assert runs["disk"].ettr > runs["assumed"].ettr
    # Memory snapshots: crash/XID/hang restore the newest snapshot (less rework), so disk
    # checkpoints are set for the other failures only and come far less often.
    assert runs["memory"].lost_hours["rework"] < runs["disk"].lost_hours["rework"] * 0.75
    assert runs["memory"].interval_minutes > 3 * runs["disk"].interval_minutes
    assert runs["memory"].lost_hours["checkpoint"] < runs["disk"].lost_hours["checkpoint"]
    assert runs["memory"].ettr > runs["disk"].ettr
