"""Log lines cannot drive the terminal: human output shows control characters, JSON stays exact.

A hostile (or merely broken) log line carries a window-title sequence, a screen
clear, a carriage return that overwrites the line with a fake one, a newline
that fakes a whole line, and rich markup. It reaches people through
``classify`` and ``diagnose`` (from the file) and ``incidents``, ``report`` and
``audit`` (from the state database, where an incident recorded it). Each runs
as a real process on a pipe and, for the tables, under a pseudo-terminal (rich).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import _pty
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainguard.model import Attribution, Culprit, Domain, IncidentKind
from trainguard.model.text import visible
from trainguard.signals.inventory import simulated
from trainguard.store import Store

T0 = 1_764_400_000.0
TITLE = "\x1b]0;owned\x07"
CLEAR = "\x1b[2J\x1b[H"
FAKE = "\rtrainguard: all GPUs healthy\ntrainguard: incident closed"
HOSTILE = f"{TITLE}{CLEAR}GPU has fallen off the bus [bold][/x]{FAKE}"
XID_LINE = f"NVRM: Xid (PCI:0000:11:00): 79, pid=42, name=python, {HOSTILE}"
RAW = ("\x1b", "\x07", "\r")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainguard.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TRAINGUARD_NO_CACHE": "1"},
    )


def cli_on_pty(*args: str) -> str:
    return _pty.cli_on_pty(*args)[1]


def assert_shown_not_obeyed(text: str) -> None:
    for ch in RAW:
        assert ch not in text, repr(text)
    assert "\\x1b]0;owned\\x07" in text and "\\x1b[2J" in text, text
    # The fake lines are not lines of their own.
    assert not any(ln.startswith("trainguard: all GPUs healthy") for ln in text.splitlines())


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("esc") / "state.db"
    devs = simulated(2)
    with Store.open(path) as s:
        s.devices.register_devices(devs, at=T0)
        s.jobs.create_job(name=f"job{TITLE}", command=["python"], need=1, at=T0, job_id="j1")
        s.jobs.start_attempt("j1", 0, devs[:1], at=T0)
        attribution = Attribution(
            kind=IncidentKind.XID,
            domain=Domain.HARDWARE,
            culprit=Culprit(device_uuid=devs[0].uuid, host=f"node{CLEAR}", rank=0),
            confidence=0.9,
            summary=f"XID 79: {HOSTILE}",
            evidence=(XID_LINE,),
        )
        s.incidents.open_incident("j1", 0, attribution, detected_at=T0 + 1)
    return str(path)


@pytest.fixture
def log(tmp_path: Path) -> str:
    path = tmp_path / "kern.log"
    path.write_text(f"boot ok\n{XID_LINE}\n")
    return str(path)


def test_classify_shows_escapes_and_json_keeps_the_text(log: str) -> None:
    proc = cli("classify", log)
    assert proc.returncode == 0, proc.stderr
    assert_shown_not_obeyed(proc.stdout)
    assert len(proc.stdout.splitlines()) == 1  # one finding, one line
    as_json = cli("classify", "--json", log)
    record = json.loads(as_json.stdout)
    assert TITLE in record["text"] and CLEAR in record["text"]  # exact, not escaped


def test_diagnose_shows_escapes(log: str) -> None:
    proc = cli("diagnose", log)
    assert proc.returncode == 0, proc.stderr
    assert_shown_not_obeyed(proc.stdout)
    as_json = json.loads(cli("diagnose", "--json", log).stdout)
    assert any(TITLE in e for e in as_json[0]["evidence"])


@pytest.mark.parametrize("argv", [("incidents",), ("report", "1"), ("audit",)], ids=lambda a: a[0])
def test_store_readers_show_escapes_on_a_pipe(state: str, argv: tuple[str, ...]) -> None:
    proc = cli(*argv, "--state", state)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout and "\r" not in proc.stdout
    assert "\\x1b" in proc.stdout, proc.stdout
    if argv[0] == "report":
        assert_shown_not_obeyed(proc.stdout)


@pytest.mark.parametrize("argv", [("incidents",), ("audit",)], ids=lambda a: a[0])
def test_tables_on_a_terminal_show_escapes_and_no_markup(state: str, argv: tuple[str, ...]) -> None:
    out = cli_on_pty(*argv, "--state", state)
    assert "Traceback" not in out, out
    assert "]0;owned" not in out.replace("\\x1b]0;owned", ""), out  # no live title sequence
    assert "\\x1b" in out and "\x07" not in out, out


def test_json_readers_stay_exact(state: str) -> None:
    incidents = json.loads(cli("incidents", "--json", "--state", state).stdout)
    assert incidents[0]["summary"] == f"XID 79: {HOSTILE}"
    report = json.loads(cli("report", "1", "--json", "--state", state).stdout)
    assert report["evidence"] == [XID_LINE]


UNSAFE = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x202E, 0x2066, 0xD800)]


@given(st.text(alphabet=st.sampled_from([*UNSAFE, "a", "é", "\\", " ", "█"])))
def test_visible_leaves_no_control_character(text: str) -> None:
    shown = visible(text)
    assert not any(ch in shown for ch in UNSAFE)
    shown.encode("utf-8")  # never a lone surrogate: printing cannot fail


@given(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp"))))
def test_visible_leaves_ordinary_text_alone(text: str) -> None:
    if not any(0x202A <= ord(c) <= 0x202E or 0x2066 <= ord(c) <= 0x2069 for c in text):
        assert visible(text) == text
