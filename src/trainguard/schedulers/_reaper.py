"""The watchdog between ``trainguard run`` and a job's launcher (decision 0113).

    python -I -S _reaper.py --lifeline FD --report FD --grace S -- COMMAND [ARGS...]

The local scheduler starts this small program in a new session instead of the
job's command, and it starts the command. Its one purpose: **the job never
outlives its supervisor**, however the supervisor ends (SIGKILL, OOM killer,
a crash). It

1. becomes a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): a process of the
   job that loses its parent (a rank whose torchrun died; a helper started in
   a session of its own) is re-parented to the reaper instead of init, so the
   whole tree stays findable under it;
2. starts COMMAND as its child with ``PR_SET_PDEATHSIG=SIGTERM``: if the reaper
   itself is killed, torchrun is still asked to stop its ranks;
3. reports ``ok PID`` (or ``error ERRNO MESSAGE`` when COMMAND cannot be
   started) on the ``--report`` descriptor, then closes it;
4. waits for either the launcher's exit or end-of-file on ``--lifeline``, the
   read end of a pipe whose only write end the supervisor holds: end-of-file
   means the supervisor is gone, whatever killed it;
5. when the supervisor is gone: SIGTERM to every descendant, ``--grace``
   seconds, SIGKILL to whatever is left, then exits;
6. when the launcher exits: the same to any leftover descendant (an orphaned
   rank, a stray helper), then exits with the launcher's status (its exit code,
   or the same signal), so the supervisor sees what it would have seen;
7. forwards SIGTERM, SIGINT and SIGHUP it receives to the launcher;
8. with ``TRAINGUARD_STATUS_PREFIX`` in its environment, writes the launcher's own end
   (``exit N`` / ``signal N``) to ``PREFIX.attempt-<TRAINGUARD_ATTEMPT>.status`` first:
   a supervisor that dies before it read the status learns it from there when the
   next one takes the job over (decision 0385). Not when the supervisor is gone.

Standard library only, and it does not import trainguard: it must start in
milliseconds and must not be breakable by the package it protects.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import select
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
EXIT_CANNOT_START = 127
STATUS_ENV = "TRAINGUARD_STATUS_PREFIX"
POLL_SECONDS = 0.05

_libc: ctypes.CDLL | None = None


def _prctl(option: int, value: int) -> bool:
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        return int(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _say(message: str) -> None:
    # The supervisor may be gone: its end of our stderr pipe with it.
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"trainguard-reaper: {message}\n")
        sys.stderr.flush()


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out.extend(int(x) for x in fh.read().split())
        except (OSError, ValueError):
            continue
    return out


def _descendants(pid: int) -> list[int]:
    seen: list[int] = []
    stack = [pid]
    visited = {pid}
    while stack:
        for child in _children(stack.pop()):
            if child not in visited:
                visited.add(child)
                seen.append(child)
                stack.append(child)
    return seen


def _alive(pid: int) -> bool:
    """Running (not a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
    except OSError:
        return False
    rest = stat[stat.rfind(")") + 2 :].split()
    return bool(rest) and rest[0] not in ("Z", "X")


def _reap() -> dict[int, int]:
    """Collect every exited child (ours, or an orphan re-parented to us): ``{pid: status}``."""
    done: dict[int, int] = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        if pid == 0:
            return done
        done[pid] = status


def _spawn(command: list[str]) -> tuple[int, None] | tuple[None, str]:
    """Fork and exec ``command``; ``(pid, None)`` or ``(None, "ERRNO MESSAGE")``."""
    err_r, err_w = os.pipe()  # close-on-exec: EOF on a successful exec
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: only async-signal-tolerant work until exec
        try:
            os.close(err_r)
            # Python ignores SIGPIPE and SIGXFSZ; an ignored signal stays ignored across
            # exec, and the job must get the defaults.
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
            signal.set_wakeup_fd(-1)
            _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:  # the reaper died before the prctl took effect
                os._exit(EXIT_CANNOT_START)
            os.execvp(command[0], command)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.write(err_w, f"{exc.errno or 0} {exc.strerror or exc}".encode())
        finally:
            os._exit(EXIT_CANNOT_START)
    os.close(err_w)
    chunks = []
    while True:
        try:
            data = os.read(err_r, 4096)
        except InterruptedError:
            continue
        if not data:
            break
        chunks.append(data)
    os.close(err_r)
    if chunks:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        return None, b"".join(chunks).decode(errors="replace")
    return pid, None


def _signal_all(pids: dict[int, int], sig: int) -> None:
    for fd in pids.values():
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(fd, sig)


def _pin(pids: dict[int, int]) -> None:
    """Take a pidfd on every current descendant (a pidfd never hits a recycled pid)."""
    for pid in _descendants(os.getpid()):
        if pid not in pids:
            with contextlib.suppress(OSError):
                pids[pid] = os.pidfd_open(pid)


def stop_tree(grace: float, statuses: dict[int, int]) -> None:
    """SIGTERM every descendant, wait up to ``grace`` s, SIGKILL the rest, reap them all."""
    pids: dict[int, int] = {}
    try:
        _pin(pids)
        if not pids:
            return
        _signal_all(pids, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            statuses.update(_reap())
            if not any(_alive(pid) for pid in pids):
                break
            time.sleep(POLL_SECONDS)
        _pin(pids)  # what was started meanwhile, too
        if any(_alive(pid) for pid in pids):
            _signal_all(pids, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            statuses.update(_reap())
            if not any(_alive(pid) for pid in _descendants(os.getpid())):
                break
            time.sleep(POLL_SECONDS)
        statuses.update(_reap())
    finally:
        for fd in pids.values():
            with contextlib.suppress(OSError):
                os.close(fd)


def _write_status(prefix: str | None, status: int) -> None:
    """The launcher's end, written whole (rename) for a supervisor that may not read
    our exit status (module docstring, 8)."""
    if not prefix:
        return
    if os.WIFSIGNALED(status):
        line = f"signal {os.WTERMSIG(status)}\n"
    else:
        line = f"exit {os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1}\n"
    path = f"{prefix}.attempt-{os.environ.get('TRAINGUARD_ATTEMPT', '0')}.status"
    with contextlib.suppress(OSError):
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(line)
        os.replace(path + ".tmp", path)


def _exit_like(status: int) -> None:
    """Exit with the launcher's status: its code, or death by the same signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the job dumped, not us
        with contextlib.suppress(OSError, ValueError):  # SIGKILL/SIGSTOP have no handler
            signal.signal(sig, signal.SIG_DFL)
        with contextlib.suppress(OSError, ValueError):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        with contextlib.suppress(OSError):
            os.kill(os.getpid(), sig)
        time.sleep(0.1)  # delivery is asynchronous for a few signals
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _parse(argv: list[str]) -> tuple[int, int, float, list[str]]:
    lifeline = report = -1
    grace = 5.0
    i = 0
    while i < len(argv) and argv[i] != "--":
        key, value = argv[i], argv[i + 1] if i + 1 < len(argv) else ""
        if key == "--lifeline":
            lifeline = int(value)
        elif key == "--report":
            report = int(value)
        elif key == "--grace":
            grace = float(value)
        else:
            raise ValueError(f"unknown option {key}")
        i += 2
    command = argv[i + 1 :]
    if lifeline < 0 or report < 0 or not command:
        raise ValueError("usage: _reaper.py --lifeline FD --report FD [--grace S] -- COMMAND...")
    return lifeline, report, grace, command


def main(argv: list[str]) -> int:
    try:
        lifeline, report, grace, command = _parse(argv)
    except ValueError as exc:
        _say(str(exc))
        return 2
    for fd in (lifeline, report):
        os.set_inheritable(fd, False)  # the job must not hold them
    if not _prctl(PR_SET_CHILD_SUBREAPER, 1):
        _say("cannot become a child subreaper; orphaned processes may escape")
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    forward: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        forward.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    signal.signal(signal.SIGCHLD, lambda _s, _f: None)  # only to wake select()

    status_prefix = os.environ.pop(STATUS_ENV, None)  # ours, not the job's
    launcher, error = _spawn(command)
    with contextlib.suppress(OSError):
        os.write(report, (f"ok {launcher}\n" if launcher else f"error {error}\n").encode())
        os.close(report)
    if launcher is None:
        return EXIT_CANNOT_START

    statuses: dict[int, int] = {}
    supervisor_gone = False
    while launcher not in statuses:
        try:
            readable, _, _ = select.select([lifeline, wake_r], [], [], 1.0)
        except OSError:
            readable = []
        if wake_r in readable:
            with contextlib.suppress(OSError):
                while os.read(wake_r, 512):
                    pass
        while forward:
            with contextlib.suppress(OSError):
                os.kill(launcher, forward.pop(0))
        statuses.update(_reap())
        if lifeline in readable:
            try:
                data = os.read(lifeline, 512)
            except OSError:
                data = b""
            if not data:
                supervisor_gone = True
                break
    if supervisor_gone:
        _say("the supervisor is gone: stopping every process of the job")
        stop_tree(grace, statuses)
        return 1
    _write_status(status_prefix, statuses[launcher])
    stop_tree(grace, statuses)  # leftovers of a launcher that exited
    _exit_like(statuses[launcher])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
