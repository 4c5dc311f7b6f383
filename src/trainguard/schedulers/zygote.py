"""Warm workers: a preloaded interpreter that forks torchrun's script workers (decision 0310).

A parked standby (``standby.py``, decision 0271) removes the torchrun *agent's* cold
start from a restart; the workers the agent then starts still paid for a new
interpreter and ``import torch`` each (2–4 s on a loaded machine). Here the standby,
once its imports are done and while still parked (idle priority, no GPU, CUDA never
initialised), forks a **zygote**: a copy of itself that only waits. When the standby
becomes an attempt's agent, ``SubprocessHandler._popen`` (torch.distributed.elastic's
one place that starts a script worker with ``subprocess.Popen``) is replaced, in the
agent only, by a request to the zygote:

* the zygote forks a worker that starts a session of its own (as ``Popen(...,
  start_new_session=True)`` would), takes stdin/stdout/stderr passed with
  ``SCM_RIGHTS`` (the files torchrun redirects to, or the agent's own), replaces
  ``os.environ`` (before any CUDA call: CUDA reads ``CUDA_VISIBLE_DEVICES`` at its
  initialisation), chdirs, and runs the script in a real ``__main__`` module that stays
  until finalisation, as a cold interpreter's does (decision 0490); an uncaught
  exception ends it exactly as it ends a cold interpreter; a worker still alive a grace
  after its script ended is ended, with the script's exit code (0490);
* the agent gets a :class:`WarmWorker`, a ``Popen``-like handle (``pid``, ``poll``,
  ``wait``, ``send_signal``, ``returncode``). The zygote reads each worker's exit
  status without reaping it (``waitid(..., WNOWAIT)``) and sends it to the agent;
  the worker is reaped only once the agent has taken its status, so — as with
  ``Popen`` — its pid and process group stay valid for torchrun's ``killpg`` until
  then, and trainguard's RankWatcher can read its status from ``/proc``;
* ``/proc/PID/cmdline``, ``environ`` and ``comm`` of a forked worker would show the
  zygote's exec-time values; the worker rewrites them in place to a cold worker's
  (:func:`impersonate`, in the room the standby was started with). Until it has, the
  kernel shows the zygote's, so the zygote also writes each worker's environment into
  ``$TRAINGUARD_WARM_ENVIRON/PID-STARTTICKS.env`` (the format of ``/proc/PID/environ``)
  before the worker is reported; ``trainguard.signals.process.read_environ`` reads it
  for any process whose exec-time environment names that directory. Ranks, the culprit
  rank, the fast kill, the snapshot flush and the leftover sweep therefore see warm
  workers as they see cold ones.

Whenever it cannot apply (an entrypoint that is not ``PYTHON -u script`` / ``-m
module``, an environment the preloaded interpreter or its libraries already read with
other values, the zygote gone), the agent starts that worker with ``Popen`` as before
and says why, once, on its stderr (the attempt log).

Like ``standby.py`` this file runs in the job's interpreter and imports nothing of
trainguard; the standby loads it by path.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# In the zygote's (and so its workers') exec-time environment: where the workers' real
# environments are written. trainguard.signals.process reads the same name.
ENVIRON_DIR_VAR = "TRAINGUARD_WARM_ENVIRON"
ZYGOTE_NAME = b"tg-zygote"  # its /proc/PID/comm: it has the standby's command line
MAX_MESSAGE = 1 << 22
START_SECONDS = 120.0  # a zygote still preloading answers late; still ahead of a cold start
PR_SET_NAME = 15
PR_SET_PDEATHSIG = 1
# Read once by a library when the interpreter or torch starts: a worker whose value
# differs from the zygote's would not get what a cold start gives it. OMP_NUM_THREADS
# is the exception (torchrun sets it to 1 for every worker): it is applied with
# torch.set_num_threads, which is what a cold worker's value ends up doing.
LIBRARY_PREFIXES = ("OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_")
APPLIED_VARS = ("OMP_NUM_THREADS",)
INTERPRETER_VARS = ("PATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "LD_PRELOAD")
# A worker whose script has ended (it said so on its end pipe, with the exit code) but
# that is still alive this many seconds later is killed and reported with the script's
# code (decision 0490): a thread that never ends, or a teardown that deadlocks, must not
# keep a completed job running. The worker's environment may set another value.
EXIT_GRACE_VAR = "TRAINGUARD_WARM_EXIT_GRACE"
EXIT_GRACE = 10.0


def start_env(env: Mapping[str, str]) -> dict[str, str]:
    """What an interpreter and the libraries torch loads have read once torch is imported."""
    return {
        k: v
        for k, v in env.items()
        if k in INTERPRETER_VARS
        or k.startswith("PYTHON")
        or (k.startswith(LIBRARY_PREFIXES) and k not in APPLIED_VARS)
    }


def plan(
    args: Sequence[str], env: Mapping[str, str], zygote_env: Mapping[str, str], python: str
) -> tuple[str, str, list[str]] | str:
    """``("script"|"module", target, argv)`` for a worker the zygote can start, else why not.

    ``args`` is what torchrun would have passed to ``Popen``: ``PYTHON -u SCRIPT ARGS``
    or ``PYTHON -u -m MODULE ARGS``.
    """
    if not args or os.path.realpath(args[0]) != os.path.realpath(python):
        return "the worker entrypoint is not this Python interpreter (--no-python?)"
    rest = list(args[1:])
    if rest[:1] == ["-u"]:
        rest = rest[1:]
    if rest[:1] == ["-m"] and len(rest) >= 2:
        kind, target, argv = "module", rest[1], rest[2:]
    elif rest and not rest[0].startswith("-"):
        kind, target, argv = "script", rest[0], rest[1:]
    else:
        return f"interpreter options the zygote does not apply ({' '.join(rest[:2])})"
    ours, theirs = start_env(zygote_env), start_env(env)
    if ours != theirs:
        names = ", ".join(sorted({k for k, _ in set(ours.items()) ^ set(theirs.items())}))
        return f"the worker environment differs from the zygote's ({names})"
    return kind, target, argv


def returncode(status: tuple[int, int]) -> int:
    """``Popen.returncode`` from ``(si_code, si_status)``: the code, or minus the signal."""
    code, value = status
    return value if code == os.CLD_EXITED else -value


def _prctl(option: int, value: int | bytes) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        arg = ctypes.c_char_p(value) if isinstance(value, bytes) else ctypes.c_ulong(value)
        return int(libc.prctl(option, arg, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


# --- what outside tools see of a warm process ---------------------------------------------
#
# `ps`, `pgrep -f`, profilers and monitoring scripts read /proc/PID/cmdline, environ and
# comm. A forked process shows its forking interpreter's exec-time values there; the
# kernel reads them from two areas of the process's own memory (argument and environment
# strings, bounds in /proc/PID/stat), which the process may rewrite in place. trainguard
# starts the standby with room to spare in both (TITLE_SPACE_ARG, TITLE_SPACE_VAR), so a
# warm worker can show exactly what a cold one shows.

TITLE_SPACE_ARG = "--title-space"  # standby.py's padding argument, never read
TITLE_SPACE_VAR = "TRAINGUARD_TITLE_SPACE"  # padding in the standby's exec-time environment


def title_space(command: Sequence[str]) -> tuple[str, str]:
    """``(argument padding, environment padding)`` to start a standby with: room for the
    longest worker or agent command line the job's ``command`` can give, and for an
    environment a few KiB larger than the one it starts with."""
    return "_" * (2 * len(" ".join(command)) + 1024), "_" * 8192


def _areas() -> tuple[int, int, int, int] | None:
    """``(arg_start, arg_end, env_start, env_end)`` of this process, from /proc/self/stat."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        # Field N of proc(5) is fields[N - 3] here (the split starts at field 3).
        return int(fields[45]), int(fields[46]), int(fields[47]), int(fields[48])
    except (OSError, ValueError, IndexError):
        return None


def _detach_environ(libc: Any, start: int, end: int) -> None:
    """Point every C ``environ`` entry that lies in [start, end) at a copy of its own, so
    that ``getenv`` (CUDA, NCCL, OpenMP) never reads the area we are about to rewrite."""
    libc.strdup.restype = ctypes.c_void_p
    libc.strdup.argtypes = [ctypes.c_void_p]
    entries = ctypes.POINTER(ctypes.c_void_p).in_dll(libc, "environ")
    i = 0
    while entries[i]:
        addr = entries[i]
        if start <= addr < end:
            copy = libc.strdup(addr)
            if copy:
                entries[i] = copy
        i += 1


def _fill(data: bytes, size: int) -> bytes:
    """``data`` cut at a NUL boundary to fit ``size`` bytes, padded with NULs."""
    if len(data) > size:
        data = data[: data.rfind(b"\0", 0, size) + 1]
    return data.ljust(size, b"\0")


def impersonate(
    argv: Sequence[str], env: Mapping[str, str] | None = None, comm: str | None = None
) -> bool:
    """Show ``argv`` as this process's command line, ``env`` (when given) as its
    environment and ``comm`` as its name in /proc, as far as the areas allow; False
    when nothing could be rewritten (another OS, an unreadable /proc)."""
    areas = _areas()
    if areas is None:
        return False
    arg_start, arg_end, env_start, env_end = areas
    try:
        libc = ctypes.CDLL(None)
        if env is not None and env_end > env_start:
            _detach_environ(libc, env_start, env_end)
            # The names a person looks for first, so that they survive a tight area.
            first = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")
            order = [k for k in first if k in env] + [k for k in env if k not in first]
            data = b"".join(f"{k}={env[k]}".encode(errors="surrogateescape") + b"\0" for k in order)
            ctypes.memmove(env_start, _fill(data, env_end - env_start), env_end - env_start)
        if arg_end > arg_start:
            data = b"".join(a.encode(errors="surrogateescape") + b"\0" for a in argv)
            ctypes.memmove(arg_start, _fill(data, arg_end - arg_start), arg_end - arg_start)
    except (OSError, AttributeError, ValueError):
        return False
    if comm:
        _prctl(PR_SET_NAME, os.path.basename(comm).encode(errors="replace")[:15])
    return True


def _send(sock: socket.socket, body: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(body).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def _start_ticks(pid: int) -> int | None:
    # signals.process.start_ticks, repeated: the parked side imports nothing of trainguard.
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
        return int(stat[stat.rfind(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def environ_path(directory: str, pid: int, ticks: int) -> str:
    return os.path.join(directory, f"{pid}-{ticks}.env")


# --- the zygote ------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """What a freshly forked worker runs (in the worker, after the fork)."""

    kind: str  # "script" or "module"
    target: str
    argv: list[str]
    env: dict[str, str]
    end_fd: int = -1  # where the worker says "the script ended with exit code C"
    pid: int = 0  # the worker's: a process the script forks does not speak for it


def _write_environ(directory: str, pid: int, env: Mapping[str, str]) -> str | None:
    ticks = _start_ticks(pid)
    if ticks is None:
        return None
    path = environ_path(directory, pid, ticks)
    data = b"".join(f"{k}={v}".encode(errors="surrogateescape") + b"\0" for k, v in env.items())
    tmp = f"{path}.tmp"
    with contextlib.suppress(OSError):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)  # whole or absent: a reader never sees half an environment
        return path
    return None


def exit_grace(env: Mapping[str, str]) -> float:
    """The worker's grace between its script's end and its exit (``EXIT_GRACE_VAR``)."""
    with contextlib.suppress(ValueError):
        grace = float(env.get(EXIT_GRACE_VAR, EXIT_GRACE))
        return grace if grace > 0 else EXIT_GRACE
    return EXIT_GRACE


def _child(
    request: dict[str, Any], fds: list[int], ready_w: int, sock: socket.socket, end_w: int
) -> Job:
    """In the forked worker: a session of its own, the request's stdio, env and cwd."""
    os.setsid()
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # the zygote gone: nobody reports this worker
    with contextlib.suppress(OSError):
        os.write(ready_w, b"s")
    os.close(ready_w)
    sock.close()
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    fds.clear()  # closed here: the zygote's own clean-up must not close them again
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    kind, target, argv = request["plan"]
    args = request.get("args") or [sys.executable, "-u", target, *argv]
    impersonate(args, request["env"], comm=args[0])  # what a cold worker shows in /proc
    return Job(kind, target, list(argv), dict(request["env"]), end_w, os.getpid())


class _Zygote:
    """The fork server: start requests, exit reports, reaps; gone when the agent is."""

    def __init__(self, sock: socket.socket, environ_dir: str, refuse: str | None) -> None:
        self.sock = sock
        self.environ_dir = environ_dir
        self.refuse = refuse  # why this zygote may not fork, if it may not
        self.pidfds: dict[int, int] = {}  # worker pid -> pidfd, until reaped
        self.reported: set[int] = set()
        self.files: dict[int, str] = {}
        self.ends: dict[int, int] = {}  # worker pid -> its end pipe, until it says or exits
        self.grace: dict[int, float] = {}
        self.ended: dict[int, tuple[int, float]] = {}  # pid -> (script's code, when it ended)
        self.killed: dict[int, tuple[int, float]] = {}  # pid -> (script's code, seconds late)

    def serve(self) -> Job:
        """Serve until the agent goes away (then exit); returns only in a forked worker."""
        while True:
            watched = [fd for pid, fd in self.pidfds.items() if pid not in self.reported]
            ends = {fd: pid for pid, fd in self.ends.items()}
            deadlines = [at + self.grace[pid] for pid, (_, at) in self.ended.items()]
            timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            readable, _, _ = select.select([self.sock.fileno(), *watched, *ends], [], [], timeout)
            for fd in readable:
                if fd == self.sock.fileno():
                    job = self._request()
                    if job is not None:
                        return job
                elif fd in ends:
                    self._ended(ends[fd])
                else:
                    self._report(fd)
            self._overdue()

    def _ended(self, pid: int) -> None:
        """The worker's script ended (it wrote its exit code), or the worker is gone."""
        fd = self.ends.pop(pid)
        try:
            data = os.read(fd, 64)
        except OSError:
            data = b""
        os.close(fd)
        with contextlib.suppress(ValueError):
            self.ended[pid] = (int(data), time.monotonic())

    def _overdue(self) -> None:
        """Kill each worker that outlived its script's end by its grace (decision 0490)."""
        now = time.monotonic()
        for pid, (code, at) in list(self.ended.items()):
            if pid not in self.reported and now - at < self.grace[pid]:
                continue
            del self.ended[pid]
            if pid in self.reported:
                continue
            self.killed[pid] = (code, now - at)
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.pidfds[pid], signal.SIGKILL)

    def _report(self, pidfd: int) -> None:
        pid = next(p for p, fd in self.pidfds.items() if fd == pidfd)
        try:
            info = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = None
        if info is None:
            return
        self.reported.add(pid)
        self.ended.pop(pid, None)
        body: dict[str, Any] = {"exit": pid, "status": [info.si_code, info.si_status]}
        if pid in self.killed:
            # Ended by us after its script had ended: the job's result is the script's.
            code, late = self.killed.pop(pid)
            body["status"] = [os.CLD_EXITED, code]
            body["note"] = (
                f"warm worker pid {pid} outlived its script's end (exit code {code}) by "
                f"{late:.1f} s; ended"
            )
        with contextlib.suppress(OSError):
            _send(self.sock, body)

    def _reap(self, pid: int) -> None:
        fd = self.pidfds.pop(pid, None)
        self.reported.discard(pid)
        self.grace.pop(pid, None)
        self.ended.pop(pid, None)
        self.killed.pop(pid, None)
        end = self.ends.pop(pid, None)
        if end is not None:
            os.close(end)
        if fd is not None:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitid(os.P_PIDFD, fd, os.WEXITED)
            os.close(fd)
        path = self.files.pop(pid, None)
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)

    def _request(self) -> Job | None:
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, MAX_MESSAGE, 8)
        except OSError:
            data, fds = b"", []
        if not data:
            os._exit(0)  # the agent is gone; unreaped workers go to the subreaper
        request = json.loads(data)
        op = request.get("op")
        if op == "reap":
            self._reap(int(request["pid"]))
        elif op == "start" and self.refuse is not None:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            _send(self.sock, {"error": self.refuse})
        elif op == "start":
            try:
                return self._start(request, fds)
            finally:
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
        return None

    def _start(self, request: dict[str, Any], fds: list[int]) -> Job | None:
        ready_r, ready_w = os.pipe()
        end_r, end_w = os.pipe()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()  # nothing of ours may be written twice by the worker
        try:
            pid = os.fork()
        except OSError as exc:
            for fd in (ready_r, ready_w, end_r, end_w):
                os.close(fd)
            _send(self.sock, {"error": f"fork: {exc}"})
            return None
        if pid == 0:
            os.close(ready_r)
            os.close(end_r)
            for fd in (*self.pidfds.values(), *self.ends.values()):
                os.close(fd)
            return _child(request, fds, ready_w, self.sock, end_w)
        os.close(ready_w)
        os.close(end_w)
        self.pidfds[pid] = os.pidfd_open(pid)
        self.ends[pid] = end_r
        self.grace[pid] = exit_grace(request["env"])
        path = _write_environ(self.environ_dir, pid, request["env"])
        if path is not None:
            self.files[pid] = path
        os.read(ready_r, 1)  # its own session now: torchrun's killpg(pid) reaches it
        os.close(ready_r)
        _send(self.sock, {"pid": pid})
        return None


def fork_zygote(
    environ_dir: str,
    drop: Sequence[socket.socket] = (),
    prepare: Callable[[], str | None] = lambda: None,
) -> tuple[socket.socket, int] | Job:
    """Fork the zygote. In the caller: ``(channel, zygote pid)``. In a worker the zygote
    forks later: the :class:`Job` to run (the caller must run it with :func:`run_job`).
    ``drop``: the caller's sockets the zygote (and so its workers) must not hold. The
    zygote runs ``prepare`` (its imports, ``preload.py``) before it serves (the caller
    need not wait: a start request waits for them, and they were on every cold worker's
    critical path too); what it returns, if anything, is why the zygote may not fork,
    and every start request is then answered with it (the worker starts cold)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    pid = os.fork()
    if pid:
        theirs.close()
        return ours, pid
    ours.close()
    for other in drop:
        other.close()
    _prctl(PR_SET_NAME, ZYGOTE_NAME)
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the standby (the agent) is gone: so are we
    # A gentle stop signals every process of the attempt: the agent must still hear from
    # us while it stops its workers; we go when it does.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    return _Zygote(theirs, environ_dir, prepare()).serve()


def run_job(job: Job) -> None:
    """Run a worker's script or module as ``__main__``, as ``PYTHON -u`` would."""
    import io

    for fd, name, errors in ((1, "stdout", "strict"), (2, "stderr", "backslashreplace")):
        raw = io.FileIO(fd, "w", closefd=False)  # -u: unbuffered, every write goes out
        setattr(sys, name, io.TextIOWrapper(raw, encoding="utf-8", errors=errors,
                                            write_through=True))  # fmt: skip
    threads = job.env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    sys.argv = [job.target, *job.argv]
    try:
        _run_main(job)
    except SystemExit as exc:
        _say_ended(job, _exit_code(exc.code))
        raise
    except BaseException as exc:  # reported and ended as a cold interpreter ends it
        print_uncaught(exc)
        _say_ended(job, 1)
        raise SystemExit(1) from None
    _say_ended(job, 0)


def print_uncaught(exc: BaseException) -> None:
    """Print ``exc`` as a cold interpreter prints an uncaught exception: its traceback
    from the job's own frames on, without the standby's, the zygote's and runpy's
    (decision 0495; diagnose and the user read it). The trimmed traceback is set on the
    exception itself: the default hook (and rich's, loguru's...) print
    ``exc.__traceback__``, whatever traceback they are passed."""
    tb = exc.__traceback__
    while tb is not None and _ours(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    if tb is not None:
        exc.with_traceback(tb)
    sys.excepthook(type(exc), exc, exc.__traceback__)


# The standby's own ``__main__`` module (its frames still run below the script's) and,
# where runpy ran the script, the globals it returned: referenced until the interpreter
# finalises, as a cold interpreter's ``__main__`` is (decision 0490).
_KEPT: list[Any] = []


def _run_main(job: Job) -> None:
    """The script in a real ``__main__`` module that stays in ``sys.modules``: its
    globals (a gloo process group among them) are destroyed by the interpreter's
    finalisation, as a cold worker's are, not when a runpy temporary module is dropped
    while the library's threads still run (they wait for the GIL its destructor holds)."""
    import builtins
    import io
    import runpy
    import types

    _KEPT.append(sys.modules.get("__main__"))
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    if job.kind == "module":
        sys.path[0:0] = [os.getcwd()]
        as_main = getattr(runpy, "_run_module_as_main", None)  # what `python -m` runs
        if as_main is not None:
            as_main(job.target, True)
        else:
            _KEPT.append(runpy.run_module(job.target, run_name="__main__", alter_sys=True))
        return
    path = job.target
    sys.path[0:0] = [os.path.dirname(os.path.abspath(path))]
    if not os.path.isfile(path) or path.endswith((".pyc", ".zip")):
        _KEPT.append(runpy.run_path(path, run_name="__main__"))  # a directory, zip or .pyc
        return
    from importlib.machinery import SourceFileLoader

    with io.open_code(path) as fh:
        code = compile(fh.read(), path, "exec", dont_inherit=True)
    main.__dict__.update(
        __file__=path, __cached__=None, __builtins__=builtins,
        __loader__=SourceFileLoader("__main__", path),
    )  # fmt: skip
    exec(code, main.__dict__)


def _exit_code(code: object) -> int:
    """The exit status ``SystemExit(code)`` gives an interpreter."""
    return 0 if code is None else code & 0xFF if isinstance(code, int) else 1


def _say_ended(job: Job, code: int) -> None:
    """Tell the zygote the script ended with ``code``: from now on the worker has its
    grace to exit (its threads joined, its atexit run), then it is ended."""
    if os.getpid() != job.pid:
        return  # a child the script forked, ending through the script's frames
    with contextlib.suppress(OSError):
        os.write(job.end_fd, str(code).encode())
        os.close(job.end_fd)


def _ours(filename: str) -> bool:
    here = os.path.dirname(os.path.abspath(__file__))
    return filename.startswith(("<frozen runpy", here)) or "runpy" in os.path.basename(filename)


# --- the agent's side ------------------------------------------------------------------


class ZygoteGone(OSError):
    """The zygote no longer answers: start the worker with ``Popen``."""


class Client:
    """The agent's channel to its zygote: start requests and the workers' exit statuses."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock = sock
        self.pid = pid
        self._cond = threading.Condition()
        self._replies: list[dict[str, Any]] = []
        self._exits: dict[int, tuple[int, int]] = {}
        self._requests = threading.Lock()
        self.closed = False
        self.say: Callable[[str], None] | None = None  # into the attempt log (install)
        self._reader = threading.Thread(target=self._read, name="zygote", daemon=True)

    def start_reading(self) -> None:
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            with self._cond:
                if not data:
                    self.closed = True
                    self._cond.notify_all()
                    return
                body = json.loads(data)
                if "exit" in body:
                    self._exits[int(body["exit"])] = (int(body["status"][0]),
                                                      int(body["status"][1]))  # fmt: skip
                    if body.get("note") and self.say is not None:
                        self.say(str(body["note"]))
                else:
                    self._replies.append(body)
                self._cond.notify_all()

    def call(
        self, body: Mapping[str, Any], fds: Sequence[int] = (), timeout: float = 30.0
    ) -> dict[str, Any]:
        with self._requests:
            try:
                _send(self.sock, body, fds)
            except OSError as exc:
                raise ZygoteGone(f"the zygote is gone ({exc})") from exc
            deadline = time.monotonic() + timeout
            with self._cond:
                while not self._replies:
                    left = deadline - time.monotonic()
                    if self.closed or left <= 0:
                        raise ZygoteGone("the zygote did not answer")
                    self._cond.wait(left)
                return self._replies.pop(0)

    def dead(self) -> str | None:
        """Why the zygote (our child) is gone, or None while it runs."""
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return "the zygote is gone"
        if pid == 0:
            return None
        self.closed = True
        return f"the zygote died (exit {os.waitstatus_to_exitcode(status)})"

    def start(
        self,
        plan: tuple[str, str, list[str]],
        env: Mapping[str, str],
        cwd: str,
        fds: Sequence[int],
        args: Sequence[str] = (),
    ) -> WarmWorker:
        body = {"op": "start", "plan": list(plan), "env": dict(env), "cwd": cwd, "args": list(args)}
        reply = self.call(body, fds, START_SECONDS)
        if "pid" not in reply:
            raise ZygoteGone(str(reply.get("error", "the zygote did not start the worker")))
        return WarmWorker(self, int(reply["pid"]), [plan[1], *plan[2]])

    def status(self, pid: int, timeout: float) -> tuple[int, int] | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while pid not in self._exits:
                left = deadline - time.monotonic()
                if self.closed or left <= 0:
                    return None
                self._cond.wait(left)
            return self._exits.pop(pid)

    def reap(self, pid: int) -> None:
        with self._requests, contextlib.suppress(OSError):
            _send(self.sock, {"op": "reap", "pid": pid})


class WarmWorker:
    """What torchrun's ``SubprocessHandler.proc`` needs of a ``Popen``, for a forked worker."""

    def __init__(self, client: Client, pid: int, args: list[str]) -> None:
        self.client = client
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._pidfd: int | None = os.pidfd_open(pid)

    def _exited(self) -> bool:
        if self._pidfd is None:
            return True
        return bool(select.select([self._pidfd], [], [], 0)[0])

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        if not self._exited():
            return None
        # It has exited; the zygote's report is on its way (it reaps only after ours).
        status = self.client.status(self.pid, 5.0)
        if status is None and not self.client.closed:
            return None
        # Without the zygote nobody kept the status: it ended, and not as it should.
        self.returncode = returncode(status) if status is not None else -signal.SIGKILL
        self.client.reap(self.pid)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            code = self.poll()
            if code is not None:
                return code
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            if self._pidfd is not None:
                select.select([self._pidfd], [], [], 0.5 if left is None else min(left, 0.5))

    def send_signal(self, sig: int) -> None:
        if self.returncode is None and self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def install(client: Client, zygote_env: Mapping[str, str], say: Callable[[str], None]) -> None:
    """Make this agent start its script workers through ``client`` (cold when it cannot)."""
    from torch.distributed.elastic.multiprocessing.subprocess_handler import (
        subprocess_handler as handler_module,
    )

    cls: Any = handler_module.SubprocessHandler
    popen = cls._popen
    client.say = say
    said: set[str] = set()

    def cold(why: str) -> None:
        if why not in said:
            said.add(why)
            say(f"cold workers: {why}")

    def _popen(self: Any, args: tuple[str, ...], env: dict[str, str]) -> Any:
        what = plan(args, env, zygote_env, sys.executable)
        if isinstance(what, str):
            cold(what)
            return popen(self, args, env)
        out = self._stdout.fileno() if self._stdout is not None else 1
        err = self._stderr.fileno() if self._stderr is not None else 2
        try:
            return client.start(what, env, os.getcwd(), (0, out, err), args)
        except OSError as exc:
            cold(str(exc))
            return popen(self, args, env)

    cls._popen = _popen
