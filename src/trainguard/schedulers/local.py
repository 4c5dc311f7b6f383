"""The local scheduler: run a job's command on this machine and stop it cleanly.

``LocalScheduler.launch`` starts one attempt:

* environment (the job contract, docs/run.md): ``CUDA_VISIBLE_DEVICES`` = the
  indices of the assigned devices, ``TRAINGUARD_ATTEMPT``, ``TRAINGUARD_PROGRESS``,
  ``TRAINGUARD_DEVICES`` (JSON list of ``{index, uuid, pci_bus_id}``),
  ``TRAINGUARD_RESUME_FROM`` (only when restoring; removed otherwise so a stale
  value from the user's shell cannot leak in), the plan's extra variables
  (``PYTORCH_CUDA_ALLOC_CONF`` after an OOM), and ``PYTHONUNBUFFERED=1`` unless
  the user set it (progress lines must arrive when they are printed, not when a
  4 KiB pipe buffer fills);
* a new session (its own process group), so the user's Ctrl-C reaches
  trainguard, which then stops the whole tree itself;
* a watchdog between trainguard and the command (``_reaper.py``, decision 0113):
  the session's leader is a tiny child-subreaper process that starts the
  command and holds the read end of a pipe (the *lifeline*) whose only write end
  is trainguard's; when trainguard dies, however it dies, the pipe reaches
  end-of-file and the reaper stops every process of the job, ranks in sessions
  of their own included. ``LocalAttempt.pid`` is the reaper (the process group),
  ``launcher_pid`` the command; the reaper exits with the command's status;
* stdout/stderr through :class:`~trainguard.signals.output.OutputFollower` (echo to
  the user, per-attempt log file, lines to the controller), the launcher's exit
  through :class:`~trainguard.signals.process.LauncherWatcher` and every rank's
  death through :class:`~trainguard.signals.process.RankWatcher`.

``LocalAttempt.stop`` (the gentle path: an interrupt, the end of a job) sends
SIGTERM to the process group and to every descendant (torchrun starts each rank
in a session of its own), waits ``grace`` seconds, then SIGKILLs whatever is
left. ``LocalAttempt.kill`` (the fast path of a restart or a failed job, decision
0270) does not go through the torchrun agent's SIGTERM path, which costs 0.5–2.25 s
of agent teardown: it freezes the launcher (SIGSTOP, unless the launcher is a
rank itself), gives the ranks SIGTERM and at most ``kill_grace`` seconds (0.2 by
default: time enough for a rank that snapshots on the way down), then SIGKILLs the
whole tree. Both write the stop marker into the attempt's log before the first
signal (diagnose never names trainguard's own stop as the cause) and, after it,
how long the stop took. Signals go through pidfds taken before the first
signal, so a recycled pid is never hit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from trainguard.model import records
from trainguard.model.devices import Device
from trainguard.model.signature import ATTEMPT_MARKER, STOP_MARKER
from trainguard.model.snapshot import (
    FLUSHED_FILE,
    flush_signal_for,
    rank_dir_name,
    snapshot_base_for,
    user_dir_name,
)
from trainguard.schedulers import preload, standby, zygote
from trainguard.signals.output import LogFile, OutputFollower
from trainguard.signals.process import (
    LauncherWatcher,
    RankWatcher,
    catches_signal,
    descendants,
    read_environ,
    start_ticks,
)

STOPPED_LINE = "# trainguard: attempt {attempt} stopped in {seconds:.3f} s ({how})\n"

DEFAULT_GRACE_SECONDS = 5.0
DEFAULT_KILL_GRACE_SECONDS = 0.2  # fast kill: SIGTERM to the ranks -> SIGKILL to the tree
REAPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_reaper.py")
REPORT_TIMEOUT_SECONDS = 30.0
JOB_ID_ENV = records.JOB_ID_ENV  # the job contract's variable (model.records)


@dataclass(frozen=True)
class LaunchSpec:
    command: tuple[str, ...]
    attempt: int
    devices: tuple[Device, ...]
    progress_url: str | None
    log_path: str | None
    resume_from: str | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    echo: bool = True
    cwd: str | None = None
    job_id: str | None = None  # exported as TRAINGUARD_JOB_ID
    grace: float = DEFAULT_GRACE_SECONDS  # the reaper's SIGTERM -> SIGKILL grace


def attempt_env(spec: LaunchSpec, base: Mapping[str, str]) -> dict[str, str]:
    """The environment of one attempt: ``base`` plus the trainguard contract."""
    env = dict(base)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d.index) for d in spec.devices)
    env["TRAINGUARD_ATTEMPT"] = str(spec.attempt)
    if spec.job_id:
        env[JOB_ID_ENV] = spec.job_id
    else:
        env.pop(JOB_ID_ENV, None)
    env["TRAINGUARD_DEVICES"] = json.dumps(
        [{"index": d.index, "uuid": d.uuid, "pci_bus_id": d.pci_bus_id} for d in spec.devices],
        separators=(",", ":"),
    )
    if spec.progress_url:
        env["TRAINGUARD_PROGRESS"] = spec.progress_url
    else:
        env.pop("TRAINGUARD_PROGRESS", None)
    if spec.resume_from:
        env["TRAINGUARD_RESUME_FROM"] = spec.resume_from
    else:
        env.pop("TRAINGUARD_RESUME_FROM", None)
    env.pop("TRAINGUARD_RESUME_DIGEST", None)  # only ever from extra_env: never stale
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(spec.extra_env)
    return env


class LocalAttempt:
    """One running attempt: its process tree and the observers attached to it."""

    def __init__(
        self,
        spec: LaunchSpec,
        proc: subprocess.Popen[bytes],
        followers: list[OutputFollower],
        ranks: RankWatcher,
        log: LogFile | None,
        started_at: float,
        launcher_pid: int | None = None,
        lifeline: int | None = None,
    ) -> None:
        self.spec = spec
        self.proc = proc
        self.followers = followers
        self.ranks = ranks
        self.log = log
        self.started_at = started_at
        self.launcher_pid = launcher_pid if launcher_pid is not None else proc.pid
        self._lifeline = lifeline
        self._stop_lock = threading.Lock()
        self.stop_seconds: float | None = None  # how long the last stop/kill took
        # "warm start: ..." / "cold start: <why not warm>"; None without --warm-standby
        self.start_note: str | None = None

    @property
    def pid(self) -> int:
        """The session leader: the reaper (its pid is the attempt's process group)."""
        return self.proc.pid

    @property
    def pgid(self) -> int:
        return self.proc.pid

    def close_lifeline(self) -> None:
        """Let go of the watchdog: it stops whatever of the job is still running."""
        fd, self._lifeline = self._lifeline, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float = DEFAULT_GRACE_SECONDS) -> int | None:
        """Terminate the whole tree (SIGTERM, then SIGKILL after ``grace``); returns the code."""
        with self._stop_lock:
            began = time.monotonic()
            self._mark(f"SIGTERM to process group {self.pgid}")
            pidfds = self._pin({})
            try:
                self._signal_all(pidfds, signal.SIGTERM)
                deadline = time.monotonic() + grace
                while time.monotonic() < deadline and self._alive(pidfds):
                    time.sleep(0.02)
                if self._alive(pidfds):
                    self._signal_all(self._pin(pidfds), signal.SIGKILL)  # new ones too
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(max(grace, 5.0))
            finally:
                _close_all(pidfds)
            self._stopped(began, f"SIGTERM, SIGKILL after {grace:g} s")
            return self.proc.returncode

    def kill(
        self, grace: float = DEFAULT_KILL_GRACE_SECONDS, flush_wait: float = 0.0
    ) -> int | None:
        """Stop the tree fast, not through the launcher (decision 0270); returns the code.

        The launcher is frozen first (SIGSTOP) so that it neither restarts the
        ranks nor starts its own slow teardown; the ranks and helpers get SIGTERM
        and up to ``grace`` seconds; then everything, the reaper included, gets
        SIGKILL. A launcher that is a rank itself (Lightning, decision 0147) is
        treated as a rank. With ``flush_wait`` > 0, ranks that catch the memory-snapshot
        flush signal get it first and up to ``flush_wait`` s to complete their newest
        snapshot (decision 0261), so a hang loses no more than a crash.
        """
        with self._stop_lock:
            began = time.monotonic()
            self._mark(f"SIGKILL to process group {self.pgid} after {grace:g} s")
            pidfds = self._pin({})
            try:
                frozen = {self.proc.pid}
                launcher = self.launcher_pid
                if launcher in pidfds and read_environ(launcher).get("LOCAL_RANK") is None:
                    with contextlib.suppress(OSError):
                        signal.pidfd_send_signal(pidfds[launcher], signal.SIGSTOP)
                    frozen.add(launcher)
                if flush_wait > 0:
                    self._flush_snapshots(pidfds, frozen, flush_wait)
                if grace > 0:
                    others = {p: fd for p, fd in pidfds.items() if p not in frozen}
                    for fd in others.values():
                        with contextlib.suppress(OSError):
                            signal.pidfd_send_signal(fd, signal.SIGTERM)
                    deadline = time.monotonic() + grace
                    while time.monotonic() < deadline and self._alive(others):
                        time.sleep(0.01)
                self._signal_all(self._pin(pidfds), signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(5.0)
            finally:
                _close_all(pidfds)
            self._stopped(began, f"SIGKILL after {grace:g} s")
            return self.proc.returncode

    def _flush_snapshots(self, pidfds: dict[int, int], frozen: set[int], wait: float) -> None:
        """Ask every rank that listens for it to flush its memory snapshot; wait until each
        one's ``flushed.json`` is newer than the request, or ``wait`` s."""
        began, wall = time.monotonic(), time.time()
        expected: list[Path] = []
        for pid, fd in pidfds.items():
            if pid in frozen:
                continue
            env = read_environ(pid)
            raw_rank = env.get("RANK") or env.get("LOCAL_RANK")
            sig = flush_signal_for(env)
            if raw_rank is None or not raw_rank.isdigit() or sig is None:
                continue
            if not catches_signal(pid, sig):
                continue  # no snapshots there; the signal's default would kill it
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(fd, sig)
                rank = int(raw_rank)
                # The rank's own user directory only (decision 0411): another user's
                # files say nothing about this job.
                mine = snapshot_base_for(rank, env) / user_dir_name(os.getuid())
                expected.append(mine / rank_dir_name(rank))
        if not expected:
            return

        def flushed(rank_dir: Path) -> bool:
            top, name = rank_dir.parent, rank_dir.name
            with contextlib.suppress(OSError):
                if top.lstat().st_uid != os.getuid():
                    return False
                for job in top.iterdir():
                    with contextlib.suppress(OSError):
                        if (job / name / FLUSHED_FILE).stat().st_mtime >= wall - 0.01:
                            return True
            return False

        pending = list(expected)
        deadline = began + wait
        while pending and time.monotonic() < deadline:
            pending = [d for d in pending if not flushed(d)]
            if pending:
                time.sleep(0.02)
        done = len(expected) - len(pending)
        self._mark(
            f"memory snapshots flushed by {done} of {len(expected)} rank(s) in "
            f"{time.monotonic() - began:.2f} s"
        )

    def _mark(self, what: str) -> None:
        """Say in the attempt's own log that what follows is our doing (diagnose)."""
        if self.log is not None and self.running():
            at = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            self.log.write(f"{STOP_MARKER} {self.spec.attempt}: {what} at {at}\n".encode())

    def _stopped(self, began: float, how: str) -> None:
        self.stop_seconds = time.monotonic() - began
        if self.log is not None:
            line = STOPPED_LINE.format(
                attempt=self.spec.attempt, seconds=self.stop_seconds, how=how
            )
            self.log.write(line.encode())

    def _pin(self, pidfds: dict[int, int]) -> dict[int, int]:
        """Take a pidfd on the reaper and every descendant not yet pinned."""
        for pid in [self.proc.pid, *descendants(self.proc.pid)]:
            if pid not in pidfds:
                with contextlib.suppress(OSError):
                    pidfds[pid] = os.pidfd_open(pid)
        return pidfds

    def _signal_all(self, pidfds: dict[int, int], sig: int) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, sig)
        for fd in pidfds.values():
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(fd, sig)

    def _alive(self, pidfds: dict[int, int]) -> bool:
        import select

        for pid, fd in pidfds.items():
            if pid == self.proc.pid:
                if self.proc.poll() is None:
                    return True
                continue
            # A pidfd polls readable once the process has exited.
            readable, _, _ = select.select([fd], [], [], 0)
            if not readable:
                return True
        return False

    def wait_closed(self, timeout: float = 5.0) -> None:
        """Wait for the output pipes to drain (after the tree is gone), then close the log."""
        deadline = time.monotonic() + timeout
        for f in self.followers:
            f.join(max(0.0, deadline - time.monotonic()))
        self.ranks.stop()
        if not self.running():
            self.close_lifeline()
        if self.log is not None:
            self.log.close()


class LocalScheduler:
    """Launch attempts on this machine."""

    def __init__(
        self,
        sink: Callable[[Any], None],
        clock: Callable[[], float] = time.time,
        base_env: Mapping[str, str] | None = None,
        stdout: IO[bytes] | None = None,
        stderr: IO[bytes] | None = None,
        warm_standby: bool = False,
        warm_workers: bool = False,
    ) -> None:
        self.sink = sink
        self.clock = clock
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.stdout = stdout if stdout is not None else sys.stdout.buffer
        self.stderr = stderr if stderr is not None else sys.stderr.buffer
        self.warm_standby = warm_standby
        # Warm workers (decision 0310): the standby forks a zygote; the workers it forks
        # write their environments here (a forked process's /proc environ is its parent's).
        self._environ_dir: str | None = None
        if warm_standby and warm_workers:
            self._environ_dir = tempfile.mkdtemp(prefix="trainguard-warm-")
        self._parked: standby.Parked | None = None
        self._parking: threading.Thread | None = None
        self._park_lock = threading.Lock()
        self._closed = False

    def launch(self, spec: LaunchSpec) -> LocalAttempt:
        """Start the attempt; raises ``OSError`` when the command cannot be started.

        With ``warm_standby`` the parked standby becomes the attempt's torchrun agent
        when it can (decision 0271), else the attempt starts cold and the log says why;
        either way a new standby is parked for the next attempt.
        """
        env = attempt_env(spec, self.base_env)
        log = LogFile(spec.log_path) if spec.log_path else None
        if log is not None:
            header = (
                f"{ATTEMPT_MARKER} {spec.attempt}: {' '.join(spec.command)}\n"
                f"# CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}"
                + (f" TRAINGUARD_RESUME_FROM={spec.resume_from}" if spec.resume_from else "")
                + "\n"
            )
            log.write(header.encode())
        note: str | None = None
        try:
            warm: tuple[subprocess.Popen[bytes], int, int] | None = None
            if self.warm_standby:
                warm, note = self._take_standby(spec, env)
            proc, launcher_pid, lifeline = warm or _start_with_reaper(spec, env)
        except OSError:
            if log is not None:
                log.close()
            raise
        started_at = self.clock()
        if log is not None and note is not None:
            log.write(f"# trainguard: {note}\n".encode())
        assert proc.stdout is not None and proc.stderr is not None
        followers = [
            OutputFollower(
                proc.stdout,
                "stdout",
                spec.attempt,
                self.sink,
                self.stdout if spec.echo else None,
                log,
                self.clock,
            ).start(),
            OutputFollower(
                proc.stderr,
                "stderr",
                spec.attempt,
                self.sink,
                self.stderr if spec.echo else None,
                log,
                self.clock,
            ).start(),
        ]
        ranks = RankWatcher(proc.pid, spec.attempt, self.sink, self.clock).start()
        LauncherWatcher(proc, spec.attempt, self.sink, self.clock).start()
        attempt = LocalAttempt(
            spec, proc, followers, ranks, log, started_at, launcher_pid, lifeline
        )
        attempt.start_note = note
        if self.warm_standby:
            self._park_next(spec, env)
        return attempt

    # --- the warm standby (decision 0271) ----------------------------------------------

    def park(self, spec: LaunchSpec) -> None:
        """Park a standby for an attempt like ``spec`` before any attempt ran here (a hot
        spare node of an allocation, decision 0511: its first attempt starts warm too)."""
        if self.warm_standby:
            self._park_next(spec, attempt_env(spec, self.base_env))

    def _park_next(self, spec: LaunchSpec, env: Mapping[str, str]) -> None:
        """Park a standby for the next attempt, in the background (launch must not wait)."""
        if isinstance(standby.warm_command(spec.command, env), str):
            return
        with self._park_lock:
            if self._closed or self._parked is not None or self._parking is not None:
                return
            thread = threading.Thread(
                target=self._park, args=(spec, dict(env)), name="standby", daemon=True
            )
            self._parking = thread
        thread.start()

    def _park(self, spec: LaunchSpec, env: dict[str, str]) -> None:
        parked: standby.Parked | None = None
        try:
            what = standby.warm_command(spec.command, env)
            if isinstance(what, str):
                return
            interpreter = what[0]
            park_env = dict(env)
            for key in ("TRAINGUARD_RESUME_FROM", "TRAINGUARD_RESUME_DIGEST", "TRAINGUARD_ATTEMPT"):
                park_env.pop(key, None)
            park_env["TRAINGUARD_STANDBY"] = "1"
            park_env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU while parked; the attempt's at wake
            if self._environ_dir is not None:
                park_env[standby.ZYGOTE_ENVIRON_VAR] = self._environ_dir
                plan = preload.plan_for(what[1], os.path.abspath(spec.cwd or os.getcwd()))
                park_env[preload.PRELOAD_VAR] = "\n".join(plan)
            ours, theirs = socket.socketpair()
            try:
                # Room to show a restarted worker's own command line and environment.
                arg_space, env_space = zygote.title_space(spec.command)
                park_env[zygote.TITLE_SPACE_VAR] = env_space
                command = (
                    interpreter, standby.STANDBY, "--channel", str(theirs.fileno()),
                    zygote.TITLE_SPACE_ARG, arg_space,
                )  # fmt: skip
                proc, pid, lifeline = _start_with_reaper(
                    dataclasses.replace(spec, command=command), park_env, (theirs.fileno(),)
                )
            except OSError:
                ours.close()
                return
            finally:
                theirs.close()
            standby.idle(pid)  # at once: the standby sets it too, after its start-up
            parked = standby.Parked(
                proc, pid, lifeline, ours, interpreter, standby.interpreter_env(env),
                time.monotonic(),
            )  # fmt: skip
        finally:
            with self._park_lock:
                self._parking = None
                if parked is not None and not self._closed and self._parked is None:
                    self._parked, parked = parked, None
        if parked is not None:
            parked.dismiss()

    def _take_standby(
        self, spec: LaunchSpec, env: Mapping[str, str]
    ) -> tuple[tuple[subprocess.Popen[bytes], int, int] | None, str]:
        """The parked standby turned into this attempt's agent, or ``None`` and why not."""
        what = standby.warm_command(spec.command, env)
        if isinstance(what, str):
            return None, f"cold start: {what}"
        parking = self._parking
        if parking is not None:
            parking.join(REPORT_TIMEOUT_SECONDS)
        with self._park_lock:
            parked, self._parked = self._parked, None
        if parked is None:
            return None, "cold start: no standby was parked (first attempt, or it failed to start)"
        interpreter, args, script_dir = what
        try:
            if parked.proc.poll() is not None:
                return None, f"cold start: the standby died (exit {parked.proc.returncode})"
            if parked.interpreter != interpreter:
                return None, (
                    f"cold start: the standby runs {parked.interpreter}, the attempt {interpreter}"
                )
            if parked.interp_env != standby.interpreter_env(env):
                changed = sorted(
                    set(parked.interp_env.items()) ^ set(standby.interpreter_env(env).items())
                )
                names = ", ".join(sorted({k for k, _ in changed}))
                return None, f"cold start: environment differs from the standby's ({names})"
            waited = time.monotonic()
            problem = parked.wait_ready(standby.READY_SECONDS)
            if problem is not None:
                return None, f"cold start: {problem}"
            waited = time.monotonic() - waited
            cwd = os.path.abspath(spec.cwd or os.getcwd())
            # What a cold launcher shows in /proc: a console script's #! interpreter, its
            # path and arguments; `python -m torch.distributed.run ...` as given.
            title = (
                (interpreter, os.path.join(script_dir, os.path.basename(spec.command[0])), *args)
                if script_dir is not None
                else tuple(spec.command)
            )
            line = standby.request_line(
                ("torchrun", *args), env, cwd, script_dir if script_dir is not None else cwd,
                title=title,
            )  # fmt: skip
            problem = parked.hand_over(line)
            if problem is not None:
                return None, f"cold start: {problem}"
            taken, parked = parked, None
            return (taken.proc, taken.launcher_pid, taken.take_lifeline()), (
                f"warm start: standby pid {taken.launcher_pid} (parked "
                f"{time.monotonic() - taken.parked_at:.1f} s before, waited {waited:.2f} s "
                "for its imports) is this attempt's torchrun agent"
                + (f"; {taken.workers_note}" if taken.workers_note else "")
            )
        finally:
            if parked is not None:
                parked.dismiss()

    def close(self) -> None:
        """Dismiss the parked standby (the job is over); launch no more after this."""
        with self._park_lock:
            self._closed = True
            parking = self._parking
        if parking is not None:
            parking.join(REPORT_TIMEOUT_SECONDS)
        with self._park_lock:
            parked, self._parked = self._parked, None
        if parked is not None:
            parked.dismiss(wait=5.0)
        if self._environ_dir is not None:
            shutil.rmtree(self._environ_dir, ignore_errors=True)


def _close_all(fds: Mapping[int, int]) -> None:
    for fd in fds.values():
        with contextlib.suppress(OSError):
            os.close(fd)


def _start_with_reaper(
    spec: LaunchSpec, env: Mapping[str, str], extra_fds: Sequence[int] = ()
) -> tuple[subprocess.Popen[bytes], int, int]:
    """Start the reaper in a new session; it starts the command. Raises ``OSError``.

    Returns the reaper's Popen, the command's pid and the write end of the
    lifeline (close it, or die, and the reaper stops the job).
    """
    life_r, life_w = os.pipe()
    report_r, report_w = os.pipe()
    argv = [
        sys.executable, "-I", "-S", REAPER,
        "--lifeline", str(life_r), "--report", str(report_w), "--grace", f"{spec.grace:g}",
        "--", *spec.command,
    ]  # fmt: skip
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            cwd=spec.cwd,
            start_new_session=True,
            pass_fds=(life_r, report_w, *extra_fds),
        )
    except OSError:
        for fd in (life_r, life_w, report_r, report_w):
            os.close(fd)
        raise
    os.close(life_r)
    os.close(report_w)
    try:
        line = _read_report(report_r, REPORT_TIMEOUT_SECONDS)
    finally:
        os.close(report_r)
    kind, _, rest = line.partition(" ")
    if kind == "ok":
        return proc, int(rest), life_w
    os.close(life_w)  # the reaper stops whatever it started, then exits
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5.0)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    if kind == "error":
        code, _, message = rest.partition(" ")
        raise OSError(int(code) if code.isdigit() else 0, message or "cannot start")
    raise OSError(f"the process watchdog did not start {spec.command[0]!r}")


def _read_report(fd: int, timeout: float) -> str:
    """The reaper's one-line report (``ok PID`` / ``error ERRNO MESSAGE``); '' on EOF/timeout."""
    import select

    data = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        readable, _, _ = select.select([fd], [], [], left)
        if not readable:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


def job_processes(job_id: str, exclude: Sequence[int] = ()) -> list[int]:
    """Pids of every process whose environment says it belongs to ``job_id``.

    Found through ``TRAINGUARD_JOB_ID`` in ``/proc/PID/environ`` (readable for our
    own processes), so a rank re-parented to init after its launcher and reaper
    died is found too. Pids in ``exclude`` (ourselves) are skipped.
    """
    skip = {os.getpid(), *exclude}
    out: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for name in entries:
        if not name.isdigit():
            continue
        pid = int(name)
        if pid in skip:
            continue
        if read_environ(pid).get(JOB_ID_ENV) == job_id:
            out.append(pid)
    return sorted(out)


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def process_identity(pid: int | None = None) -> dict[str, Any]:
    """Who a process is, durably: pid, host, boot id and start time (decision 0114).

    pid alone is not an identity: pids are reused. With the boot id and the start
    time, :func:`identity_alive` can tell the very same process from a newcomer.
    """
    pid = os.getpid() if pid is None else pid
    return {
        "pid": pid,
        "host": socket.gethostname(),
        "boot_id": _boot_id(),
        "start_ticks": start_ticks(pid),
    }


def identity_alive(ident: Mapping[str, Any]) -> bool | None:
    """Whether the process ``ident`` describes is still running.

    ``None`` when it cannot be told from here (another host); ``False`` when the
    host rebooted since, the pid is gone, or the pid now belongs to another process.
    """
    if ident.get("host") != socket.gethostname():
        return None
    boot = _boot_id()
    if ident.get("boot_id") and boot and ident.get("boot_id") != boot:
        return False
    try:
        pid = int(ident["pid"])
    except (KeyError, TypeError, ValueError):
        return False
    ticks = start_ticks(pid)
    if ticks is None:
        return False
    if ident.get("start_ticks") is not None and ticks != ident.get("start_ticks"):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().decode(errors="replace").rsplit(") ", 1)[1][:1]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def kill_processes(pids: Sequence[int], grace: float = DEFAULT_GRACE_SECONDS) -> list[int]:
    """SIGTERM ``pids``, wait up to ``grace`` s, SIGKILL the rest; returns those still alive.

    Signals go through pidfds taken first, so a recycled pid is never hit.
    """
    import select

    fds: dict[int, int] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            fds[pid] = os.pidfd_open(pid)
    try:

        def alive() -> list[int]:
            return [p for p, fd in fds.items() if not select.select([fd], [], [], 0)[0]]

        for fd in fds.values():
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(fd, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in alive():
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(fds[pid], signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        return alive()
    finally:
        for fd in fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)


def visible_devices(devices: Sequence[Device]) -> str:
    return ",".join(str(d.index) for d in devices)


class LocalProcesses:
    """This host's processes as the engine reads and stops them when it adopts a dead
    run's job (controller/engine/adoption.py's ``HostProcesses``)."""

    def me(self) -> dict[str, Any]:
        return process_identity()

    def alive(self, ident: Mapping[str, Any]) -> bool | None:
        return identity_alive(ident)

    def of_job(self, job_id: str) -> list[int]:
        return job_processes(job_id)

    def kill(self, pids: Sequence[int], grace: float) -> list[int]:
        return kill_processes(pids, grace)


__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "DEFAULT_KILL_GRACE_SECONDS",
    "JOB_ID_ENV",
    "LaunchSpec",
    "LocalAttempt",
    "LocalProcesses",
    "LocalScheduler",
    "attempt_env",
    "identity_alive",
    "job_processes",
    "kill_processes",
    "process_identity",
    "visible_devices",
]
