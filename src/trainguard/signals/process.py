"""Watch the processes of a job: the launched command and every rank under it.

* :class:`LauncherWatcher` waits for the command trainguard started (often
  ``torchrun``) and reports its exit status.
* :class:`RankWatcher` finds the worker processes under it (the topmost
  descendants whose environment has ``LOCAL_RANK``; torchrun starts each in its
  own session) and watches each through a pidfd, so a rank's death is seen
  the moment it happens — not when torchrun's 0.1 s monitor loop notices it and
  stops the others. The exit status of a process that is not our child is read
  from ``/proc/PID/stat`` while it is a zombie (before torchrun reaps it);
  when that race is lost the status is reported as unknown and torchrun's own
  summary line supplies it.
* A launcher that is rank 0 itself (Lightning's own launcher: the script runs as
  local rank 0 and starts local ranks 1.. as its children, with ``LOCAL_RANK`` in
  their environment but not in its own): a process whose rank children are
  exactly local ranks 1..k, that has no ``LOCAL_RANK`` and is not torchrun, is
  local rank 0 (:func:`rank_zero_launcher`), watched like any rank, so its death
  is seen at once and blamed on rank 0 (decision 0147).

:func:`descendants` is also what the local scheduler uses to kill the whole
tree, since ranks in their own sessions escape a process-group kill.
"""

from __future__ import annotations

import contextlib
import os
import selectors
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


def read_environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
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


_TORCHRUN_MARKERS = (b"torchrun", b"torch.distributed.run", b"torch.distributed.launch")


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
        for pid in descendants(self.root_pid):
            if pid in self.ranks or pid in is_rank:
                continue
            env = read_environ(pid)
            local = _int(env.get("LOCAL_RANK"))
            is_rank[pid] = local is not None
            if local is None:
                continue
            ppid = _ppid(pid)
            if ppid is None:
                continue
            # A data-loader worker inherits LOCAL_RANK from its rank: only the topmost counts.
            if ppid in self.ranks or is_rank.get(ppid):
                continue
            self._watch(pid, _int(env.get("RANK")), local, env)
        self._find_rank_zero_launchers()

    def _watch(self, pid: int, rank: int | None, local: int, env: dict[str, str]) -> None:
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return
        cvd = env.get("CUDA_VISIBLE_DEVICES")
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
            try:
                with open(f"/proc/{ppid}/cmdline", "rb") as fh:
                    cmdline = fh.read().split(b"\0")
            except OSError:
                continue
            env = read_environ(ppid)
            if not rank_zero_launcher(env, cmdline, locals_, sessions.get(ppid, False)):
                continue
            node = _int(env.get("NODE_RANK") or env.get("GROUP_RANK"))
            # Rank 0 of its node: global rank node x processes per node (one node: 0).
            self._watch(ppid, (node or 0) * (len(locals_) + 1), 0, env)

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
                for key, _ in self._selector.select(timeout=max(0.0, next_scan - now)):
                    pid = int(key.data)
                    code, sig = zombie_status(pid)
                    at = self.clock()
                    self._selector.unregister(key.fd)
                    os.close(self._fds.pop(pid))
                    rank, local = self.ranks.get(pid, (None, None))
                    self.sink(
                        AttemptProcessExit(
                            attempt=self.attempt,
                            exit=ProcessExit(
                                at=at,
                                source="rank",
                                pid=pid,
                                rank=rank,
                                local_rank=local,
                                exit_code=code,
                                signal=sig,
                            ),
                        )
                    )
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
    "rank_zero_launcher",
    "read_environ",
    "zombie_status",
]
