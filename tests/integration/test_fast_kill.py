"""The fast kill of a failed attempt (decision 0270), on real processes.

The launcher here behaves like a torchrun agent: it starts two ranks in sessions
of their own, and on SIGTERM it takes seconds to tear down (torchrun's agent
shutdown). ``LocalAttempt.kill`` must not wait for that: the launcher is frozen,
the ranks get SIGTERM and the grace, then the whole tree is SIGKILLed, and the
attempt's log says it was trainguard's own stop, and how long it took.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from trainguard.model.signature import STOP_MARKER
from trainguard.schedulers.local import LaunchSpec, LocalAttempt, LocalScheduler
from trainguard.signals.process import descendants

LAUNCHER = r"""
import os, signal, subprocess, sys, time
out = sys.argv[1]
def on_term(signum, frame):
    open(os.path.join(out, "agent-teardown"), "w").close()
    time.sleep(3.0)  # a torchrun agent's slow shutdown
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
ranks = [
    subprocess.Popen(
        [sys.executable, "-c", RANK, out, str(i)],
        env=dict(os.environ, LOCAL_RANK=str(i), RANK=str(i)),
        start_new_session=True,
    )
    for i in range(2)
]
print("step=1 loss=2.0", flush=True)
for r in ranks:
    r.wait()
"""

RANK = r"""
import os, signal, sys, time
out, rank = sys.argv[1], sys.argv[2]
if rank == "0":
    def on_term(signum, frame):  # a rank that snapshots on the way down
        open(os.path.join(out, "rank0-term"), "w").close()
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
else:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # hung in a collective: deaf to SIGTERM
open(os.path.join(out, f"rank{rank}-up"), "w").close()
time.sleep(600)
"""


def _launch(tmp_path: Path) -> tuple[LocalAttempt, Path]:
    log = tmp_path / "attempt-0.log"
    job = tmp_path / "launcher.py"
    job.write_text(f"RANK = {RANK!r}\n{LAUNCHER}")
    sched = LocalScheduler(sink=lambda ev: None, stdout=io.BytesIO(), stderr=io.BytesIO())
    att = sched.launch(
        LaunchSpec((sys.executable, str(job), str(tmp_path)), 0, (), None, str(log), job_id="fk")
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (
        (tmp_path / "rank0-up").exists() and (tmp_path / "rank1-up").exists()
    ):
        time.sleep(0.05)
    assert (tmp_path / "rank1-up").exists(), "the ranks did not start"
    return att, log


def test_kill_freezes_the_launcher_terms_the_ranks_then_kills_the_tree(tmp_path: Path) -> None:
    att, log = _launch(tmp_path)
    tree = [att.pid, *descendants(att.pid)]
    assert len(tree) >= 4  # reaper, launcher, two ranks
    code = att.kill(0.2)
    att.wait_closed(5.0)
    # The whole tree is gone, the deaf rank included, without the agent's teardown.
    for pid in tree:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), pid
    assert not (tmp_path / "agent-teardown").exists()
    assert (tmp_path / "rank0-term").exists()  # the ranks got their SIGTERM first
    assert code == -9
    text = log.read_text()
    marker = f"{STOP_MARKER} 0: SIGKILL to process group {att.pgid} after 0.2 s"
    assert marker in text
    m = re.search(r"^# trainguard: attempt 0 stopped in ([0-9.]+) s", text, re.M)
    assert m is not None, text
    took = float(m.group(1))
    assert att.stop_seconds is not None and took == round(att.stop_seconds, 3)
    # Well under the agent's 3 s teardown even on a loaded machine (0.2 s + signal delivery).
    assert took < 2.0


def test_a_killed_attempt_is_trainguards_own_stop_for_diagnose(tmp_path: Path) -> None:
    att, log = _launch(tmp_path)
    att.kill(0.0)
    att.wait_closed(5.0)
    assert not (tmp_path / "rank0-term").exists()  # grace 0: SIGKILL at once
    proc = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "diagnose", "--json", str(log)],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr  # 1 = no incident


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2 :].startswith(("Z", "X"))
