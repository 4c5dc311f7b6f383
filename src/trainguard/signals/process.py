"""Watch the processes of a job: the launched command and every rank under it.

* :class:`LauncherWatcher` waits for the command trainguard started (often
  ``torchrun``) and reports its exit status.
* :class:`RankWatcher` finds the worker processes under it (the topmost
  descendants whose environment has ``LOCAL_RANK``; torchrun starts each in its
  own session) and watches each through a pidfd, so a rank's death is seen
  the moment it happens — not when torchrun's 0.1 s monitor loop notices it and
  stops the others. The exit status of a process that is not our child is read
  from ``/proc/PID/stat`` while it is a zombie (before torchrun reaps it), or
  once reaped through the pidfd (``PIDFD_GET_INFO``, Linux 6.15+); when both
  fail the status is reported as unknown and torchrun's own summary line
  supplies it.
* A launcher that is rank 0 itself (Lightning's own launcher: the script runs as
  local rank 0 and starts local ranks 1.. as its children, with ``LOCAL_RANK`` in
  their environment but not in its own): a process whose rank children are
  exactly local ranks 1..k, that has no ``LOCAL_RANK`` and is not torchrun, is
  local rank 0 (:func:`rank_zero_launcher`), watched like any rank, so its death
  is seen at once and blamed on rank 0 (decision 0147).
* ``torch.multiprocessing.spawn`` (``mp.spawn``): the script is no rank; its
  children run ``from multiprocessing.spawn import spawn_main`` and get their
  rank as an argument, never in their environment. A non-rank process's
  spawn children are its ranks in the order it started them
  (:func:`spawn_ranks`: ``mp.spawn`` starts rank ``i`` only after ``i - 1``),
  watched like any rank (decision 0280). Only their failures are reported: a
  clean exit is not taken as "the job is finishing", since spawn-context
  DataLoader workers of a single-process job look the same from outside.

:func:`descendants` is also what the local scheduler uses to kill the whole
tree, since ranks in their own sessions escape a process-group kill.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import selectors
import signal
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainguard.diagnose.detectors import ProcessExit, RankView

RESCAN_SECONDS = 0.2


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (all its threads), from /proc; [] when it is gone."""
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


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid``, parents before children."""
    seen: list[int] = []
    stack = [pid]
    visited = {pid}
    while stack:
        for child in children(stack.pop()):
            if child not in visited:
                visited.add(child)
                seen.append(child)
                stack.append(child)
    return seen


def catches_signal(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler installed for ``sig`` (``SigCgt`` in
    /proc/PID/status): a signal it does not catch may kill it (SIGUSR1's default)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        return False
    return False


# A warm worker (decision 0310) is forked by a zygote, so /proc/PID/environ shows the
# zygote's exec-time environment; the zygote writes the worker's own into
# $TRAINGUARD_WARM_ENVIRON/PID-STARTTICKS.env (schedulers/zygote.py writes it).
WARM_ENVIRON_VAR = "TRAINGUARD_WARM_ENVIRON"


def read_environ(pid: int) -> dict[str, str]:
    """The environment of ``pid``: as it was exec'd, or a warm worker's own (0310)."""
    env = _parse_environ(f"/proc/{pid}/environ")
    where = env.get(WARM_ENVIRON_VAR)
    if where:
        ticks = start_ticks(pid)
        if ticks is not None:
            own = _parse_environ(os.path.join(where, f"{pid}-{ticks}.env"))
            if own:
                return own
    return env


def _parse_environ(path: str) -> dict[str, str]:
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError:
        return {}
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def zombie_status(pid: int) -> tuple[int | None, int | None]:
    """``(exit_code, signal)`` of a process that has exited but is not yet reaped.

    ``(None, None)`` when the process is running, gone, or unreadable.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
    except OSError:
        return None, None
    rest = stat[stat.rfind(")") + 2 :].split()
    # rest[0] is field 3 (state); field 52 is exit_code (waitpid status).
    if not rest or rest[0] not in ("Z", "X") or len(rest) < 50:
        return None, None
    try:
        status = int(rest[49])
    except ValueError:
        return None, None
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), None
    return None, None


# ioctl(pidfd, PIDFD_GET_INFO, struct pidfd_info) (Linux 6.15+): _IOWR(0xFF, 11, 64 bytes).
_PIDFD_GET_INFO = (3 << 30) | (64 << 16) | (0xFF << 8) | 11
_PIDFD_INFO_EXIT = 1 << 3


def pidfd_exit_status(pidfd: int) -> tuple[int | None, int | None]:
    """``(exit_code, signal)`` of a reaped process, through the pidfd we hold on it.

    The kernel (6.15+) keeps a process's wait status for the holders of a pidfd
    once its parent has reaped it, which is the race :func:`zombie_status` loses
    to a parent that reaps at once (``mp.spawn``'s join). ``(None, None)`` on an
    older kernel or before the reap.
    """
    buf = bytearray(struct.pack("=Q", _PIDFD_INFO_EXIT) + bytes(56))
    try:
        fcntl.ioctl(pidfd, _PIDFD_GET_INFO, buf, True)
    except OSError:
        return None, None
    (mask,) = struct.unpack_from("=Q", buf, 0)
    (status,) = struct.unpack_from("=i", buf, 60)  # after mask, cgroupid and 11 ids
    if not mask & _PIDFD_INFO_EXIT:
        return None, None
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), None
    return None, None


def exit_status(pid: int, pidfd: int, tries: int = 5) -> tuple[int | None, int | None]:
    """The status of an exited process that is not our child: as a zombie, else once reaped.

    Between the two (the parent reaping it right now) neither answers: a few
    short retries cover that window.
    """
    for i in range(tries):
        code, sig = zombie_status(pid)
        if code is None and sig is None:
            code, sig = pidfd_exit_status(pidfd)
        if code is not None or sig is not None:
            return code, sig
        if i + 1 < tries:
            time.sleep(0.005)
    return None, None


_TORCHRUN_MARKERS = (b"torchrun", b"torch.distributed.run", b"torch.distributed.launch")
_SPAWN_MARKER = b"from multiprocessing.spawn import spawn_main"


def read_cmdline(pid: int) -> list[bytes]:
    """The command line of ``pid`` split on NULs; [] when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().split(b"\0")
    except OSError:
        return []


def is_spawn_child(cmdline: list[bytes]) -> bool:
    """Was this process started by ``multiprocessing``'s spawn method (as ``mp.spawn`` does)?"""
    return any(_SPAWN_MARKER in part for part in cmdline) and b"--multiprocessing-fork" in cmdline


def start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: when the process started, in clock ticks since boot
    (with the pid, what tells a process from a later one given the same pid)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
        return int(stat[stat.rfind(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def spawn_ranks(known: int, new: list[tuple[int, int]]) -> dict[int, int]:
    """``{pid: rank}`` for a parent's newly found spawn children.

    ``known`` is how many of its spawn children were already numbered; ``new``
    the others as ``(start_time, pid)``. ``mp.spawn`` starts rank ``i`` only once
    rank ``i - 1`` has been started, so creation order is rank order: by start
    time, then pid (two children may start in the same clock tick; pids grow
    between wrap-arounds). A child found in a later scan was started later than
    every child numbered before it.
    """
    return {pid: known + i for i, (_, pid) in enumerate(sorted(new))}


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
        return int(stat[stat.rfind(")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def rank_zero_launcher(
    parent_env: dict[str, str],
    parent_cmdline: list[bytes],
    child_local_ranks: list[int],
    same_session: bool,
) -> bool:
    """Is a process with these rank children local rank 0 itself?

    Yes when its children are local ranks 1..k (no 0: the parent is it), in its
    own session (a launcher that is a rank starts the others as plain children;
    torchrun starts every worker in a session of its own), it has no
    ``LOCAL_RANK`` of its own (it was not started as a rank) and it is not
    torchrun (one whose rank 0 already died unseen must not be taken for rank 0).
    """
    if not child_local_ranks or not same_session or "LOCAL_RANK" in parent_env:
        return False
    if any(m in part for part in parent_cmdline for m in _TORCHRUN_MARKERS):
        return False
    return sorted(child_local_ranks) == list(range(1, len(child_local_ranks) + 1))


def _int(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def likely_first(
    exits: list[tuple[int, int | None, int | None]], parents: dict[int, int | None]
) -> list[tuple[int, int | None, int | None]]:
    """``(pid, exit code, signal)`` of processes seen dead together, the likely first
    death first: a parent of another one of them (its death can end its child, not the
    reverse), then a death by a signal other than SIGTERM (sent from outside; SIGTERM is
    a launcher ending the others) before an exit with a code (often a reaction to a lost
    peer); otherwise in the order given."""
    dead = {pid for pid, _, _ in exits}
    return sorted(
        exits,
        key=lambda e: (
            not any(parents.get(p) == e[0] for p in dead if p != e[0]),
            e[2] is None or e[2] == signal.SIGTERM,
        ),
    )


@dataclass(frozen=True)
class AttemptProcessExit:
    """A :class:`ProcessExit` tagged with the attempt it belongs to."""

    attempt: int
    exit: ProcessExit


class LauncherWatcher:
    """Report the launched command's exit as a :class:`ProcessExit` (source ``launcher``)."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        attempt: int,
        sink: Callable[[Any], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.proc = proc
        self.attempt = attempt
        self.sink = sink
        self.clock = clock
        self.thread = threading.Thread(target=self._run, name=f"launcher-{attempt}", daemon=True)

    def start(self) -> LauncherWatcher:
        self.thread.start()
        return self

    def _run(self) -> None:
        rc = self.proc.wait()
        at = self.clock()
        code, sig = (rc, None) if rc >= 0 else (None, -rc)
        self.sink(
            AttemptProcessExit(
                attempt=self.attempt,
                exit=ProcessExit(at=at, source="launcher", pid=self.proc.pid, exit_code=code,
                                 signal=sig),
            )
        )  # fmt: skip


class RankWatcher:
    """Discover the ranks under ``root_pid`` and report each one's death at once."""

    def __init__(
        self,
        root_pid: int,
        attempt: int,
        sink: Callable[[Any], None],
        clock: Callable[[], float] = time.time,
        rescan: float = RESCAN_SECONDS,
    ) -> None:
        self.root_pid = root_pid
        self.attempt = attempt
        self.sink = sink
        self.clock = clock
        self.rescan = rescan
        self.ranks: dict[int, tuple[int | None, int | None]] = {}  # pid -> (rank, local_rank)
        self.visible: dict[int, tuple[str, ...]] = {}  # pid -> its CUDA_VISIBLE_DEVICES
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._selector = selectors.DefaultSelector()
        self._fds: dict[int, int] = {}  # pid -> pidfd
        self._spawn_count: dict[int, int] = {}  # parent -> spawn children numbered so far
        self._spawn_pids: set[int] = set()  # ranks found as spawn children
        # pid -> its parent when found: a child whose parent dies is reparented.
        self._parents: dict[int, int | None] = {}
        self.thread = threading.Thread(target=self._run, name=f"ranks-{attempt}", daemon=True)

    def start(self) -> RankWatcher:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(2.0)

    def views(self) -> list[RankView]:
        """The job's own device map: each rank found and the devices it was given."""
        with self._lock:
            return [
                RankView(rank, local, self.visible.get(pid, ()))
                for pid, (rank, local) in self.ranks.items()
            ]

    def rank_pids(self) -> dict[int, int]:
        """``{local_rank: pid}`` of the ranks found so far."""
        with self._lock:
            return {lr: pid for pid, (_, lr) in self.ranks.items() if lr is not None}

    def _scan(self) -> None:
        is_rank: dict[int, bool] = {}
        spawned: dict[int, list[tuple[int, int]]] = {}  # parent -> [(start time, pid)]
        for pid in descendants(self.root_pid):
            if pid in self.ranks or pid in is_rank:
                continue
            env = read_environ(pid)
            local = _int(env.get("LOCAL_RANK"))
            is_rank[pid] = local is not None
            ppid = _ppid(pid)
            if ppid is None:
                continue
            # A data-loader worker inherits LOCAL_RANK from its rank, and the workers a
            # spawn rank starts are spawn children too: only the topmost counts.
            under_rank = ppid in self.ranks or bool(is_rank.get(ppid))
            if local is None:
                if not under_rank and env and is_spawn_child(read_cmdline(pid)):
                    started = start_ticks(pid)
                    if started is not None:
                        spawned.setdefault(ppid, []).append((started, pid))
                        is_rank[pid] = True
                continue
            if not under_rank:
                self._watch(pid, _int(env.get("RANK")), local, env)
        for ppid, new in spawned.items():
            self._watch_spawned(ppid, new)
        self._find_rank_zero_launchers()

    def _watch_spawned(self, ppid: int, new: list[tuple[int, int]]) -> None:
        """Watch a parent's spawn children as its ranks 0.., in the order it started them."""
        known = self._spawn_count.get(ppid, 0)
        numbered = spawn_ranks(known, new)
        self._spawn_count[ppid] = known + len(numbered)
        for pid, index in numbered.items():
            env = read_environ(pid)
            # On a node other than the first the global rank is the script's own sum.
            node = _int(env.get("NODE_RANK") or env.get("GROUP_RANK"))
            self._spawn_pids.add(pid)
            self._watch(pid, index if not node else None, index, env)

    def _watch(self, pid: int, rank: int | None, local: int, env: dict[str, str]) -> None:
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return
        cvd = env.get("CUDA_VISIBLE_DEVICES")
        self._parents[pid] = _ppid(pid)
        with self._lock:
            self.ranks[pid] = (rank, local)
            if cvd is not None:
                self.visible[pid] = tuple(x.strip() for x in cvd.split(",") if x.strip())
        self._fds[pid] = fd
        self._selector.register(fd, selectors.EVENT_READ, pid)

    def _find_rank_zero_launchers(self) -> None:
        """The parent of ranks 1..k that is rank 0 itself (see :func:`rank_zero_launcher`)."""
        by_parent: dict[int, list[int]] = {}
        sessions: dict[int, bool] = {}
        for pid, (_, local) in list(self.ranks.items()):
            ppid = _ppid(pid)
            if local is not None and ppid is not None and ppid not in self.ranks:
                by_parent.setdefault(ppid, []).append(local)
                try:
                    same = os.getsid(pid) == os.getsid(ppid)
                except OSError:
                    same = False
                sessions[ppid] = sessions.get(ppid, True) and same
        for ppid, locals_ in by_parent.items():
            if ppid != self.root_pid and ppid not in descendants(self.root_pid):
                continue
            cmdline = read_cmdline(ppid)
            if not cmdline:
                continue
            env = read_environ(ppid)
            if not rank_zero_launcher(env, cmdline, locals_, sessions.get(ppid, False)):
                continue
            node = _int(env.get("NODE_RANK") or env.get("GROUP_RANK"))
            # Rank 0 of its node: global rank node x processes per node (one node: 0).
            self._watch(ppid, (node or 0) * (len(locals_) + 1), 0, env)

    def _report(self, at: float, pids: list[int]) -> None:
        """Report the ranks found dead in one wake-up, the likely first death first.

        Deaths seen together happened between two looks, in an order the pidfds do not
        keep: a rank that is the parent of another one seen dead with it goes first
        (its death can end its child, not the reverse), then a death by a signal (sent
        from outside) before an exit with a code (often the reaction to a lost peer).
        Each gets ``at`` plus a microsecond per place, so the order is the record's."""
        exits: list[tuple[int, int | None, int | None]] = []
        for pid in pids:
            code, sig = exit_status(pid, self._fds[pid])
            self._selector.unregister(self._fds[pid])
            os.close(self._fds.pop(pid))
            exits.append((pid, code, sig))
        for place, (pid, code, sig) in enumerate(likely_first(exits, self._parents)):
            rank, local = self.ranks.get(pid, (None, None))
            if pid in self._spawn_pids and code == 0:
                continue  # a clean spawn child exit: the launcher's exit says it
            self.sink(
                AttemptProcessExit(
                    attempt=self.attempt,
                    exit=ProcessExit(
                        at=at + place * 1e-6,
                        source="rank",
                        pid=pid,
                        rank=rank,
                        local_rank=local,
                        exit_code=code,
                        signal=sig,
                    ),
                )
            )

    def _run(self) -> None:
        next_scan = 0.0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_scan:
                    with contextlib.suppress(OSError):
                        self._scan()
                    next_scan = now + self.rescan
                if not self._fds:
                    self._stop.wait(max(0.0, next_scan - time.monotonic()))
                    continue
                ready = self._selector.select(timeout=max(0.0, next_scan - now))
                if ready:
                    self._report(self.clock(), [int(key.data) for key, _ in ready])
        finally:
            for fd in self._fds.values():
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._fds.clear()
            self._selector.close()


__all__ = [
    "AttemptProcessExit",
    "LauncherWatcher",
    "RankWatcher",
    "children",
    "descendants",
    "exit_status",
    "is_spawn_child",
    "likely_first",
    "pidfd_exit_status",
    "rank_zero_launcher",
    "read_cmdline",
    "read_environ",
    "spawn_ranks",
    "zombie_status",
]
