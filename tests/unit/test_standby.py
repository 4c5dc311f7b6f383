"""Which commands a warm standby can take over, and what must match (decision 0271)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from trainguard.schedulers import standby


def test_a_torchrun_console_script_runs_on_the_interpreter_of_its_shebang(tmp_path: Path) -> None:
    script = tmp_path / "torchrun"
    script.write_text("#!/opt/venv/bin/python3.11\nfrom torch.distributed.run import main\n")
    script.chmod(0o755)
    env = {"PATH": f"{tmp_path}{os.pathsep}/usr/bin"}
    got = standby.warm_command(["torchrun", "--nproc-per-node", "2", "train.py"], env)
    assert got == ("/opt/venv/bin/python3.11", ("--nproc-per-node", "2", "train.py"), str(tmp_path))


def test_python_dash_m_torch_distributed_run_is_taken_with_its_interpreter() -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "t.py", "--lr", "1"]
    got = standby.warm_command(cmd, {"PATH": "/usr/bin"})
    assert got == (os.path.abspath(sys.executable), ("--standalone", "t.py", "--lr", "1"), None)


def test_other_commands_start_cold_with_a_reason(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path)}
    assert "not torchrun" in str(standby.warm_command(["python", "train.py"], env))
    assert "not torchrun" in str(standby.warm_command(["deepspeed", "train.py"], env))
    assert "not torchrun" in str(standby.warm_command(["python", "-u", "-m", "x"], env))
    assert "not on PATH" in str(standby.warm_command(["torchrun", "t.py"], env))
    script = tmp_path / "torchrun"
    script.write_text("#!/usr/bin/env python\n")
    script.chmod(0o755)
    assert "#! line" in str(standby.warm_command(["torchrun", "t.py"], env))
    assert standby.warm_command([], env) == "no command"


def test_only_what_the_interpreter_read_at_start_must_match() -> None:
    env = {
        "PATH": "/bin", "PYTHONPATH": "/src", "PYTHONUNBUFFERED": "1", "LD_PRELOAD": "x.so",
        "VIRTUAL_ENV": "/v", "CUDA_VISIBLE_DEVICES": "0,1", "TRAINGUARD_ATTEMPT": "3",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "HOME": "/root",
    }  # fmt: skip
    assert standby.interpreter_env(env) == {
        "PATH": "/bin", "PYTHONPATH": "/src", "PYTHONUNBUFFERED": "1", "LD_PRELOAD": "x.so",
        "VIRTUAL_ENV": "/v",
    }  # fmt: skip


def test_the_request_is_one_line_read_without_consuming_what_follows() -> None:
    a, b = socket.socketpair()
    with a, b:
        line = standby.request_line(
            ["torchrun", "t.py"], {"A": "1\n2"}, "/w", "/w", title=["/py", "/b/torchrun", "t.py"]
        )
        a.sendall(line + b"ok\n")
        import json

        assert json.loads(standby.read_line(b, 5.0)) == {
            "argv": ["torchrun", "t.py"], "env": {"A": "1\n2"}, "cwd": "/w", "path0": "/w",
            "title": ["/py", "/b/torchrun", "t.py"],
        }  # fmt: skip
        assert standby.read_line(b, 5.0) == b"ok"
        a.close()
        assert standby.read_line(b, 5.0) == b""  # end-of-file


def test_a_zygote_starts_python_script_and_module_workers_and_says_why_not_others() -> None:
    from trainguard.schedulers import zygote

    py, env = "/usr/bin/python3", {"PATH": "/bin", "LOCAL_RANK": "1", "OMP_NUM_THREADS": "1"}
    zenv = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": ""}
    assert zygote.plan((py, "-u", "t.py", "--lr", "1"), env, zenv, py) == (
        "script", "t.py", ["--lr", "1"],
    )  # fmt: skip
    assert zygote.plan((py, "-u", "-m", "pkg.train", "x"), env, zenv, py) == (
        "module", "pkg.train", ["x"],
    )  # fmt: skip
    assert "not this Python" in str(zygote.plan(("./train.sh", "x"), env, zenv, py))
    assert "options" in str(zygote.plan((py, "-X", "dev", "t.py"), env, zenv, py))
    # Read when the interpreter or torch's libraries started: the zygote already has its own.
    for key, value in (("PYTHONPATH", "/src"), ("OMP_PROC_BIND", "close"), ("PATH", "/x")):
        why = str(zygote.plan((py, "-u", "t.py"), {**env, key: value}, zenv, py))
        assert why == f"the worker environment differs from the zygote's ({key})", why


def test_a_warm_workers_status_is_popens_returncode() -> None:
    import signal as sig

    from trainguard.schedulers import zygote
    from trainguard.signals.process import WARM_ENVIRON_VAR

    assert zygote.returncode((os.CLD_EXITED, 3)) == 3
    assert zygote.returncode((os.CLD_KILLED, sig.SIGKILL)) == -9
    assert zygote.returncode((os.CLD_DUMPED, sig.SIGSEGV)) == -11
    # The writer (in the job's interpreter, no trainguard there) and the reader agree.
    assert zygote.ENVIRON_DIR_VAR == WARM_ENVIRON_VAR == standby.ZYGOTE_ENVIRON_VAR
