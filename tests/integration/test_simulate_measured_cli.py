"""``trainguard simulate --measured``: the committed benchmark results in the CLI and on Llama 3.

The usage errors call ``cli.main`` in this process (tests/integration/_cli_inproc.py: the
message and exit status are the point, not a fresh interpreter per case); the report
cases run as a real process."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from _cli_inproc import run_main

from trainguard._commands.run import register
from trainguard.simulate import load_scenario, simulate
from trainguard.simulate.analytic import advised_interval
from trainguard.simulate.measured import load_measured
from trainguard.simulate.scenario import with_overrides

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
RECOVERY = RESULTS / "recovery_latency.json"  # the reference: this code's defaults
SNAPSHOT = RESULTS / "snapshot_stall.json"
LOST = RESULTS / "lost_steps.json"


def tg(*args: str, real_process: bool = True) -> subprocess.CompletedProcess[str]:
    if not real_process:
        return run_main(["simulate", *args])
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
        out = tg("--scenario", "small", *args, real_process=False)
        assert out.returncode == 2, (args, out.stderr)
        assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "Traceback" not in out.stderr


def test_the_reference_is_measured_with_this_codes_defaults() -> None:
    # The reference file must describe what `trainguard run` does by default: a run
    # label naming warm workers (0310), on by default, and no option turning them off.
    data = json.loads(RECOVERY.read_text())
    assert "warm workers" in data["label"] and "--no-warm-workers" not in data["run_args"]
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["run", "--", "true"])
    assert args.warm_standby and args.warm_workers


def test_llama3_with_the_committed_measured_figures() -> None:
    # Six days of the calibrated scenario keep this fast; trainguard only.
    base = with_overrides(load_scenario("llama3"), duration_days=6, policies=("trainguard",))
    disk = load_measured([RECOVERY, LOST])
    memory = load_measured([RECOVERY, LOST, SNAPSHOT], memory_snapshots=True)
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
    # Same trace: crash/XID/hang restarts cost what the file says (seconds) instead of
    # the scenario's assumed restart + restore; stragglers and silent corruption (a few
    # per cent of the restarts) keep the assumed figure, hence the margin.
    spec = base.jobs[0]
    assert max(disk.restart_seconds.values()) * 10 < spec.restart_seconds + spec.restore_seconds
    per_restart = {k: j.lost_hours["restart"] * 3600 / max(1, j.restarts) for k, j in runs.items()}
    assert per_restart["disk"] < per_restart["assumed"] / 3
    assert runs["disk"].ettr > runs["assumed"].ettr
    # Memory snapshots restore crash/XID/hang: less rework, and ETTR at least disk-only's.
    assert runs["memory"].lost_hours["rework"] < runs["disk"].lost_hours["rework"]
    assert runs["memory"].ettr >= runs["disk"].ettr
    # A node loss restored from the disk in lost_steps.json: the disk interval is set for
    # it too, so it is longer than disk-only's (fewer failures roll back to disk) but
    # shorter than if a snapshot covered node losses as well.
    covered = load_measured([RECOVERY, SNAPSHOT], memory_snapshots=True)
    assert not memory.restores_from_memory("crash", node_down=True)
    assert covered.restores_from_memory("crash", node_down=True)
    assert (
        runs["disk"].interval_minutes
        < runs["memory"].interval_minutes
        < advised_interval(with_overrides(base, measured=covered), spec) / 60
    )
