#!/usr/bin/env python3
"""Drive ``trainguard serve`` with a realistic fleet from a separate process on loopback.

    .venv/bin/python bench/control_plane_load.py [--agents 2048] [--jobs 500] [--duration 60]

What runs:

* the server: a real ``trainguard serve`` process (SQLite store, the procs stand-in
  cluster with a few real jobs for detection, observe mode, reconcile every second);
* this process (the load generator), with one keep-alive HTTP/1.1 connection per
  agent and per job, written against asyncio streams (uvloop when installed) so that
  the client stays cheap:
  - 2,048 agents (8 GPUs each: 16,384 GPUs) send a heartbeat with their GPU figures
    once a second, each at its own phase;
  - 500 jobs report progress once a second (the batch ``trainguard.train`` sends:
    ``--steps-per-s`` events per request);
  - agents report findings at ``--findings-per-s`` (recorded synchronously);
  - every few seconds a detection probe: an agent reports XID 79 on a real job's GPU
    and the job's process is killed; the time until the incident exists (read
    through the API) is the detection latency under load.

Reported: sustained request rate, p50/p99/max latency per request type (also measured
from each request's *scheduled* time, so a slow server cannot hide queueing), detection
latency, server CPU (share of one core) and memory, load generator CPU, and lost
reports: heartbeats the server counted vs. those it acknowledged, each job's last step
in the store vs. the last one acknowledged, findings recorded vs. acknowledged.
Setup (2,048 inventories, 500 jobs and their attempts) is not timed.
Results: a table on stdout and ``bench/results/control_plane_load.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

OP = "bench-operator-token-000001"
AGENT = "bench-agent-token-0000000001"
RESULTS = ROOT / "bench" / "results" / "control_plane_load.json"
TICKS = os.sysconf("SC_CLK_TCK")


# --- a minimal HTTP/1.1 keep-alive client ------------------------------------------------


class Conn:
    """One keep-alive connection; requests on it are sequential (like one agent's)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.reconnects = 0

    async def _connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def request(
        self, method: str, path: str, body: bytes = b"", token: str = AGENT
    ) -> tuple[int, bytes]:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        for attempt in range(2):
            try:
                if self.writer is None:
                    await self._connect()
                assert self.reader is not None and self.writer is not None
                self.writer.write(head + body)
                line = await self.reader.readuntil(b"\r\n")
                status = int(line.split(b" ", 2)[1])
                length = 0
                while True:
                    h = await self.reader.readuntil(b"\r\n")
                    if h == b"\r\n":
                        break
                    if h[:15].lower() == b"content-length:":
                        length = int(h[15:])
                data = await self.reader.readexactly(length) if length else b""
                return status, data
            except (OSError, asyncio.IncompleteReadError, ValueError):
                self.close()
                self.reconnects += 1
                if attempt:
                    raise
        raise RuntimeError("unreachable")

    def close(self) -> None:
        if self.writer is not None:
            with contextlib.suppress(Exception):
                self.writer.close()
        self.reader = self.writer = None


# --- measurements ------------------------------------------------------------------------


@dataclass
class Kind:
    latencies: list[float] = field(default_factory=list)  # send -> response
    from_schedule: list[float] = field(default_factory=list)  # scheduled time -> response
    ok: int = 0
    errors: int = 0


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def runqueue_wait(pid: int) -> float:
    """Seconds the process's threads spent runnable but waiting for a CPU (schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                out.append(int(entry.name))
    return out


def loop_child(pid: int) -> int | None:
    for child in children(pid):
        with contextlib.suppress(OSError):
            if b"trainguard.api.loop_process" in Path(f"/proc/{child}/cmdline").read_bytes():
                return child
    return None


def proc_mem(pid: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


# --- the fleet ---------------------------------------------------------------------------


def host_name(i: int) -> str:
    return f"gpu{i:05d}"


def gpu_uuid(i: int, g: int) -> str:
    return f"GPU-{i:08x}-0000-4000-8000-{g:012d}"


class Load:
    def __init__(self, args: argparse.Namespace, port: int, det_jobs: list[dict[str, Any]]):
        self.a = args
        self.port = port
        self.kinds = {k: Kind() for k in ("heartbeat", "progress", "findings", "probe")}
        self.measuring = False
        self.stop_at = 0.0
        self.acked_steps: dict[str, int] = {}
        self.findings_acked = 0
        self.finding_seq = 0
        self.det_jobs = det_jobs
        self.detections: list[dict[str, Any]] = []
        self.lag: list[float] = []  # how late sends left compared with their schedule
        self.worst_per_second: list[float] = []  # slowest answer per second of the run

    def record(self, kind: str, scheduled: float, sent: float, status: int) -> None:
        if not self.measuring:
            return
        k = self.kinds[kind]
        done = time.monotonic()
        if 200 <= status < 300:
            k.ok += 1
            k.latencies.append(done - sent)
            second = int(sent - self.measure_start)
            worst = self.worst_per_second
            while len(worst) <= second:
                worst.append(0.0)
            worst[second] = max(worst[second], done - sent)
            k.from_schedule.append(done - scheduled)
            self.lag.append(sent - scheduled)
        else:
            k.errors += 1

    async def agent(self, i: int) -> None:
        conn = Conn("127.0.0.1", self.port)
        gpus = json.dumps(
            {
                gpu_uuid(i, g): {
                    "temp_c": 40 + (i + g) % 30,
                    "power_w": 300.0 + g,
                    "util_pct": 97.0,
                    "mem_used_mb": 70000.0,
                }
                for g in range(self.a.gpus_per_agent)
            },
            separators=(",", ":"),
        )
        path = f"/v1/agents/{host_name(i)}/heartbeat"
        interval = 1.0 / self.a.rate
        t = time.monotonic() + random.random() * interval
        seq = 0
        while t < self.stop_at:
            await asyncio.sleep(max(0.0, t - time.monotonic()))
            seq += 1
            body = b'{"seq":%d,"at":%.3f,"buffered":0,"gpus":%s}' % (
                seq,
                time.time(),
                gpus.encode(),
            )
            sent = time.monotonic()
            try:
                status, _ = await conn.request("POST", path, body)
            except Exception:
                status = 599
            self.record("heartbeat", t, sent, status)
            if status == 200:
                self.heartbeats_acked += 1  # warm-up included: compared with the server's count
            t += interval
        conn.close()

    heartbeats_acked = 0

    async def job(self, j: int) -> None:
        conn = Conn("127.0.0.1", self.port)
        job_id = f"bench-job-{j:04d}"
        path = f"/v1/jobs/{job_id}/progress"
        interval = self.a.progress_interval
        per = max(1, round(self.a.steps_per_s * interval))
        t = time.monotonic() + random.random() * interval
        step = 0
        while t < self.stop_at:
            await asyncio.sleep(max(0.0, t - time.monotonic()))
            now = time.time()
            events = []
            for _ in range(per):
                step += 1
                loss = 2.0 / (step**0.5)
                events.append(
                    f'{{"v":1,"event":"progress","step":{step},"time":{now:.3f},"rank":0,'
                    f'"attempt":0,"pid":{10000 + j},"loss":{loss:.4f},"checkpoint":null,'
                    '"metrics":{}}'
                )
            body = ('{"events":[' + ",".join(events) + "]}").encode()
            sent = time.monotonic()
            try:
                status, _ = await conn.request("POST", path, body)
            except Exception:
                status = 599
            self.record("progress", t, sent, status)
            if status == 202:
                self.acked_steps[job_id] = step
            t += interval
        conn.close()

    async def findings(self) -> None:
        if self.a.findings_per_s <= 0:
            return
        conns = [Conn("127.0.0.1", self.port) for _ in range(4)]
        interval = 1.0 / self.a.findings_per_s
        t = time.monotonic()
        n = 0
        while t < self.stop_at:
            await asyncio.sleep(max(0.0, t - time.monotonic()))
            i = random.randrange(self.a.agents)
            self.finding_seq += 1
            fid = f"bench:{self.finding_seq}"
            body = json.dumps(
                {
                    "findings": [
                        {
                            "id": fid,
                            "kind": "xid",
                            "domain": "application",
                            "at": time.time(),
                            "source": "kernel_log",
                            "message": f"NVRM: Xid (PCI:0000:10:00): 13, Graphics Exception {fid}",
                            "severity": "error",
                            "xid": 13,
                            "culprit": {"device_uuid": gpu_uuid(i, 0), "host": host_name(i)},
                        }
                    ]
                }
            ).encode()
            sent = time.monotonic()
            conn = conns[n % len(conns)]
            n += 1
            try:
                status, data = await conn.request(
                    "POST", f"/v1/agents/{host_name(i)}/findings", body
                )
            except Exception:
                status, data = 599, b""
            self.record("findings", t, sent, status)
            if status == 200:
                self.findings_acked += len(json.loads(data)["acked"])
            t += interval
        for c in conns:
            c.close()

    async def probes(self) -> None:
        """Detection latency: report XID 79 on a real job's GPU, kill the job, wait for the
        incident to exist (read through the API, as an operator would see it)."""
        conn = Conn("127.0.0.1", self.port)
        reader = Conn("127.0.0.1", self.port)
        n = len(self.det_jobs)
        if n == 0:
            return
        gap = self.a.duration / (n + 1)
        for k, job in enumerate(self.det_jobs):
            await asyncio.sleep(
                max(0.0, self.stop_at - self.a.duration + gap * (k + 1) - time.monotonic())
            )
            if time.monotonic() >= self.stop_at:
                break
            dev = job["device"]
            body = json.dumps(
                {
                    "findings": [
                        {
                            "id": f"probe:{k}",
                            "kind": "xid",
                            "domain": "hardware",
                            "at": time.time(),
                            "source": "kernel_log",
                            "message": "NVRM: Xid (PCI:0000:10:00): 79, GPU has fallen off "
                            "the bus.",
                            "severity": "fatal",
                            "xid": 79,
                            "culprit": {"device_uuid": dev["uuid"], "host": dev["host"]},
                        }
                    ]
                }
            ).encode()
            t0 = time.monotonic()
            status, _ = await conn.request("POST", f"/v1/agents/{dev['host']}/findings", body)
            with contextlib.suppress(OSError):
                os.killpg(job["pid"], signal.SIGKILL)
            killed = time.monotonic()
            found: dict[str, Any] | None = None
            polls = 0
            while time.monotonic() - killed < 30:
                polls += 1
                st, data = await reader.request(
                    "GET", f"/v1/incidents?job_id={job['job_id']}", token=OP
                )
                if st == 200:
                    incs = json.loads(data)
                    if incs:
                        found = incs[0]
                        break
                await asyncio.sleep(0.05)
            seen = time.monotonic()
            self.detections.append(
                {
                    "job": job["job_id"],
                    "finding_status": status,
                    "latency_s": None if found is None else round(seen - killed, 3),
                    "latency_from_finding_s": None if found is None else round(seen - t0, 3),
                    "incident": None if found is None else found["id"],
                    "kind": None if found is None else found["kind"],
                    "recorded_detect_s": None if found is None else _recorded_detect(found),
                    "polls": polls,
                }
            )
        conn.close()
        reader.close()

    async def run(self, warmup: float) -> None:
        start = time.monotonic()
        self.stop_at = start + warmup + self.a.duration
        tasks = [asyncio.create_task(self.agent(i)) for i in range(self.a.agents)]
        tasks += [asyncio.create_task(self.job(j)) for j in range(self.a.jobs)]
        await asyncio.sleep(warmup)
        self.measuring = True
        self.measure_start = time.monotonic()
        tasks.append(asyncio.create_task(self.findings()))
        tasks.append(asyncio.create_task(self.probes()))
        await asyncio.gather(*tasks)
        self.measure_end = time.monotonic()

    measure_start = 0.0
    measure_end = 0.0


def _recorded_detect(inc: dict[str, Any]) -> float | None:
    from trainguard.model.records import parse_iso_utc

    if not inc.get("fault_at") or not inc.get("detected_at"):
        return None
    return round(parse_iso_utc(inc["detected_at"]) - parse_iso_utc(inc["fault_at"]), 3)


# --- setup -------------------------------------------------------------------------------


async def setup(args: argparse.Namespace, port: int, work: Path) -> list[dict[str, Any]]:
    conns = [Conn("127.0.0.1", port) for _ in range(8)]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(args.agents):
        queue.put_nowait(i)

    async def worker(c: Conn) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            devices = [
                {
                    "index": g,
                    "uuid": gpu_uuid(i, g),
                    "pci_bus_id": f"0000:{0x10 + g:02x}:00.0",
                    "model": "NVIDIA H100 80GB HBM3",
                    "memory_mb": 81559,
                }
                for g in range(args.gpus_per_agent)
            ]
            st, data = await c.request(
                "POST",
                f"/v1/agents/{host_name(i)}/inventory",
                json.dumps({"devices": devices}).encode(),
            )
            if st != 200:
                raise SystemExit(f"inventory of {host_name(i)} refused: {st} {data[:200]!r}")

    await asyncio.gather(*(worker(c) for c in conns))
    for j in range(0 if args.no_controller else args.jobs):
        body = {
            "scheduler_ref": f"bench-{j}",
            "name": f"pretrain-{j}",
            "command": ["python", "train.py"],
            "need": args.gpus_per_agent,
            "job_id": f"bench-job-{j:04d}",
        }
        st, data = await conns[0].request("POST", "/v1/jobs", json.dumps(body).encode(), token=OP)
        if st != 201:
            raise SystemExit(f"job registration refused: {st} {data[:200]!r}")
    det: list[dict[str, Any]] = []
    for k in range(args.detections):
        body = {
            "name": f"probe-{k}",
            "command": ["sleep", "3600"],
            "devices_per_node": 1,
            "job_id": f"probe-job-{k}",
        }
        st, data = await conns[0].request(
            "POST", "/v1/jobs/submit", json.dumps(body).encode(), token=OP
        )
        if st != 201:
            raise SystemExit(f"probe job refused: {st} {data[:200]!r}")
        det.append(json.loads(data))
    for c in conns:
        c.close()
    return det


def start_attempts(args: argparse.Namespace, db: Path) -> None:
    """Attempts of the 500 progress-reporting jobs, each on its host's GPUs (a scheduler
    integration would record these; the benchmark measures the API, not the scheduler)."""
    from trainguard.store import Store

    with Store.open(db) as store, store.transaction():
        for j in range(args.jobs):
            if args.no_controller:  # no controller to register them through the API
                store.jobs.create_job(name=f"pretrain-{j}", command=["python", "train.py"],
                                 need=args.gpus_per_agent, at=time.time(),
                                 job_id=f"bench-job-{j:04d}")  # fmt: skip
            host = host_name(j % args.agents)
            devices = [d.device for d in store.devices.list_devices(host=host)]
            store.jobs.start_attempt(
                f"bench-job-{j:04d}", 0, devices, at=time.time(), actor="bench"
            )


def probe_jobs(work: Path, det: list[dict[str, Any]], deadline: float) -> list[dict[str, Any]]:
    """Where the probe jobs run (pid, device), once the procs cluster started them."""
    out: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        state = json.loads((work / "cluster" / "state.json").read_text())
        out = []
        for fj in det:
            job = state["jobs"].get(fj["scheduler_ref"])
            if not job or not job.get("pid") or not job.get("alloc_devices"):
                break
            out.append(
                {"job_id": fj["job_id"], "pid": job["pid"], "device": job["alloc_devices"][0]}
            )
        if len(out) == len(det):
            return out
        time.sleep(0.2)
    raise SystemExit("the probe jobs did not start")


# --- main --------------------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def status(port: int) -> dict[str, Any]:
    import httpx

    return httpx.get(
        f"http://127.0.0.1:{port}/v1/status", headers={"Authorization": f"Bearer {OP}"}, timeout=30
    ).json()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, default=2048)
    p.add_argument("--gpus-per-agent", type=int, default=8)
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--rate", type=float, default=1.0, help="heartbeats per agent per second")
    p.add_argument(
        "--progress-interval", type=float, default=1.0, help="seconds between a job's reports"
    )
    p.add_argument(
        "--steps-per-s", type=float, default=10.0, help="progress events per job per second"
    )
    p.add_argument("--findings-per-s", type=float, default=2.0)
    p.add_argument("--detections", type=int, default=5, help="detection probes during the run")
    p.add_argument("--duration", type=float, default=60.0, help="measured seconds")
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--keep", action="store_true", help="keep the working directory")
    p.add_argument(
        "--no-controller",
        action="store_true",
        help="serve without the reconcile loop (isolates the API's own cost; no probes)",
    )
    args = p.parse_args()
    if args.no_controller:
        args.detections = 0

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = args.agents + args.jobs + 256
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(need, soft)), hard))

    work = Path(tempfile.mkdtemp(prefix="tg-load-"))
    (work / "tokens.yaml").write_text(
        f'"{OP}": {{role: operator, name: bench}}\n"{AGENT}": {{role: agent, name: "*"}}\n'
    )
    port = free_port()
    db = work / "state.db"
    nodes = ",".join(f"probe{k}=1" for k in range(max(1, args.detections)))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    log = open(work / "serve.log", "wb")  # noqa: SIM115
    server = subprocess.Popen(
        [sys.executable, "-m", "trainguard.cli", "serve", "--port", str(port),
         "--database", str(db), "--token-file", str(work / "tokens.yaml"),
         "--scheduler", "procs", "--procs-root", str(work / "cluster"),
         "--procs-nodes", nodes, "--reconcile-interval", "1",
         *(["--no-controller"] if args.no_controller else [])],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )  # fmt: skip
    try:
        import httpx

        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit((work / "serve.log").read_text())
            time.sleep(0.2)
        runner = _runner()
        t0 = time.monotonic()
        print(f"setup: {args.agents} inventories ({args.agents * args.gpus_per_agent} GPUs), "
              f"{args.jobs} jobs, {args.detections} probe jobs ...", flush=True)  # fmt: skip
        det = runner(setup(args, port, work))
        start_attempts(args, db)
        probes = probe_jobs(work, det, time.monotonic() + 60)
        setup_s = time.monotonic() - t0
        print(f"setup done in {setup_s:.1f} s; load for {args.duration:.0f} s ...", flush=True)

        before = status(port)["ingest"]
        load = Load(args, port, probes)
        loop_pid = loop_child(server.pid)
        lcpu0 = proc_cpu(loop_pid) if loop_pid else 0.0
        wait0 = runqueue_wait(server.pid)
        cpu0, gen0, wall0 = (
            proc_cpu(server.pid),
            resource.getrusage(resource.RUSAGE_SELF),
            time.monotonic(),
        )
        load_avg0 = os.getloadavg()
        # The measured window starts after the warm-up; CPU is sampled over the whole run
        # and scaled to it (warm-up is the same load).
        runner(load.run(args.warmup))
        wall = time.monotonic() - wall0
        cpu1, gen1 = proc_cpu(server.pid), resource.getrusage(resource.RUSAGE_SELF)
        lcpu1 = proc_cpu(loop_pid) if loop_pid else 0.0
        wait1 = runqueue_wait(server.pid)
        load_avg1 = os.getloadavg()
        mem = proc_mem(server.pid)
        time.sleep(1.5)  # the progress flusher's last round
        after = status(port)
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=120).text

        # Lost reports.
        hb_counted = after["ingest"]["heartbeats"] - before["heartbeats"]
        from trainguard.store import Store

        with Store.open(db) as store:
            lost_progress = 0
            for job_id, step in load.acked_steps.items():
                att = store.jobs.get_attempt(job_id, 0)
                if att.last_step != step:
                    lost_progress += 1
            receipts = len(store.audit.list_audit(subject="finding:bench:*"))
        measured = load.measure_end - load.measure_start
        total_ok = sum(k.ok for k in load.kinds.values())
        reconcile = _histogram(metrics, "trainguard_reconcile_duration_seconds")
        det_lat = [d["latency_s"] for d in load.detections if d["latency_s"] is not None]
        result: dict[str, Any] = {
            "config": vars(args),
            "setup_s": round(setup_s, 1),
            "measured_s": round(measured, 2),
            "requests_ok": total_ok,
            "throughput_rps": round(total_ok / measured, 1),
            "target_rps": round(
                args.agents * args.rate + args.jobs / args.progress_interval + args.findings_per_s,
                1,
            ),
            "kinds": {
                name: {
                    "ok": k.ok,
                    "errors": k.errors,
                    "rps": round(k.ok / measured, 1),
                    "p50_ms": _r(pct(k.latencies, 50)),
                    "p99_ms": _r(pct(k.latencies, 99)),
                    "max_ms": _r(max(k.latencies) if k.latencies else None),
                    "p99_from_schedule_ms": _r(pct(k.from_schedule, 99)),
                }
                for name, k in load.kinds.items()
                if k.ok or k.errors
            },
            "all_p50_ms": _r(pct([x for k in load.kinds.values() for x in k.latencies], 50)),
            "all_p99_ms": _r(pct([x for k in load.kinds.values() for x in k.latencies], 99)),
            "send_lag_p99_ms": _r(pct(load.lag, 99)),
            "worst_ms_per_second": [_r(w) for w in load.worst_per_second],
            "detection": {
                "probes": load.detections,
                "p50_s": pct(det_lat, 50),
                "max_s": max(det_lat) if det_lat else None,
            },
            "server": {
                "cpu_core_share": round((cpu1 - cpu0) / wall, 3),
                "loop_process_cpu_core_share": round((lcpu1 - lcpu0) / wall, 3),
                # Time the API process was ready to run but had no CPU (other work on the
                # machine): latency the server could not help.
                "runqueue_wait_ms_per_s": round((wait1 - wait0) / wall * 1000, 1),
                "rss_mb": round(mem.get("VmRSS", 0), 1),
                "peak_rss_mb": round(mem.get("VmHWM", 0), 1),
                "reconcile_passes": reconcile[0],
                "reconcile_mean_ms": None
                if not reconcile[0]
                else round(reconcile[1] / reconcile[0] * 1000, 1),
            },
            "generator_cpu_core_share": round(
                ((gen1.ru_utime + gen1.ru_stime) - (gen0.ru_utime + gen0.ru_stime)) / wall, 3
            ),
            "load_average": [round(x, 2) for x in (*load_avg0, *load_avg1)],
            "lost": {
                "heartbeats": load.heartbeats_acked - hb_counted,
                "heartbeats_acked": load.heartbeats_acked,
                "heartbeats_counted_by_server": hb_counted,
                "progress_jobs_behind": lost_progress,
                "findings_acked": load.findings_acked,
                "findings_recorded": receipts,
                "findings": load.findings_acked - receipts,
                "progress_dropped_by_server": after["ingest"]["progress_dropped"],
            },
        }
        _print(result)
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nwrote {RESULTS.relative_to(ROOT)}")
        return 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
        _kill_cluster(work / "cluster")
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")


def _r(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 2)


def _histogram(text: str, name: str) -> tuple[int, float]:
    count = re.search(rf"^{name}_count (\S+)$", text, re.M)
    total = re.search(rf"^{name}_sum (\S+)$", text, re.M)
    return (int(float(count.group(1))) if count else 0, float(total.group(1)) if total else 0.0)


def _kill_cluster(root: Path) -> None:
    try:
        state = json.loads((root / "state.json").read_text())
    except (OSError, ValueError):
        return
    for job in state.get("jobs", {}).values():
        if job.get("pid"):
            with contextlib.suppress(OSError):
                os.killpg(int(job["pid"]), signal.SIGKILL)


def _runner() -> Any:
    try:
        import uvloop

        return uvloop.run
    except ImportError:
        return asyncio.run


def _print(r: dict[str, Any]) -> None:
    c, s, lost = r["config"], r["server"], r["lost"]
    print(
        f"\ncontrol-plane load: {c['agents']} agents x {c['gpus_per_agent']} GPUs at "
        f"{c['rate']} Hz, {c['jobs']} jobs' progress, {c['findings_per_s']} findings/s, "
        f"{r['measured_s']} s measured"
    )
    head = ("request", "ok", "err", "req/s", "p50 ms", "p99 ms", "max ms", "p99 sched")
    print(f"{head[0]:<10}" + "".join(f"{h:>10}" for h in head[1:]))
    for name, k in r["kinds"].items():
        cells = (k["ok"], k["errors"], k["rps"], k["p50_ms"], k["p99_ms"], k["max_ms"])
        cells += (k["p99_from_schedule_ms"],)
        print(f"{name:<10}" + "".join(f"{'-' if v is None else v:>10}" for v in cells))
    cells = (r["requests_ok"], "", r["throughput_rps"], r["all_p50_ms"], r["all_p99_ms"])
    print(f"{'all':<10}" + "".join(f"{v:>10}" for v in cells), f"  (target {r['target_rps']}/s)")
    lat = [p["latency_s"] for p in r["detection"]["probes"]]
    print(f"detection latency (job killed -> incident readable through the API): {lat} s")
    print(
        f"server: API process {s['cpu_core_share'] * 100:.0f}% of one core, reconcile process "
        f"{s['loop_process_cpu_core_share'] * 100:.0f}%; waited for a CPU "
        f"{s['runqueue_wait_ms_per_s']} ms/s; RSS {s['rss_mb']} MiB (peak {s['peak_rss_mb']})"
    )
    print(
        f"reconcile pass mean {s['reconcile_mean_ms']} ms over {s['reconcile_passes']} passes; "
        f"load generator {r['generator_cpu_core_share'] * 100:.0f}% of one core; "
        f"load average before/after {r['load_average']}"
    )
    print(
        f"lost: heartbeats {lost['heartbeats']}, progress jobs behind "
        f"{lost['progress_jobs_behind']}, findings {lost['findings']} "
        f"(acked {lost['findings_acked']}, recorded {lost['findings_recorded']})"
    )


if __name__ == "__main__":
    sys.exit(main())
