"""``trainguard run -- python multigpu_spawn.py``: the ranks of an ``mp.spawn`` job.

The PyTorch tutorial's ``mp.spawn`` DDP script (tests/jobs/frameworks/multigpu_spawn.py,
real torch, gloo, 2 ranks) runs under a real ``trainguard run``; one rank SIGKILLs
itself once. Its children carry no ``RANK``/``LOCAL_RANK``: the rank watcher numbers
them in the order the script started them (decision 0280), so the death is seen
through the rank's own pidfd and blamed on that rank and its device — not read later
from the script's exit, with no rank.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard.model.records import parse_iso_utc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

JOB = Path(__file__).resolve().parents[1] / "jobs" / "frameworks" / "multigpu_spawn.py"
KERNEL = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(
    KERNEL < (6, 15), reason="mp.spawn reaps at once: the status needs PIDFD_GET_INFO (6.15)"
)
@pytest.mark.parametrize("killed", [0, 1])
def test_a_killed_spawn_rank_is_found_through_its_pidfd_and_blamed_on_its_rank(
    tmp_path: Path, killed: int
) -> None:
    state, mark = tmp_path / "state.db", tmp_path / "killed"
    env = {
        "MASTER_PORT": str(_free_port()),
        "BATCH_SLEEP": "0.01",
        "CHECKPOINT_PATH": str(tmp_path / "checkpoint.pt"),
        "TG_TEST_KILL_RANK": str(killed),
        "TG_TEST_KILL_EPOCH": "1",
        "TG_TEST_KILL_MARK": str(mark),
    }
    env = dict(os.environ, **env)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    run = subprocess.run(
        [
            sys.executable, "-m", "trainguard.cli", "run", "--state", str(state),
            "--kernel-log", str(tmp_path / "kern.log"), "--devices", "4", "--need", "2",
            "--checkpoint-dir", str(tmp_path), "--startup-timeout", "240",
            "--hang-timeout", "240", "--grace", "3", "--backoff", "0.2",
            "--", sys.executable, str(JOB), "3", "1", "--world_size", "2",
        ],
        capture_output=True, text=True, timeout=560, cwd=tmp_path, env=env, check=False,
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    pid, killed_at = mark.read_text().split()
    incidents = json.loads(
        subprocess.run(
            [sys.executable, "-m", "trainguard.cli", "incidents", "--state", str(state), "--json"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout
    )  # fmt: skip
    [inc] = incidents
    # The rank's own exit, status included (read through the pidfd once mp.spawn's join
    # has reaped it), not the script's ProcessExitedException summary that follows: the
    # engine's audit line of the incident it opened.
    said = f"detected crash (unknown): rank {killed} (pid {pid}) killed by SIGKILL"
    assert said in out, out[-4000:]
    assert inc["kind"] == "crash" and inc["outcome"] == "recovered", inc
    assert inc["culprit"]["rank"] == killed, inc
    assert inc["culprit"]["device_uuid"] == inc["actions"][0]["devices"][killed], inc
    # Seen through the rank's own pidfd: well under a second on an idle machine; the
    # bound only rules out a fallback timeout on a loaded one.
    assert parse_iso_utc(inc["detected_at"]) - float(killed_at) < 10.0, inc
