"""The buddy side channel under a flood of idle connections (decision 0412, issue 25 item 7).

A real two-rank torchrun job (gloo, CPU) with buddy copies over TCP, its file
descriptors limited to 256, and another process that opens well over a thousand idle
connections to both ranks' buddy ports and never sends a byte: the job keeps its
descriptors and threads bounded, trains every step, and each rank still holds its
buddy's copy of the newest snapshot.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FD_LIMIT = 256
STEPS = 30

JOB = r"""
import json, os, sys, threading, time
import torch
import torch.distributed as dist
from trainguard.train import CheckpointManager

dist.init_process_group("gloo")
rank = dist.get_rank()
ckpt = CheckpointManager(sys.argv[1], memory_snapshots=True)
link = ckpt.snapshots.buddy
def say(record):
    sys.stdout.write(json.dumps(record) + "\n")  # one write: whole on the shared pipe
    sys.stdout.flush()
say({"rank": rank, "host": link.endpoint.host, "port": link.endpoint.port})
deadline = time.time() + 180
while not os.path.exists(sys.argv[2]) and time.time() < deadline:
    time.sleep(0.05)
fds = threads = 0
w = torch.zeros(4096)
steps = int(sys.argv[3])
for step in range(1, steps + 1):
    w += 1
    ckpt.snapshot(step, {"w": w})
    dist.all_reduce(w)  # the training collective
    w /= 2
    fds = max(fds, len(os.listdir("/proc/self/fd")))
    threads = max(threads, threading.active_count())
    time.sleep(0.1)
ckpt.snapshots.wait()
dist.barrier()
held = {}
deadline = time.time() + 30
while time.time() < deadline:
    held = {o: [s.step for s in v] for o, v in link.held().items()}
    if held and max(max(v) for v in held.values()) == steps:
        break
    time.sleep(0.2)
say({"rank": rank, "done": step, "fds": fds, "threads": threads, "held": held,
     "refused": link.refused, "server_fds": link.open_fds()})
dist.barrier()
ckpt.close(keep_snapshots=True)
dist.destroy_process_group()
"""

FLOOD = r"""
import json, os, resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
stop, hold = sys.argv[1], int(sys.argv[2])
targets = [(h, int(p)) for h, p in (t.split(":") for t in sys.argv[3:])]
socks, opened, failed = [], 0, 0
while not os.path.exists(stop):
    for target in targets:
        try:
            socks.append(socket.create_connection(target, timeout=2))
            opened += 1
        except OSError:
            failed += 1
        if len(socks) > hold:
            socks.pop(0).close()
    if opened % 50 == 0:
        print(json.dumps({"opened": opened}), flush=True)
    time.sleep(0.002)
print(json.dumps({"opened": opened, "failed": failed, "final": True}), flush=True)
"""


def _lines(proc: subprocess.Popen[str], into: list[str]) -> threading.Thread:
    def run() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            into.append(line)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _records(lines: list[str], key: str) -> list[dict[str, object]]:
    """Every JSON object with ``key`` in the output (two ranks share the pipe: a line
    may hold more than one)."""
    decoder = json.JSONDecoder()
    text = "".join(lines)
    out = []
    at = text.find("{")
    while at >= 0:
        try:
            record, end = decoder.raw_decode(text, at)
        except ValueError:
            at = text.find("{", at + 1)
            continue
        if isinstance(record, dict) and key in record:
            out.append(record)
        at = text.find("{", end)
    return out


def _until(what: object, timeout: float, why: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(why)


def _limit_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def test_idle_connections_from_another_process_do_not_exhaust_the_job(tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    flood = tmp_path / "flood.py"
    flood.write_text(FLOOD)
    go, stop = tmp_path / "go", tmp_path / "stop"
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), TRAINGUARD_SNAPSHOT_BUDDY="1")
    env["TRAINGUARD_SNAPSHOT_DIR"] = str(tmp_path / "host{rank}")  # a "host" per rank
    for name in ("TRAINGUARD_SNAPSHOT_KEY", "TRAINGUARD_SNAPSHOT_SECRET", "MASTER_ADDR"):
        env.pop(name, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", str(job), str(tmp_path / "ck"), str(go), str(STEPS)]  # fmt: skip
    out: list[str] = []
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=_limit_fds,
    )  # fmt: skip
    reader = _lines(proc, out)
    flooder: subprocess.Popen[str] | None = None
    flood_out: list[str] = []
    try:
        _until(lambda: len(_records(out, "port")) == 2 or proc.poll() is not None, 180,
               "the ranks did not start")  # fmt: skip
        endpoints = _records(out, "port")
        assert len(endpoints) == 2, "".join(out)[-3000:]
        # One host: the side channel listens on loopback only.
        assert {e["host"] for e in endpoints} == {"127.0.0.1"}
        targets = [f"{e['host']}:{e['port']}" for e in endpoints]
        flooder = subprocess.Popen(
            [sys.executable, str(flood), str(stop), "1500", *targets],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        _lines(flooder, flood_out)
        _until(lambda: any(int(r["opened"]) >= 2 * FD_LIMIT for r in _records(flood_out, "opened")),  # type: ignore[call-overload]
               120, f"the flood did not get going: {flood_out[-3:]}")  # fmt: skip
        go.touch()
        assert proc.wait(300) == 0, "".join(out)[-4000:]
    finally:
        stop.touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        if flooder is not None:
            try:
                flooder.wait(60)
            except subprocess.TimeoutExpired:
                flooder.kill()
        reader.join(10)
    final = [r for r in _records(flood_out, "opened") if r.get("final")]
    assert final and int(final[0]["opened"]) > 4 * FD_LIMIT, flood_out[-3:]  # type: ignore[call-overload]
    text = "".join(out)
    assert "Too many open files" not in text and "EMFILE" not in text
    done = {int(r["rank"]): r for r in _records(out, "done")}  # type: ignore[call-overload]
    assert sorted(done) == [0, 1], text[-4000:]
    for rank, r in done.items():
        assert r["done"] == STEPS
        assert int(r["fds"]) < 100, f"rank {rank} held {r['fds']} descriptors"  # type: ignore[call-overload]
        assert int(r["threads"]) < 24, f"rank {rank} ran {r['threads']} threads"  # type: ignore[call-overload]
        assert int(r["refused"]) > 0  # type: ignore[call-overload]
        # The buddy copy of the newest snapshot arrived through the flood.
        held = r["held"]
        assert isinstance(held, dict) and max(held[str(1 - rank)]) == STEPS, held
