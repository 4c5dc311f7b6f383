"""The argument lists ``slurm watch --ssh`` sends reach the remote command unchanged.

``ssh`` hands the login node one string that its shell parses (``$SHELL -c STRING``);
these tests give :func:`remote_command`'s string to a real ``sh -c`` (and ``bash -c``),
which is what sshd does, and read back the arguments the command received.
"""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.controller.slurm_watch import SlurmWatch
from trainguard.schedulers.slurm.ssh import (
    SshSlurmCommands,
    SshTarget,
    parse_destination,
    remote_command,
)

PRINTF = shutil.which("printf") or "/usr/bin/printf"
SHELLS = [s for s in ("sh", "bash") if shutil.which(s)]

# Any text an argument can hold (no NUL: argv cannot carry one; no lone surrogates: not
# encodable): quotes, $, backticks, newlines, globs, spaces, leading dashes, unicode.
arg = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40)
nasty = st.sampled_from(["'", '"', "$HOME", "`id`", "$(id)", "\n", "*", "-n", ";", "|", "\\", "~"])
args = st.lists(st.one_of(arg, nasty), min_size=1, max_size=8)


def through_shell(shell: str, command: str) -> list[str]:
    """Run ``command`` as sshd would (``shell -c``); it prints its arguments NUL-ended."""
    out = subprocess.run(
        [shell, "-c", command], capture_output=True, check=True, timeout=20
    ).stdout.decode("utf-8", "surrogateescape")
    assert out.endswith("\0"), out
    return out[:-1].split("\0")


@pytest.mark.parametrize("shell", SHELLS)
@settings(max_examples=150, deadline=None)
@given(argv=args)
def test_any_argument_list_round_trips_through_the_remote_shell(
    shell: str, argv: list[str]
) -> None:
    assert through_shell(shell, remote_command([PRINTF, "%s\\0", *argv])) == argv


@settings(max_examples=60, deadline=None)
@given(argv=args, conf=arg.filter(bool))
def test_the_remote_wrapping_keeps_the_arguments_and_the_conf_path(
    argv: list[str], conf: str
) -> None:
    """What the login node runs (``timeout``, ``env SLURM_CONF=...``, the tool) still hands
    the tool exactly its arguments, and SLURM_CONF exactly the path given."""
    cmds = SshSlurmCommands(SshTarget("someone@login1"), conf=conf)
    try:
        wrapped = cmds.remote_argv([PRINTF, "%s\\0", *argv, "$SLURM_CONF"], 10)
        # The printf sees "$SLURM_CONF" literally (quoted); the env check below reads it.
        assert through_shell("sh", remote_command(wrapped)) == [*argv, "$SLURM_CONF"]
        env_out = through_shell(
            "sh", remote_command(cmds.remote_argv(["sh", "-c", 'printf "%s\\0" "$SLURM_CONF"'], 10))
        )
        assert env_out == [conf]
    finally:
        cmds.close()


def test_a_nul_or_an_empty_command_is_refused() -> None:
    with pytest.raises(ValueError):
        remote_command(["squeue", "a\0b"])
    with pytest.raises(ValueError):
        remote_command([])


@pytest.mark.parametrize(
    "text",
    ["-oProxyCommand=touch /tmp/x", "root@-p1", "a b@host", "u@host;id", "u@", "@h", "u@h h", ""],
)
def test_a_destination_ssh_could_read_as_an_option_or_that_holds_a_shell_character_is_refused(
    text: str,
) -> None:
    with pytest.raises(ValueError):
        parse_destination(text)


def test_destinations() -> None:
    assert parse_destination("root@127.0.0.1") == ("root", "127.0.0.1")
    assert parse_destination("svc.trainguard@login-1.cluster.example") == (
        "svc.trainguard",
        "login-1.cluster.example",
    )
    assert parse_destination("login1") == (None, "login1")


def test_the_host_key_is_checked_and_the_master_socket_is_private() -> None:
    cmds = SshSlurmCommands(SshTarget("u@h", port=2222, key="/k", known_hosts="/kh"))
    try:
        argv = cmds.ssh_argv()
        opts = {argv[i + 1] for i, a in enumerate(argv) if a == "-o"}
        assert {"BatchMode=yes", "StrictHostKeyChecking=yes", "UserKnownHostsFile=/kh"} <= opts
        assert "GlobalKnownHostsFile=/dev/null" in opts and "IdentitiesOnly=yes" in opts
        assert argv[-2:] == ["--", "u@h"] and argv[argv.index("-p") + 1] == "2222"
        assert f"ControlPath={cmds.control_dir}/%C" in opts
        assert stat.S_IMODE(Path(cmds.control_dir).stat().st_mode) == 0o700
        accept = SshSlurmCommands(SshTarget("u@h", accept_new_host_key=True))
        assert "StrictHostKeyChecking=accept-new" in accept.ssh_argv()
        accept.close()
    finally:
        cmds.close()
    assert not Path(cmds.control_dir).exists()


@pytest.mark.parametrize("bad", [{"port": 0}, {"port": 70000}, {"max_sessions": 0}])
def test_bad_targets(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        SshTarget("u@h", **bad)  # type: ignore[arg-type]


def test_a_job_whose_output_is_not_visible_here_is_observed_only_over_ssh(tmp_path: Path) -> None:
    """Over ssh, progress is read from the job's output file: where its directory is not
    visible on this host, the job is observed only (every attempt would look hung)."""
    remote = SimpleNamespace(scheduler=SimpleNamespace(cmd=SimpleNamespace(remote="u@login1")))
    local = SimpleNamespace(scheduler=SimpleNamespace(cmd=SimpleNamespace(remote=None)))
    unseen = SimpleNamespace(output_path="/no/such/dir/slurm-7.out")
    seen = SimpleNamespace(output_path=str(tmp_path / "slurm-7.out"))
    reason = SlurmWatch._output_unseen(remote, unseen)  # type: ignore[arg-type]
    assert reason is not None and "not visible" in reason and "u@login1" in reason
    assert SlurmWatch._output_unseen(remote, seen) is None  # type: ignore[arg-type]
    assert SlurmWatch._output_unseen(local, unseen) is None  # type: ignore[arg-type]
