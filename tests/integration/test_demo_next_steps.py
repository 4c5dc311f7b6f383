"""After the demo, a user following the README sees what the demo recorded (issue 14, item 7).

The demo keeps its state in its own database, so ``trainguard incidents`` alone shows
nothing. The demo ends by printing the commands with ``--state``; the README shows the
same commands. Here: the printed commands are the README's, and run from the
directory ``make demo`` runs in, against a database where the demo puts it, each one
shows the recorded incident.
"""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from trainguard.model import Attribution, Culprit, Domain, IncidentKind
from trainguard.signals.inventory import simulated
from trainguard.store import Store

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_764_400_000.0


def _demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trainguard_demo", ROOT / "examples/demo.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DEMO = _demo()


def test_the_readme_shows_the_commands_the_demo_prints() -> None:
    readme = (ROOT / "README.md").read_text()
    default_state = ROOT / "demo-run" / "recovery" / "state.db"  # demo.py's --dir default
    commands = DEMO.next_commands(default_state, ROOT, exe="trainguard")
    assert len(commands) == 4
    for command in commands:
        assert "--state demo-run/recovery/state.db" in command
        assert command in readme, f"README does not show: {command}"


def test_without_trainguard_on_path_the_commands_name_its_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    [first, *_] = DEMO.next_commands(Path("/elsewhere/state.db"), ROOT)
    exe = shlex.split(first)[0]
    assert exe.endswith("trainguard") and "/" in exe
    assert "--state /elsewhere/state.db" in first  # outside the directory: absolute


def test_the_printed_commands_show_the_demo_results(tmp_path: Path) -> None:
    state = tmp_path / "demo-run" / "recovery" / "state.db"
    state.parent.mkdir(parents=True)
    devs = simulated(2)
    with Store.open(state) as s:
        s.devices.register_devices(devs, at=T0)
        s.jobs.create_job(name="demo", command=["torchrun"], need=1, at=T0, job_id="j1")
        s.jobs.start_attempt("j1", 0, devs[:1], at=T0)
        s.incidents.open_incident(
            "j1",
            0,
            Attribution(
                kind=IncidentKind.XID,
                domain=Domain.HARDWARE,
                culprit=Culprit(device_uuid=devs[0].uuid, rank=0),
                confidence=0.9,
                summary="XID 79 on rank 0's device",
                evidence=("NVRM: Xid (PCI:0000:10:00): 79, GPU has fallen off the bus.",),
            ),
            detected_at=T0 + 1,
        )
    for command in DEMO.next_commands(state, tmp_path, exe="trainguard"):
        argv = shlex.split(command)[1:]
        proc = subprocess.run(
            [sys.executable, "-m", "trainguard.cli", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, (command, proc.stderr)
        assert "no state database" not in proc.stdout, command
        assert "xid" in proc.stdout.lower() or devs[0].uuid in proc.stdout, (command, proc.stdout)
