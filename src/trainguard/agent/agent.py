"""``trainguard agent``: one per host; reports inventory, heartbeats and findings.

Two threads:

* the **watcher** follows the kernel log (a file, resumed from its saved
  position; else ``journalctl -k -f`` or ``/dev/kmsg``) and polls GPU metrics in
  DCGM format; each recognised line or metric change becomes a finding with a
  stable id, appended (``fsync``) to the on-disk buffer *before* the position or
  metric state that produced it is saved;
* the **sender** reports the inventory (again after every reconnection, and when
  the server asks), sends a heartbeat every interval, and drains the buffer in
  order, a batch at a time, acknowledging (deleting) records only after the
  server has recorded them. When the server is unreachable it retries with
  exponential backoff (with jitter); heartbeats missed meanwhile are not sent
  later (they say "alive now"), findings are.

Nothing found is lost while the disk holds (the buffer is capped, default 512 MiB,
and refuses new findings beyond it, counted and logged), and nothing is recorded
twice (the server deduplicates on the finding id).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import queue
import random
import threading
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from trainguard.agent.buffer import DiskBuffer, Entry
from trainguard.agent.client import Refused, Rejected, ServerClient, Unreachable
from trainguard.agent.dcgm import DcgmRules, by_device, gpu_figures, parse_text
from trainguard.agent.follow import ResumableFollower, load_position, save_position
from trainguard.diagnose.kernel_finding import KernelLineReader
from trainguard.diagnose.metrics import GpuSample, canonical_values
from trainguard.diagnose.trends import sample_events
from trainguard.model.devices import Device
from trainguard.model.findings import Finding
from trainguard.signals import inventory as inv
from trainguard.signals.kernel_log import KernelLine, open_kernel_log

log = logging.getLogger("trainguard.agent")

MAX_EVIDENCE_CHARS = 2000
MAX_BATCH_BYTES = 256 * 1024
VERSION = "1"


def host_simulated(n: int, host: str) -> list[Device]:
    """``n`` simulated devices whose UUIDs are unique to ``host`` (decision 0094).

    ``signals.inventory.simulated`` gives every machine the same UUIDs, which is right
    for one box and wrong for a fleet: here the first UUID group is a hash of the host
    name, the rest (and the PCI bus ids) follow the documented simulated scheme.
    """
    prefix = hashlib.sha256(host.encode()).hexdigest()[:8]
    return [
        dataclasses.replace(d, uuid=f"GPU-{prefix}" + d.uuid[len("GPU-00000000") :])
        for d in inv.simulated(n, host=host)
    ]


@dataclass
class AgentOptions:
    server: str
    token: str
    host: str
    buffer_dir: Path
    kernel_log: str | None = None
    kernel_log_from_start: bool = False
    use_system_kernel_log: bool = True
    metrics_url: str | None = None
    metrics_file: str | None = None
    devices: int | None = None
    inventory_file: str | None = None
    heartbeat_interval: float = 1.0
    metrics_interval: float = 5.0
    temp_threshold_c: float = 90.0
    batch: int = 100
    backoff_min: float = 0.2
    backoff_max: float = 30.0
    max_buffer_bytes: int = 512 << 20
    clock: Callable[[], float] = time.time


@dataclass
class AgentStats:
    findings_buffered: int = 0
    findings_acked: int = 0
    findings_rejected: int = 0
    findings_refused: int = 0
    heartbeats_ok: int = 0
    heartbeats_failed: int = 0
    inventories: int = 0
    metric_polls: int = 0
    metric_errors: int = 0
    connected: bool = False
    last_error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _wire(fid: str, f: Finding) -> dict[str, Any]:
    d = f.to_dict()
    d["evidence"] = [str(e)[:MAX_EVIDENCE_CHARS] for e in d["evidence"][:50]]
    d["message"] = str(d["message"])[:MAX_EVIDENCE_CHARS]
    return {"id": fid, **d}


class Agent:
    def __init__(self, options: AgentOptions) -> None:
        self.opt = options
        self.clock = options.clock
        self.stats = AgentStats()
        self.dir = Path(options.buffer_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.buffer = DiskBuffer(self.dir / "outbox", max_bytes=options.max_buffer_bytes)
        self.devices, self.inventory_source, self.inventory_message = self._inventory()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._kernel_q: queue.Queue[KernelLine] = queue.Queue(maxsize=100_000)
        self._follower: ResumableFollower | None = None
        self._kernel_reader = KernelLineReader()  # the rate rules of this node (0515)
        self._trend_samples: dict[str, GpuSample] = {}  # the last metrics of each GPU
        self._system_follower: Any = None
        self._klog_state = self.dir / "kernel-log-position.json"
        self._metrics_state = self.dir / "metrics-state.json"
        self.rules = self._load_rules()
        self._gpus: dict[str, dict[str, float | None]] = {}
        self._threads: list[threading.Thread] = []
        self.kernel_log_description = "kernel log: not followed"

    # --- set-up --------------------------------------------------------------------

    def _inventory(self) -> tuple[list[Device], str, str]:
        o = self.opt
        if o.inventory_file:
            devs = inv.from_file(o.inventory_file, host=o.host)
            devs = [dataclasses.replace(d, host=o.host) for d in devs]
            return devs, "file", f"{len(devs)} devices from {o.inventory_file}"
        if o.devices is not None:
            return host_simulated(o.devices, o.host), "simulated", f"{o.devices} simulated devices"
        found = inv.detect(host=o.host)
        return list(found.devices), found.source, found.message

    def _load_rules(self) -> DcgmRules:
        try:
            data = json.loads(self._metrics_state.read_text())
            return DcgmRules.from_state(data, self.opt.temp_threshold_c)
        except (OSError, ValueError, TypeError, AttributeError):
            return DcgmRules(temp_threshold_c=self.opt.temp_threshold_c)

    def _save_rules(self) -> None:
        tmp = self._metrics_state.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            json.dump(self.rules.to_state(), fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self._metrics_state)

    # --- lifecycle -----------------------------------------------------------------

    def start(self) -> Agent:
        o = self.opt
        if o.kernel_log:
            self._follower = ResumableFollower(
                o.kernel_log, load_position(self._klog_state), from_start=o.kernel_log_from_start
            )
            self.kernel_log_description = f"kernel log: following {o.kernel_log}"
        elif o.use_system_kernel_log:
            follower, self.kernel_log_description = open_kernel_log(None, self._kernel_q.put)
            if follower is not None:
                self._system_follower = follower.start()
        log.info("%s", self.kernel_log_description)
        for target, name in ((self._watch, "agent-watch"), (self._send_loop, "agent-send")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._system_follower is not None:
            self._system_follower.stop()
        for t in self._threads:
            t.join(10.0)
        self.buffer.close()

    # --- the watcher ---------------------------------------------------------------

    def _buffer(self, items: list[tuple[str, Finding]]) -> bool:
        if not items:
            return True
        ok = self.buffer.append([{"id": fid, "finding": _wire(fid, f)} for fid, f in items])
        if ok:
            self.stats.findings_buffered += len(items)
            self._wake.set()
        else:
            self.stats.findings_refused += len(items)
            log.error(
                "agent buffer full (%d bytes): %d findings NOT recorded; the server has been "
                "unreachable too long",
                self.opt.max_buffer_bytes,
                len(items),
            )
        return ok

    def _kernel_findings(self, text: str, at: float) -> list[Finding]:
        """The line's findings; benign lines only count into the rate rules (0515)."""
        return [f for f, _host in self._kernel_reader.read(text, at, self.devices, self.opt.host)]

    def poll_kernel_log(self) -> int:
        """Read new kernel-log lines; buffer their findings, then save the position."""
        found: list[tuple[str, Finding]] = []
        now = self.clock()
        if self._follower is not None:
            lines = self._follower.poll()
            for line in lines:
                for i, f in enumerate(self._kernel_findings(line.text, now)):
                    # A line's own finding keeps the line's key; a trend it completes is
                    # a second record of the same line.
                    suffix = f":{i}" if i else ""
                    found.append((f"{self.opt.host}:klog:{line.key}{suffix}", f))
            if lines:
                if not self._buffer(found):
                    return 0  # keep the position: these lines are read again next time
                pos = self._follower.position()
                if pos is not None:
                    save_position(self._klog_state, pos)
            return len(found)
        while True:
            try:
                kl = self._kernel_q.get_nowait()
            except queue.Empty:
                break
            for f in self._kernel_findings(kl.text, kl.at):
                found.append((f"{self.opt.host}:klog:{uuidlib.uuid4().hex}", f))
        self._buffer(found)
        return len(found)

    def _read_metrics(self) -> str:
        o = self.opt
        if o.metrics_file:
            return Path(o.metrics_file).read_text(encoding="utf-8", errors="replace")
        assert o.metrics_url is not None
        resp = httpx.get(o.metrics_url, timeout=5.0)
        resp.raise_for_status()
        return resp.text

    def poll_metrics(self) -> int:
        """Read the GPU metrics once; buffer findings for what changed, then save the state."""
        o = self.opt
        if not (o.metrics_file or o.metrics_url):
            return 0
        try:
            text = self._read_metrics()
        except (OSError, httpx.HTTPError) as exc:
            self.stats.metric_errors += 1
            self.stats.extra["metrics_error"] = str(exc)
            return 0
        samples, _bad = parse_text(text)
        values = by_device(samples, self.devices)
        self._gpus = gpu_figures(values)
        self.stats.metric_polls += 1
        saved = DcgmRules.from_state(self.rules.to_state(), o.temp_threshold_c)
        now = self.clock()
        found = self.rules.evaluate(values, self.devices, o.host, now)
        found += self._metric_trends(values, now)
        if not self._buffer(found):
            self.rules = saved  # not recorded: evaluate the same change again next poll
            return 0
        self._save_rules()
        return len(found)

    def _metric_trends(
        self, values: dict[str, dict[str, float]], at: float
    ) -> list[tuple[str, Finding]]:
        """Counter rises (single-bit ECC, retired pages, correctable remapped rows, PCIe
        replays, NVLink errors) counted into the node's rate rules; a trend they complete
        is a finding (0515)."""
        pci = {d.uuid: d.pci_bus_id for d in self.devices}
        events = []
        for uuid, vals in sorted(values.items()):
            cur = GpuSample(at, uuid, self.opt.host, uuid, pci.get(uuid), canonical_values(vals))
            prev = self._trend_samples.get(uuid)
            if prev is not None:
                events += sample_events(prev, cur)
            self._trend_samples[uuid] = cur
        return [
            (f"{self.opt.host}:trend:{f.details['rule']}:{f.details['resource']}:{f.at!r}", f)
            for f in self._kernel_reader.trends.add_all(events)
        ]

    def _watch(self) -> None:
        next_metrics = 0.0
        while not self._stop.is_set():
            try:
                self.poll_kernel_log()
                if time.monotonic() >= next_metrics:
                    next_metrics = time.monotonic() + self.opt.metrics_interval
                    self.poll_metrics()
            except Exception:  # the watcher must never die
                log.exception("agent watcher error")
            self._stop.wait(0.05)

    # --- the sender ----------------------------------------------------------------

    def _batch(self) -> list[Entry]:
        entries = self.buffer.peek(self.opt.batch)
        out: list[Entry] = []
        size = 0
        for e in entries:
            n = len(json.dumps(e.record.get("finding", {})))
            if out and size + n > MAX_BATCH_BYTES:
                break
            out.append(e)
            size += n
        return out

    def _set_aside(self, entries: list[Entry], why: str) -> None:
        """Keep records the server will never take in ``rejected.jsonl`` (never silently lost)."""
        path = self.dir / "rejected.jsonl"
        with open(path, "a", encoding="utf-8") as fh:
            for e in entries:
                fh.write(json.dumps({"why": why, **e.record}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.stats.findings_rejected += len(entries)
        log.error("server rejected %d finding(s) (%s); kept in %s", len(entries), why, path)

    def drain_once(self, client: ServerClient) -> int:
        """Send one batch; returns how many records were acknowledged."""
        batch = self._batch()
        if not batch:
            return 0
        try:
            answer = client.findings([e.record["finding"] for e in batch])
        except Rejected as exc:
            if len(batch) == 1:
                self._set_aside(batch, str(exc))
                self.buffer.ack(batch[0].end)
                return 1
            # Find the bad record(s): send one at a time, in order.
            acked = 0
            for e in batch:
                try:
                    client.findings([e.record["finding"]])
                except Rejected as one:
                    self._set_aside([e], str(one))
                self.buffer.ack(e.end)
                acked += 1
            self.stats.findings_acked += acked
            return acked
        acked_ids = answer.get("acked") or []
        # The server acknowledges in order; ack up to the last record it confirmed.
        n = 0
        for e, fid in zip(batch, acked_ids, strict=False):
            if e.record["id"] != fid:
                break
            n += 1
        if n:
            self.buffer.ack(batch[n - 1].end)
            self.stats.findings_acked += n
        return n

    def _send_loop(self) -> None:
        o = self.opt
        client = ServerClient(o.server, o.token, o.host)
        backoff = o.backoff_min
        need_inventory = True
        seq = 0
        next_beat = 0.0
        try:
            while not self._stop.is_set():
                try:
                    if need_inventory:
                        client.inventory(
                            [
                                {
                                    "index": d.index,
                                    "uuid": d.uuid,
                                    "pci_bus_id": d.pci_bus_id,
                                    "model": d.model,
                                    "memory_mb": d.memory_mb,
                                }
                                for d in self.devices
                            ],
                            self.inventory_source,
                            self.inventory_message,
                        )
                        need_inventory = False
                        self.stats.inventories += 1
                    if time.monotonic() >= next_beat:
                        next_beat = time.monotonic() + o.heartbeat_interval
                        seq += 1
                        try:
                            answer = client.heartbeat(
                                seq, self.clock(), self.buffer.pending(), self._gpus
                            )
                            self.stats.heartbeats_ok += 1
                            if answer.get("inventory_needed"):
                                need_inventory = True
                        except Rejected as exc:
                            self.stats.heartbeats_failed += 1
                            log.error("heartbeat rejected: %s", exc)
                    while self.drain_once(client):
                        if self._stop.is_set():
                            break
                    if not self.stats.connected:
                        log.info("connected to %s", o.server)
                    self.stats.connected = True
                    backoff = o.backoff_min
                    self._wake.wait(max(0.0, next_beat - time.monotonic()))
                    self._wake.clear()
                except (Unreachable, Refused) as exc:
                    if self.stats.connected or self.stats.last_error != str(exc):
                        level = logging.ERROR if isinstance(exc, Refused) else logging.WARNING
                        log.log(
                            level,
                            "server %s: %s; retrying (buffered: %d)",
                            o.server,
                            exc,
                            self.buffer.pending(),
                        )
                    self.stats.connected = False
                    self.stats.last_error = str(exc)
                    self.stats.heartbeats_failed += 1
                    need_inventory = True  # the server may have restarted without our devices
                    # Full jitter: a fleet that lost its server does not come back in lockstep.
                    # A busy server's Retry-After is a floor on the wait.
                    floor = getattr(exc, "retry_after", None) or 0.0
                    self._stop.wait(max(floor, random.uniform(o.backoff_min, backoff)))
                    backoff = min(o.backoff_max, backoff * 2)
                    if isinstance(exc, Refused):
                        backoff = o.backoff_max
        finally:
            with contextlib.suppress(Exception):
                client.close()


__all__ = ["Agent", "AgentOptions", "AgentStats", "host_simulated"]
