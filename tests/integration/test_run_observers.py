"""The observers behind ``trainguard run`` on real files, sockets, pipes and processes."""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from trainguard.model import Device, ProgressEvent
from trainguard.schedulers.local import LaunchSpec, LocalScheduler, attempt_env
from trainguard.signals.kernel_log import FileFollower, KernelLine, open_kernel_log
from trainguard.signals.output import LogFile, OutputClosed, OutputFollower, OutputLine
from trainguard.signals.process import (
    AttemptProcessExit,
    RankWatcher,
    descendants,
    exit_status,
    is_spawn_child,
    rank_zero_launcher,
    spawn_ranks,
)
from trainguard.signals.progress import ProgressListener, ProgressReceived, short_socket_dir


class Sink:
    def __init__(self) -> None:
        self.q: queue.Queue[Any] = queue.Queue()

    def __call__(self, ev: Any) -> None:
        self.q.put(ev)

    def drain(self) -> list[Any]:
        out = []
        while True:
            try:
                out.append(self.q.get_nowait())
            except queue.Empty:
                return out

    def wait_for(self, kind: type, timeout: float = 10.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                ev = self.q.get(timeout=0.05)
            except queue.Empty:
                continue
            if isinstance(ev, kind):
                return ev
        raise AssertionError(f"no {kind.__name__} within {timeout} s")


def texts(events: list[Any]) -> list[str]:
    return [e.text for e in events if isinstance(e, KernelLine)]


def test_kernel_file_follower_starts_at_the_end_and_survives_truncation_and_rotation(
    tmp_path: Path,
) -> None:
    log = tmp_path / "kern.log"
    log.write_text("old line 1\nold line 2\n")
    sink = Sink()
    f = FileFollower(str(log), sink)
    f.poll_once()
    assert texts(sink.drain()) == []  # only lines written after start
    with log.open("ab") as fh:
        fh.write(b"NVRM: Xid (PCI:0000:11:00): 79, GPU has fallen off the bus.\npart")
    f.poll_once()
    assert texts(sink.drain()) == ["NVRM: Xid (PCI:0000:11:00): 79, GPU has fallen off the bus."]
    with log.open("ab") as fh:
        fh.write(b"ial line\n\xff\xfe garbage \x00 bytes\n")
    f.poll_once()
    assert texts(sink.drain()) == ["partial line", "\ufffd\ufffd garbage \x00 bytes"]
    log.write_text("after truncation\n")  # truncated in place (smaller than before)
    f.poll_once()
    assert texts(sink.drain()) == ["after truncation"]
    log.rename(tmp_path / "kern.log.1")
    f.poll_once()  # mid-rotation: the path is missing
    (tmp_path / "kern.log").write_text("in the new file\n")
    f.poll_once()
    assert texts(sink.drain()) == ["in the new file"]


def test_kernel_file_follower_waits_for_a_missing_file_and_runs_as_a_thread(
    tmp_path: Path,
) -> None:
    log = tmp_path / "later.log"
    sink = Sink()
    f = FileFollower(str(log), sink).start()
    try:
        time.sleep(0.1)
        log.write_text("first line of a new file\n")
        ev = sink.wait_for(KernelLine, 5)
        assert ev.text == "first line of a new file"
    finally:
        f.stop()


def test_open_kernel_log_with_a_file_says_so(tmp_path: Path) -> None:
    follower, description = open_kernel_log(str(tmp_path / "k.log"), Sink())
    assert isinstance(follower, FileFollower) and "k.log" in description


def test_progress_listener_receives_events_and_drops_garbage() -> None:
    sink = Sink()
    d = short_socket_dir()
    listener = ProgressListener(os.path.join(d, "p.sock"), sink).start()
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.sendto(b"not json at all", listener.path)
        s.sendto(b'{"event": "nonsense", "step": 1, "time": 0}', listener.path)
        ev = ProgressEvent(event="progress", step=42, time=time.time(), rank=1, attempt=3)
        s.sendto(ev.to_json().encode(), listener.path)
        got = sink.wait_for(ProgressReceived)
        assert got.event.step == 42 and got.event.rank == 1 and got.event.attempt == 3
        assert listener.malformed == 2 and listener.received == 1
        s.close()
    finally:
        listener.stop()
    assert not os.path.exists(listener.path)


def test_output_follower_echoes_logs_and_emits_lines(tmp_path: Path) -> None:
    sink = Sink()
    data = b"step=1 loss=0.5\n\xff bad utf8\n" + b"x" * 70000 + b"\nno newline at end"
    echo = io.BytesIO()
    log = LogFile(str(tmp_path / "attempt-0.log"))
    follower = OutputFollower(io.BytesIO(data), "stdout", 0, sink, echo, log).start()
    follower.join(5)
    log.close()
    events = sink.drain()
    lines = [e.text for e in events if isinstance(e, OutputLine)]
    assert lines[0] == "step=1 loss=0.5" and lines[1] == "\ufffd bad utf8"
    assert lines[-1] == "no newline at end"
    assert sum(len(x) for x in lines[2:-1]) == 70000  # long line cut, nothing lost
    assert isinstance(events[-1], OutputClosed)
    assert echo.getvalue() == data
    assert (tmp_path / "attempt-0.log").read_bytes() == data


RANK_TREE = r"""
import os, subprocess, sys, time
env = dict(os.environ, LOCAL_RANK="1", RANK="1")
# Like torchrun: the rank in a session of its own; the parent does not reap it quickly.
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env,
                         start_new_session=True)
print(child.pid, flush=True)
time.sleep(60)
"""


def test_rank_watcher_sees_a_rank_die_at_once_with_its_signal() -> None:
    sink = Sink()
    parent = subprocess.Popen(
        [sys.executable, "-c", RANK_TREE], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert parent.stdout is not None
        rank_pid = int(parent.stdout.readline())
        watcher = RankWatcher(parent.pid, 7, sink, rescan=0.05).start()
        deadline = time.monotonic() + 10
        while watcher.rank_pids() != {1: rank_pid}:
            assert time.monotonic() < deadline, watcher.rank_pids()
            time.sleep(0.02)
        killed_at = time.time()
        os.kill(rank_pid, signal.SIGKILL)
        ev = sink.wait_for(AttemptProcessExit, 5)
        assert ev.attempt == 7
        assert (ev.exit.pid, ev.exit.local_rank, ev.exit.rank) == (rank_pid, 1, 1)
        assert ev.exit.signal == signal.SIGKILL and ev.exit.failed
        assert ev.exit.at - killed_at < 0.5
        watcher.stop()
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()


RANK0_LAUNCHER = r"""
import os, subprocess, sys, time
# Like Lightning's own launcher: this process is rank 0 and starts rank 1 as a plain
# child (same session) with LOCAL_RANK in its environment; it has none itself.
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                         env=dict(os.environ, LOCAL_RANK="1"))
print(child.pid, flush=True)
time.sleep(60)
"""


def test_a_launcher_that_is_rank0_is_watched_as_rank0_and_its_death_seen_at_once() -> None:
    sink = Sink()
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK")}
    launcher = subprocess.Popen(
        [sys.executable, "-c", RANK0_LAUNCHER],
        stdout=subprocess.PIPE,
        start_new_session=True,
        env=env,
    )
    try:
        assert launcher.stdout is not None
        rank1 = int(launcher.stdout.readline())
        watcher = RankWatcher(launcher.pid, 3, sink, rescan=0.05).start()
        deadline = time.monotonic() + 10
        while watcher.rank_pids() != {0: launcher.pid, 1: rank1}:
            assert time.monotonic() < deadline, watcher.rank_pids()
            time.sleep(0.02)
        killed_at = time.time()
        os.kill(launcher.pid, signal.SIGKILL)
        ev = sink.wait_for(AttemptProcessExit, 5)
        assert (ev.exit.pid, ev.exit.local_rank, ev.exit.rank) == (launcher.pid, 0, 0)
        assert ev.exit.signal == signal.SIGKILL and ev.exit.at - killed_at < 0.5
        watcher.stop()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()


SPAWN_JOB = r"""
import multiprocessing as mp, os, sys, time

def worker(index, go):
    # A spawn-context data-loader worker of its own: under a rank, so no rank.
    helper = mp.get_context("spawn").Process(target=time.sleep, args=(60,))
    helper.start()
    if index == 2:
        while not os.path.exists(go):
            time.sleep(0.02)
        helper.kill()
        sys.exit(0)  # a clean exit
    time.sleep(60)

if __name__ == "__main__":
    # Like torch.multiprocessing.spawn: a queue first (it starts the resource tracker,
    # a spawn-style child that is no rank), then rank i started only after rank i - 1.
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    procs = [ctx.Process(target=worker, args=(i, sys.argv[1])) for i in range(3)]
    for p in procs:
        p.start()
    print(" ".join(str(p.pid) for p in procs), flush=True)
    time.sleep(60)
"""


def test_spawn_children_are_ranks_in_start_order_and_only_their_failures_reported(
    tmp_path: Path,
) -> None:
    sink = Sink()
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK")}
    go, script = tmp_path / "go", tmp_path / "spawn_job.py"
    script.write_text(SPAWN_JOB)  # spawn children import __main__ from a file, not -c
    job = subprocess.Popen(
        [sys.executable, str(script), str(go)],
        stdout=subprocess.PIPE,
        start_new_session=True,
        env=env,
    )
    try:
        watcher = RankWatcher(job.pid, 5, sink, rescan=0.05).start()
        assert job.stdout is not None
        pids = [int(x) for x in job.stdout.readline().split()]
        deadline = time.monotonic() + 60
        while watcher.rank_pids() != dict(enumerate(pids)):
            assert time.monotonic() < deadline, (watcher.rank_pids(), pids)
            time.sleep(0.02)
        assert sorted((v.rank, v.local_rank) for v in watcher.views()) == [(0, 0), (1, 1), (2, 2)]
        go.touch()
        while Path(f"/proc/{pids[2]}").exists() and " Z " not in Path(
            f"/proc/{pids[2]}/stat"
        ).read_text(errors="replace"):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.3)
        assert sink.drain() == []  # rank 2's clean exit is the launcher's to report
        killed_at = time.time()
        os.kill(pids[1], signal.SIGKILL)
        ev = sink.wait_for(AttemptProcessExit, 5)
        assert (ev.exit.pid, ev.exit.local_rank, ev.exit.rank) == (pids[1], 1, 1)
        assert ev.exit.signal == signal.SIGKILL and ev.exit.at - killed_at < 0.5
        watcher.stop()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)
        job.wait()


REAPING_PARENT = r"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
child.wait()  # reaps at once, as mp.spawn's join does
time.sleep(60)
"""


def test_the_status_of_a_rank_its_parent_reaped_at_once_is_read_through_the_pidfd() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", REAPING_PARENT], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        fd = os.pidfd_open(child)
        os.kill(child, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child}").exists():  # reaped by its parent, not by us
            assert time.monotonic() < deadline
            time.sleep(0.01)
        kernel = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
        if kernel < (6, 15):
            pytest.skip("PIDFD_GET_INFO needs Linux 6.15")
        assert exit_status(child, fd) == (None, signal.SIGKILL)
        os.close(fd)
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()


def test_spawn_rank_numbering_rules() -> None:
    main = b"from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)"
    spawn = [b"/usr/bin/python3", b"-c", main, b"--multiprocessing-fork"]
    tracker = [b"/usr/bin/python3", b"-c",
               b"from multiprocessing.resource_tracker import main;main(4)"]  # fmt: skip
    assert is_spawn_child(spawn)
    assert not is_spawn_child(tracker) and not is_spawn_child([b"python", b"train.py"])
    # Creation order is rank order: start time first, pid between children of one tick.
    assert spawn_ranks(0, [(105, 30), (100, 41), (100, 40)]) == {40: 0, 41: 1, 30: 2}
    # Found in a later scan: numbered after those found before.
    assert spawn_ranks(2, [(120, 50)]) == {50: 2}


def test_rank_zero_launcher_rule() -> None:
    py = [b"python", b"train.py"]
    assert rank_zero_launcher({}, py, [1], same_session=True)
    assert rank_zero_launcher({}, py, [2, 1, 3], same_session=True)
    assert not rank_zero_launcher({}, py, [0, 1], same_session=True)  # torchrun-like parent
    assert not rank_zero_launcher({}, py, [1, 3], same_session=True)  # not 1..k
    assert not rank_zero_launcher({}, py, [1], same_session=False)  # workers in own sessions
    assert not rank_zero_launcher({"LOCAL_RANK": "0"}, py, [1], same_session=True)
    torchrun = [b"/usr/bin/python", b"-m", b"torch.distributed.run", b"train.py"]
    assert not rank_zero_launcher({}, torchrun, [1], same_session=True)


def test_attempt_env_is_the_job_contract() -> None:
    devices = (
        Device(index=2, uuid="GPU-2", pci_bus_id="0000:12:00.0"),
        Device(index=3, uuid="GPU-3", pci_bus_id="0000:13:00.0"),
    )
    spec = LaunchSpec(
        command=("true",),
        attempt=2,
        devices=devices,
        progress_url="unix:/tmp/x.sock",
        log_path=None,
        resume_from="/ck/step_00000010",
        extra_env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    )
    env = attempt_env(spec, {"PATH": "/bin", "TRAINGUARD_RESUME_FROM": "stale"})
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env["TRAINGUARD_ATTEMPT"] == "2"
    assert env["TRAINGUARD_RESUME_FROM"] == "/ck/step_00000010"
    assert env["TRAINGUARD_PROGRESS"] == "unix:/tmp/x.sock"
    assert json.loads(env["TRAINGUARD_DEVICES"]) == [
        {"index": 2, "uuid": "GPU-2", "pci_bus_id": "0000:12:00.0"},
        {"index": 3, "uuid": "GPU-3", "pci_bus_id": "0000:13:00.0"},
    ]
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert env["PYTHONUNBUFFERED"] == "1" and env["PATH"] == "/bin"
    fresh = attempt_env(
        LaunchSpec(("true",), 0, devices, None, None), {"TRAINGUARD_RESUME_FROM": "stale"}
    )
    assert "TRAINGUARD_RESUME_FROM" not in fresh


def test_stopping_an_attempt_kills_ranks_in_their_own_sessions(tmp_path: Path) -> None:
    sink = Sink()
    # The rank ignores SIGTERM: only the SIGKILL after the grace period ends it.
    ready = tmp_path / "ready"
    tree = RANK_TREE.replace(
        '"import time; time.sleep(60)"',
        '"import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); '
        f"open({str(ready)!r}, 'w').close(); time.sleep(60)\"",
    )
    spec = LaunchSpec(
        command=(sys.executable, "-c", tree),
        attempt=0,
        devices=(),
        progress_url=None,
        log_path=str(tmp_path / "a.log"),
        echo=False,
    )
    attempt = LocalScheduler(sink).launch(spec)
    deadline = time.monotonic() + 10
    while not descendants(attempt.pid):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    rank = descendants(attempt.pid)[0]
    while not ready.exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    started = time.monotonic()
    attempt.stop(grace=0.5)
    assert time.monotonic() - started >= 0.5  # SIGTERM was ignored: SIGKILL after the grace
    attempt.wait_closed(5)
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{rank}") and time.monotonic() < deadline:
        with open(f"/proc/{rank}/stat") as fh:
            if fh.read().split(") ")[1].startswith("Z"):
                break  # killed, waiting for init to reap it
        time.sleep(0.02)
    alive = os.path.exists(f"/proc/{rank}")
    if alive:
        with open(f"/proc/{rank}/stat") as fh:
            alive = not fh.read().split(") ")[1].startswith("Z")
    assert not alive
    assert not attempt.running()


def test_without_journal_or_kmsg_the_user_is_told_xids_will_not_be_seen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trainguard.signals import kernel_log

    monkeypatch.setattr(kernel_log, "_journal_has_kernel_entries", lambda: False)
    monkeypatch.setattr(kernel_log, "_kmsg_readable", lambda: False)
    follower, description = kernel_log.open_kernel_log(None, Sink())
    assert follower is None
    assert "XID events will not be seen" in description and "--kernel-log" in description


def test_kmsg_follower_starts_at_the_end_and_stops_cleanly() -> None:
    from trainguard.signals import kernel_log

    if not kernel_log._kmsg_readable():
        pytest.skip("/dev/kmsg is not readable here")
    sink = Sink()
    f = kernel_log.KmsgFollower(sink).start()
    time.sleep(0.3)
    f.stop()
    assert not f.thread.is_alive()
    assert texts(sink.drain()) == []  # nothing old replayed
