"""Long work shows a progress bar on a terminal and nothing extra on a pipe or with --json.

Real processes: under a pseudo-terminal (the ``pty`` module; rich sees a terminal) a
bar is drawn on stderr for ``simulate``, ``checkpoints --verify full`` on a large
checkpoint, ``preflight`` and ``validate``; on pipes, and with ``--json`` on the
terminal, none of it appears.

The pipe case calls ``cli.main`` in this process with stdout and stderr captured as
pipes would be (tests/integration/_cli_inproc.py: not terminals): what is drawn depends
on the streams, not on the process, and each fresh interpreter imported torch again
for ``preflight`` and ``validate``. Both terminal cases stay real processes.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from _cli_inproc import run_main
from _pty import cli_on_pty

from trainguard.model.health import HealthState
from trainguard.signals.inventory import simulated
from trainguard.store import Store

# rich's live display hides the cursor while the bar is drawn (tables never do); the
# bar's own text names the work.
LIVE = "\x1b[?25l"
LABELS = {
    "simulate": "simulating trial",
    "checkpoints": "verifying ",
    "preflight": "preflight checks (quick)",
    "validate": "validating GPU-",
}
QUICK = ("--level", "quick", "--skip", "compute", "--skip", "memory", "--skip", "dcgm")


def on_pipes(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_main(args, cwd=cwd, env={"TRAINGUARD_NO_PROGRESS": None})


def assert_no_progress(text: str, name: str) -> None:
    assert LIVE not in text and LABELS[name] not in text, text


@pytest.fixture
def commands(tmp_path: Path) -> dict[str, Callable[[], tuple[str, ...]]]:
    """Each command's argv; ``validate`` gets a freshly quarantined device each time."""
    big = tmp_path / "ck"
    big.mkdir()
    with open(big / "model.pt", "wb") as fh:  # 80 MiB, sparse: nothing written to disk
        fh.truncate(80 << 20)
    runs = iter(range(100))

    def validate() -> tuple[str, ...]:
        db = tmp_path / f"state-{next(runs)}.db"
        devs = simulated(2)
        with Store.open(db) as store:
            store.devices.register_devices(devs, at=time.time() - 60)
            store.devices.transition_device(
                devs[1].uuid, HealthState.QUARANTINED, "XID 79", "t", time.time()
            )
        return ("validate", "1", "--state", str(db), "--accept-partial", *QUICK)

    return {
        "simulate": lambda: ("simulate", "--scenario", "small", "--trials", "2"),
        "checkpoints": lambda: ("checkpoints", str(big), "--verify", "full"),
        "preflight": lambda: ("preflight", "--devices", "1", *QUICK),
        "validate": validate,
    }


@pytest.mark.parametrize(
    "name",
    [
        "simulate",
        "checkpoints",
        # torch start-up three times over: about 15 s each on two shared cores.
        pytest.param("preflight", marks=pytest.mark.slow),
        pytest.param("validate", marks=pytest.mark.slow),
    ],
)
def test_a_bar_on_a_terminal_nothing_on_a_pipe_or_with_json(
    name: str, commands: dict[str, Callable[[], tuple[str, ...]]], tmp_path: Path
) -> None:
    piped = on_pipes(*commands[name](), cwd=tmp_path)
    assert "Traceback" not in piped.stderr, piped.stderr
    assert_no_progress(piped.stdout + piped.stderr, name)
    _code, shown = cli_on_pty(*commands[name](), cwd=tmp_path)
    assert LIVE in shown and LABELS[name] in shown and "━" in shown, shown
    assert "Traceback" not in shown, shown
    _code, as_json = cli_on_pty(*commands[name](), "--json", cwd=tmp_path)
    assert '"' in as_json, as_json  # it printed its JSON
    assert_no_progress(as_json, name)
