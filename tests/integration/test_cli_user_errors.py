"""Every sub-command meets bad arguments and bad input with one line, never a traceback.

The sub-commands and their options are enumerated from the real argparse parser
(``trainguard.cli.build_parser``), so a command or option added later is covered
without touching this file. Each command runs in an empty directory with:

* an unknown option, and a malformed number for every typed option (exit 2);
* every file-like argument (positionals, ``--state``, ``FILE``/``PATH``/``DIR``
  options) pointed at a binary file, at a path in a missing directory, and at a
  directory (exit 1 or 2).

Each run must end with exactly one line on stderr, starting ``trainguard``, with
no "Traceback" and not the last-resort "unexpected ..." message of ``cli.main``
(that is a safety net, not the way a user error is reported).

In every command family (``devices``, ``devices history``, ... are one) a command meets
the binary file as a real process (``python -m trainguard.cli``), so the entry point and
the family's exit are covered; the other cases (usage errors, the other paths, the other
commands of the family) call ``cli.main`` in this process (tests/integration/
_cli_inproc.py): the message and exit status are the same, without a fresh interpreter
per case (about 200 of them).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _cli_inproc import run_main

from trainguard.cli import build_parser

FILE_METAVARS = ("FILE", "PATH", "DIR", ".YAML", ".PNG", "DB")
FILE_DESTS = {"state", "database", "token_file", "from_state"}


def leaves(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if path and (not subs or parser._defaults.get("func")):
        yield path, parser  # a command (``devices`` runs itself and has sub-commands)
    for action in subs:
        for name, sub in action.choices.items():
            yield from leaves(sub, (*path, name))


LEAVES = dict(leaves(build_parser()))
COMMANDS = sorted(LEAVES)


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.dest != "help" and a.option_strings]


def _positionals(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction)
    ]


def _file_like(action: argparse.Action) -> bool:
    metavar = action.metavar if isinstance(action.metavar, str) else ""
    return action.dest in FILE_DESTS or any(m in metavar.upper() for m in FILE_METAVARS)


def _exclusive_losers(parser: argparse.ArgumentParser) -> set[str]:
    """Options that may not be given together with an earlier one of their group."""
    out: set[str] = set()
    for group in parser._mutually_exclusive_groups:
        out.update(a.dest for a in group._group_actions[1:])
    return out


def _argv_with(
    parser: argparse.ArgumentParser, command: tuple[str, ...], value: Callable[[str], str]
) -> list[str]:
    """The command with every file-like argument (and every positional) set to
    ``value(dest)`` (distinct paths per argument, so that one does not create another)."""
    argv = list(command)
    skip = _exclusive_losers(parser)
    for action in _options(parser):
        if action.nargs == 0 or action.dest in skip:
            continue
        if action.required or _file_like(action):
            argv += [action.option_strings[0], value(action.dest)]
    for action in _positionals(parser):
        if action.nargs == argparse.REMAINDER:
            argv += ["--", value(action.dest)]
        else:
            argv.append(value(action.dest))
    return argv


def _takes_a_path(command: tuple[str, ...]) -> bool:
    return _argv_with(LEAVES[command], command, lambda dest: "x") != list(command)


# Per family, the first command that takes a file: the one run as a real process.
REAL_PROCESS: set[tuple[str, ...]] = set()
for _command in COMMANDS:
    if _takes_a_path(_command) and not any(c[0] == _command[0] for c in REAL_PROCESS):
        REAL_PROCESS.add(_command)


def run_cli(
    argv: list[str], cwd: Path, *, in_process: bool = True
) -> subprocess.CompletedProcess[str]:
    if in_process:
        return run_main(argv, cwd=cwd, env={"TRAINGUARD_NO_CACHE": "1"})
    env = {**os.environ, "TRAINGUARD_NO_CACHE": "1"}
    env.pop("TRAINGUARD_DEBUG", None)
    env.pop("TRAINGUARD_SERVER", None)
    return subprocess.run(
        [sys.executable, "-m", "trainguard.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], codes: tuple[int, ...]) -> None:
    """No traceback; every stderr line is a ``trainguard...`` line (``run`` narrates what it
    did before the error; a dump of anything else is not allowed)."""
    shown = f"rc={proc.returncode}\nstderr:\n{proc.stderr}\nstdout:\n{proc.stdout[:2000]}"
    assert "Traceback" not in proc.stderr + proc.stdout, shown
    assert proc.returncode in codes, shown
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines, shown
    assert all(ln.startswith("trainguard") for ln in lines), shown
    assert not any("unexpected" in ln for ln in lines), shown  # cli.main's safety net


@pytest.fixture
def bad_inputs(tmp_path: Path) -> dict[str, Callable[[str], str]]:
    binary = tmp_path / "binary.dat"
    binary.write_bytes(bytes(range(256)) * 16 + b"\x00\xff\xfe" * 100)
    (tmp_path / "a-directory").mkdir()
    return {
        "binary": lambda dest: str(binary),
        "missing": lambda dest: str(tmp_path / "no-such-dir" / dest),
        "directory": lambda dest: str(tmp_path / "a-directory"),
    }


def test_the_parser_has_commands() -> None:
    # Guard the enumeration itself: a broken walk would make every test below vacuous.
    assert len(COMMANDS) >= 18
    assert ("slurm", "watch") in LEAVES and ("devices", "release") in LEAVES
    assert len(REAL_PROCESS) == len({c[0] for c in COMMANDS})  # every family, once


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_option_has_help(command: tuple[str, ...]) -> None:
    parser = LEAVES[command]
    missing = [
        "/".join(a.option_strings) or a.dest
        for a in parser._actions
        if not a.help and not isinstance(a, argparse._SubParsersAction)
    ]
    assert not missing, f"trainguard {' '.join(command)}: options without help: {missing}"
    assert parser.description or parser.format_usage(), command


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_unknown_option_and_bad_numbers_are_one_line_usage_errors(
    command: tuple[str, ...], tmp_path: Path
) -> None:
    parser = LEAVES[command]
    proc = run_cli([*command, "--no-such-option-here"], tmp_path)
    assert_one_line_error(proc, (2,))
    typed = [a for a in _options(parser) if a.type is not None and a.choices is None]
    for action in typed:
        proc = run_cli([*command, action.option_strings[0], "not-a-number"], tmp_path)
        assert_one_line_error(proc, (2,))
        assert action.option_strings[0] in proc.stderr or action.dest in proc.stderr


@pytest.mark.parametrize("kind", ["binary", "missing", "directory"])
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_bad_files_are_one_line_errors(
    command: tuple[str, ...],
    kind: str,
    bad_inputs: dict[str, Callable[[str], str]],
    tmp_path: Path,
) -> None:
    parser = LEAVES[command]
    argv = _argv_with(parser, command, bad_inputs[kind])
    if argv == list(command):
        pytest.skip(f"trainguard {' '.join(command)} takes no file or positional argument")
    proc = run_cli(argv, tmp_path, in_process=kind != "binary" or command not in REAL_PROCESS)
    if proc.returncode == 0:
        # Allowed only for a read command that says plainly there is nothing at that path
        # ("no incidents recorded (no state database at PATH)", "no checkpoints found in DIR").
        assert kind != "binary", proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
        assert "no " in proc.stdout + proc.stderr, proc.stdout + proc.stderr
        return
    assert_one_line_error(proc, (1, 2))


def test_slurm_watch_without_slurm_stops_with_one_line(tmp_path: Path) -> None:
    # Before: each pass logged a traceback, forever. PATH holds no Slurm command here.
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    env = {**os.environ, "PATH": str(empty_bin)}
    env.pop("TRAINGUARD_DEBUG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "slurm", "watch", "--state", "s.db"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert_one_line_error(proc, (1,))
    assert "Slurm is not installed" in proc.stderr and "--slurm-bin" in proc.stderr
