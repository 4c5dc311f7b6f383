"""``trainguard run`` with small plain-Python jobs (no torchrun): fast paths of the loop."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from trainguard.model import HealthState
from trainguard.signals.inventory import simulated
from trainguard.store import Store


def run(tmp: Path, job: str, *opts: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    script = tmp / "job.py"
    script.write_text(textwrap.dedent(job))
    return subprocess.run(
        [
            sys.executable, "-m", "trainguard.cli", "run", "--state", str(tmp / "state.db"),
            "--kernel-log", str(tmp / "kern.log"), "--startup-timeout", "30",
            *opts, "--", sys.executable, str(script),
        ],
        capture_output=True, text=True, timeout=timeout, cwd=tmp, check=False,
    )  # fmt: skip


def state(tmp: Path) -> tuple[object, list[object], list[object]]:
    with Store.open(tmp / "state.db") as store:
        [job] = store.jobs.list_jobs()
        return job, store.jobs.list_attempts(job.id), store.incidents.list_incidents(job_id=job.id)


def test_a_clean_job_completes_with_exit_0(tmp_path: Path) -> None:
    res = run(
        tmp_path,
        """
        import os
        for i in range(1, 4):
            print(f"step={i} loss=1.0")
        print("visible", os.environ["CUDA_VISIBLE_DEVICES"], os.environ["TRAINGUARD_ATTEMPT"])
        """,
        "--devices", "2", "--need", "1",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "visible 0 0" in res.stdout and "step=3 loss=1.0" in res.stdout
    job, attempts, incidents = state(tmp_path)
    assert job.state.value == "completed"  # type: ignore[attr-defined]
    assert [a.state.value for a in attempts] == ["completed"]  # type: ignore[attr-defined]
    assert attempts[0].last_step == 3 and incidents == []  # type: ignore[attr-defined]


def test_a_crash_without_checkpoints_restarts_from_the_beginning(tmp_path: Path) -> None:
    res = run(
        tmp_path,
        """
        import os, sys, time
        attempt = int(os.environ["TRAINGUARD_ATTEMPT"])
        print("resume from", os.environ.get("TRAINGUARD_RESUME_FROM"))
        for i in range(1, 6):
            print(f"step={i}", flush=True)
            time.sleep(0.05)
            if i == 3 and attempt == 0:
                sys.exit(7)
        """,
        "--devices", "2", "--need", "1", "--verify-window", "0.1",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    _job, attempts, [inc] = state(tmp_path)
    assert [a.exit_code for a in attempts] == [7, 0]  # type: ignore[attr-defined]
    assert inc.kind.value == "crash" and inc.outcome == "recovered"  # type: ignore[attr-defined]
    assert inc.failed_step == 3 and inc.lost_steps == 3  # type: ignore[attr-defined]
    assert "exited with code 7" in res.stderr
    assert res.stdout.count("resume from None") == 2


def test_too_few_healthy_devices_stops_before_starting(tmp_path: Path) -> None:
    with Store.open(tmp_path / "state.db") as store:
        devs = simulated(2)
        store.devices.register_devices(devs, at=1.0)
        store.devices.transition_device(
            devs[1].uuid, HealthState.QUARANTINED, "bad card", "test", 2.0
        )
    res = run(tmp_path, "print('should not run')", "--devices", "2", "--need", "2")
    assert res.returncode == 1
    assert "should not run" not in res.stdout
    assert "need 2 healthy device(s), 1 available" in res.stderr and "release" in res.stderr
    # --min-need lets it run on what is left, never on the quarantined card.
    res = run(
        tmp_path,
        "import os; print('visible', os.environ['CUDA_VISIBLE_DEVICES'])",
        "--devices", "2", "--need", "2", "--min-need", "1",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "visible 0" in res.stdout


def test_xid_leaving_too_few_devices_stops_with_a_clear_message(tmp_path: Path) -> None:
    kern = tmp_path / "kern.log"
    kern.write_text("")
    res = run(
        tmp_path,
        f"""
        import json, os, time
        dev = json.loads(os.environ["TRAINGUARD_DEVICES"])[1]
        print("step=1", flush=True)
        with open({str(kern)!r}, "a") as fh:
            fh.write("NVRM: Xid (PCI:" + dev["pci_bus_id"][:-2] + "): 79, pid=1, name=x, "
                     "GPU has fallen off the bus.\\n")
        time.sleep(30)
        """,
        "--devices", "2", "--need", "2", "--grace", "1",
    )  # fmt: skip
    assert res.returncode == 1
    assert "need 2 healthy device(s), only 1 available" in res.stderr
    job, _attempts, [inc] = state(tmp_path)
    assert job.state.value == "stopped"  # type: ignore[attr-defined]
    assert inc.kind.value == "xid" and inc.outcome == "stopped"  # type: ignore[attr-defined]
    assert [a["type"] for a in inc.actions] == ["quarantine", "stop"]  # type: ignore[attr-defined]
    with Store.open(tmp_path / "state.db") as store:
        assert store.devices.get_device(simulated(2)[1].uuid).state is HealthState.QUARANTINED


def test_usage_errors(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "run", "--state", str(tmp_path / "s.db")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert res.returncode == 2 and "no command" in res.stderr
    res = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "run", "--progress-pattern", "step=\\d+",
         "--", "true"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert res.returncode == 2 and "needs a group" in res.stderr


def test_observe_mode_on_a_failing_job_returns_its_exit_status(tmp_path: Path) -> None:
    res = run(
        tmp_path,
        "import sys; print('step=1'); sys.exit(5)",
        "--devices", "1", "--mode", "observe",
    )  # fmt: skip
    assert res.returncode == 5
    _, attempts, [inc] = state(tmp_path)
    assert len(attempts) == 1 and inc.outcome == "observed"  # type: ignore[attr-defined]
    assert inc.plan and inc.plan["mode"] == "observe"  # type: ignore[attr-defined]
    assert json.dumps(inc.plan)  # type: ignore[attr-defined]


def test_interrupt_stops_the_whole_tree_and_records_it(tmp_path: Path) -> None:
    import os
    import signal
    import time

    script = tmp_path / "job.py"
    pidfile = tmp_path / "child.pid"
    script.write_text(
        textwrap.dedent(
            f"""
            import subprocess, sys, time
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                     start_new_session=True)
            open({str(pidfile)!r}, "w").write(str(child.pid))
            print("step=1", flush=True)
            time.sleep(60)
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainguard.cli", "run", "--state", str(tmp_path / "state.db"),
         "--kernel-log", str(tmp_path / "k.log"), "--devices", "1", "--grace", "1",
         "--", sys.executable, str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child = int(pidfile.read_text())
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted by SIGINT" in err
    time.sleep(0.2)
    gone = not os.path.exists(f"/proc/{child}")
    if not gone:
        with open(f"/proc/{child}/stat") as fh:
            gone = fh.read().split(") ")[1].startswith("Z")
    assert gone, "a process of the job outlived trainguard"
    job, attempts, _ = state(tmp_path)
    assert job.state.value == "stopped"  # type: ignore[attr-defined]
    assert attempts[0].state.value == "stopped"  # type: ignore[attr-defined]
