"""A warm standby torchrun agent: the next attempt's launcher, parked while the job trains.

A restart under ``trainguard run`` used to pay for a new interpreter, ``import torch``
and ``import torch.distributed.run`` before the torchrun agent could even start its
workers (1.4–3.4 s on a loaded machine, issue 16). The local scheduler therefore
parks one process per job, while the current attempt trains (decision 0271):

* it is started under its own watchdog (``_reaper.py``, the same lifeline as an
  attempt: it never outlives trainguard), with the job's environment, and is
  **idle priority** (``SCHED_IDLE``; ``nice 19`` only where it can be undone, as
  root), so it uses no CPU the training wants; ``CUDA_VISIBLE_DEVICES`` is empty
  while it waits and CUDA is never initialised (``import torch`` does not), so it
  holds no GPU;
* it imports ``torch`` and ``torch.distributed.run``, says ``ready`` on its
  channel (a socketpair) and waits;
* at the restart it receives the new attempt's argv, environment
  (``CUDA_VISIBLE_DEVICES``, ``TRAINGUARD_*``...) and cwd as one JSON line, goes
  back to normal priority (it refuses, and the attempt starts cold, when it
  cannot), answers ``ok`` and calls ``torch.distributed.run.main()`` in process,
  exactly what ``python -m torch.distributed.run ARGS`` and the ``torchrun``
  console script run: it *is* the attempt's torchrun agent from then on.

The workers the agent spawns start cold through ``Popen`` unless the standby was
parked with ``TRAINGUARD_WARM_ENVIRON`` set (``--warm-workers``, decision 0310): then,
once its imports are done, it forks a *zygote* (``zygote.py``) that forks the agent's
script workers from the preloaded interpreter.

This module is both the parent's side (:func:`warm_command`, :func:`interpreter_env`,
the protocol) and, run as a file (``python standby.py --channel FD``), the parked
process. The parked side imports nothing of trainguard: the job's interpreter may not
have it installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

STANDBY = os.path.abspath(__file__)
TORCHRUN_MODULE = "torch.distributed.run"
READY = b"ready"
OK = b"ok"
REFUSE = b"refuse"
# Variables the interpreter reads when it starts (sys.path, libraries, its own flags):
# a parked interpreter started with other values is not the interpreter the attempt
# would get. Everything else the agent reads when it runs.
INTERPRETER_VARS = ("PATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "LD_PRELOAD")
# Set in a standby's environment when it is to fork a zygote for warm workers: the
# directory of the workers' environments (zygote.ENVIRON_DIR_VAR).
ZYGOTE_ENVIRON_VAR = "TRAINGUARD_WARM_ENVIRON"


def interpreter_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of ``env`` a Python interpreter has already used once it is running."""
    return {k: v for k, v in env.items() if k in INTERPRETER_VARS or k.startswith("PYTHON")}


def _shebang_interpreter(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            first = fh.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    parts = first[2:].decode(errors="replace").split()
    if len(parts) != 1 or "python" not in os.path.basename(parts[0]):
        return None  # "/usr/bin/env python" and friends: not resolved here
    return parts[0]


def warm_command(
    command: Sequence[str], env: Mapping[str, str]
) -> tuple[str, tuple[str, ...], str | None] | str:
    """``(interpreter, torchrun arguments, script directory)`` when ``command`` is a torchrun
    launch a standby can take over, else the reason (a sentence) why it cannot.

    Taken: ``torchrun ARGS`` (the console script: its interpreter from its ``#!`` line;
    the script's directory is the cold interpreter's ``sys.path[0]``) and
    ``PYTHON -m torch.distributed.run ARGS`` (directory ``None``: the cwd).
    """
    if not command:
        return "no command"
    path = env.get("PATH", os.defpath)
    first = command[0]
    name = os.path.basename(first)
    if name == "torchrun":
        script = first if os.sep in first else shutil.which(first, path=path)
        if script is None:
            return f"{first} is not on PATH"
        interpreter = _shebang_interpreter(script)
        if interpreter is None:
            return f"cannot tell the Python interpreter of {script} from its #! line"
        return interpreter, tuple(command[1:]), os.path.dirname(os.path.abspath(script))
    if name.startswith("python") and list(command[1:3]) == ["-m", TORCHRUN_MODULE]:
        interpreter = first if os.sep in first else shutil.which(first, path=path)
        if interpreter is None:
            return f"{first} is not on PATH"
        return os.path.abspath(interpreter), tuple(command[3:]), None
    return "the command is not torchrun (torchrun ... or python -m torch.distributed.run ...)"


def request_line(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    path0: str,
    title: Sequence[str] = (),
) -> bytes:
    """The one line that turns a parked standby into an attempt's agent.

    ``path0`` is the ``sys.path[0]`` the cold interpreter would have had: the cwd for
    ``python -m``, the console script's directory for ``torchrun``. ``title`` is the
    command line a cold launcher shows in /proc, which the agent then shows too.
    """
    body = {
        "argv": list(argv), "env": dict(env), "cwd": cwd, "path0": path0, "title": list(title),
    }  # fmt: skip
    return json.dumps(body).encode() + b"\n"


def idle(pid: int) -> bool:
    """Put ``pid`` at ``SCHED_IDLE`` (from outside: same user suffices); False if it cannot."""
    sched_idle = getattr(os, "SCHED_IDLE", None)
    if sched_idle is None:
        return False
    try:
        os.sched_setscheduler(pid, sched_idle, os.sched_param(0))
    except OSError:
        return False
    return True


def read_line(sock: socket.socket, timeout: float | None) -> bytes:
    """One ``\\n``-terminated line (without it); ``b''`` on end-of-file or timeout."""
    sock.settimeout(timeout)
    data = b""
    try:
        while not data.endswith(b"\n"):
            chunk = sock.recv(1)  # byte by byte: nothing after the line may be consumed
            if not chunk:
                return b""
            data += chunk
    except (TimeoutError, OSError):
        return b""
    return data[:-1]


# --- the parent's handle on a parked standby -------------------------------------------

REPLY_SECONDS = 30.0  # a woken standby answers at once; this only bounds a wedged one
READY_SECONDS = 60.0  # a standby still importing is still ahead of a cold start


class Parked:
    """A standby under its own watchdog: its reaper, its pid, lifeline and channel."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        launcher_pid: int,
        lifeline: int,
        channel: socket.socket,
        interpreter: str,
        interp_env: dict[str, str],
        parked_at: float,
    ) -> None:
        self.proc = proc
        self.launcher_pid = launcher_pid
        self._lifeline: int | None = lifeline
        self.channel = channel
        self.interpreter = interpreter
        self.interp_env = interp_env
        self.parked_at = parked_at
        self.workers_note: str | None = None  # "warm workers: ..." / "cold workers: why"

    def wait_ready(self, timeout: float) -> str | None:
        """Wait for ``ready`` (at normal priority from now on: it is needed); None or why not."""
        sched_other = getattr(os, "SCHED_OTHER", None)
        if sched_other is not None:
            with contextlib.suppress(OSError):
                os.sched_setscheduler(self.launcher_pid, sched_other, os.sched_param(0))
        line = read_line(self.channel, timeout)
        if line == READY:
            return None
        if line.startswith(REFUSE):
            return f"the standby refused: {line[len(REFUSE) :].decode().strip()}"
        if self.proc.poll() is not None:
            return f"the standby died (exit {self.proc.returncode})"
        return f"the standby was not ready after {timeout:g} s"

    def hand_over(self, request: bytes) -> str | None:
        try:
            self.channel.sendall(request)
        except OSError as exc:
            return f"cannot reach the standby: {exc}"
        line = read_line(self.channel, REPLY_SECONDS)
        self.channel.close()
        if line == OK or line.startswith(OK + b" "):
            self.workers_note = line[len(OK) :].decode(errors="replace").strip() or None
            return None
        if line.startswith(REFUSE):
            return f"the standby refused: {line[len(REFUSE) :].decode().strip()}"
        return "the standby did not take the attempt"

    def take_lifeline(self) -> int:
        fd, self._lifeline = self._lifeline, None
        assert fd is not None
        return fd

    def dismiss(self, wait: float = 0.0) -> None:
        """Let it go: its channel and lifeline closed, its watchdog stops it."""
        with contextlib.suppress(OSError):
            self.channel.close()
        fd, self._lifeline = self._lifeline, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

        def reap() -> None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(30.0)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()

        if wait > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(wait)
            reap()
        else:
            threading.Thread(target=reap, name="standby-reap", daemon=True).start()


# --- the parked process ----------------------------------------------------------------


def _go_idle() -> str:
    """Park at idle priority; returns how (or raises ``OSError`` when it cannot)."""
    sched_idle = getattr(os, "SCHED_IDLE", None)
    if sched_idle is not None:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, sched_idle, os.sched_param(0))
            return "SCHED_IDLE"
    if os.geteuid() == 0:  # only root can undo a nice 19 at the handover
        os.nice(19)
        return "nice 19"
    raise OSError("neither SCHED_IDLE nor an undoable nice 19 is available")


def _wake(how: str, pid: int = 0) -> None:
    """Back to normal priority before the agent starts workers (they inherit it);
    ``pid``: this process (0) or its zygote."""
    if how == "SCHED_IDLE":
        os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
        if os.sched_getscheduler(pid) != os.SCHED_OTHER:
            raise OSError("still SCHED_IDLE")
    elif pid == 0:
        os.nice(-os.nice(0))
    else:
        os.setpriority(os.PRIO_PROCESS, pid, 0)


def _load(name: str) -> Any:
    """``NAME.py`` beside this file, by path (trainguard may not be importable here)."""
    import importlib.util

    path = os.path.join(os.path.dirname(STANDBY), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_trainguard_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _say(what: str) -> None:
    """One sentence into the attempt's log (the agent's stderr is followed into it)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"# trainguard: {what}\n")
        sys.stderr.flush()


def main(argv: list[str]) -> int:
    """The parked process: import, say ready, wait, become the agent (or go away)."""
    fd = int(argv[argv.index("--channel") + 1])
    if sys.path and sys.path[0] == os.path.dirname(STANDBY):
        sys.path.pop(0)  # this package's directory must not shadow anything
    os.set_inheritable(fd, False)  # the workers must not hold it
    sock = socket.socket(fileno=fd)
    try:
        how = _go_idle()
    except OSError as exc:
        sock.sendall(REFUSE + f" cannot park at idle priority: {exc}\n".encode())
        return 0
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # nothing here may see a GPU while parked
    zygote: Any = _load("zygote")
    preload: Any = _load("preload")
    specs = preload.specs_from_env(os.environ)  # the zygote's imports: the job's script's
    # Our own command line without the room kept for a restarted process's (title_space).
    zygote.impersonate([sys.executable, STANDBY, "--channel", str(fd)])
    import torch  # the point: imported before the restart
    import torch.distributed.run

    # Warm workers (decision 0310): a copy of this process, forked now (single-threaded,
    # torch imported, CUDA never initialised), forks the agent's script workers later.
    client: Any = None
    zygote_env = dict(os.environ)
    environ_dir = os.environ.get(ZYGOTE_ENVIRON_VAR)
    if environ_dir:
        forked = zygote.fork_zygote(
            environ_dir, drop=(sock,), prepare=lambda: preload.preload(specs)
        )
        if isinstance(forked, zygote.Job):  # a worker forked by the zygote, not the standby
            zygote.run_job(forked)  # its exceptions end it as they end a cold interpreter
            return 0
        client = zygote.Client(*forked)

    sock.sendall(READY + b"\n")
    line = read_line(sock, None)
    if not line:
        return 0  # dismissed: the job ended or trainguard chose a cold start
    request = json.loads(line)
    try:
        _wake(how)
    except OSError as exc:
        sock.sendall(REFUSE + f" cannot leave idle priority ({how}): {exc}\n".encode())
        return 0
    workers = ""
    if client is not None:
        problem = client.dead()
        if problem is None:
            try:
                _wake(how, client.pid)  # its workers inherit its priority
            except OSError as exc:
                problem = f"the zygote cannot leave idle priority ({how}): {exc}"
        if problem is None:
            client.start_reading()
        workers = (
            f"warm workers: zygote pid {client.pid}{preload.describe(specs)}" if problem is None
            else f"cold workers: {problem}"
        )  # fmt: skip
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["argv"])
    sys.path.insert(0, request["path0"])
    title = request.get("title") or []
    if title:  # what `ps` and `pgrep -f` show of a cold launcher, and its environment
        shebang = len(title) > 1 and title[1] != "-m"
        zygote.impersonate(title, request["env"], comm=title[1] if shebang else title[0])
    if workers.startswith("warm"):
        zygote.install(client, zygote_env, _say)
    sock.sendall(OK + (b" " + workers.encode() if workers else b"") + b"\n")
    sock.close()
    # What `python -m torch.distributed.run` and the torchrun console script both run.
    try:
        torch.distributed.run.main()
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:  # a failed worker: torchrun's ChildFailedError, printed
        zygote.print_uncaught(exc)  # as a cold torchrun prints it, without our frames
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
