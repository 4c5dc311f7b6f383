"""Prometheus ``/metrics`` for the control plane (every name starts with ``trainguard_``).

Two kinds of figure (decision 0093):

* **Counted as it happens** (process-local, reset on restart as Prometheus
  expects): ingestion counters, HTTP request latency, reconcile loop timings.
* **Derived from the store at scrape time** (:class:`StoreCollector`): incidents by
  kind and domain, open incidents, detection and recovery latency histograms,
  devices by health state, restarts, lost steps, pending approvals. Computing
  them from the records makes them right after a restart and on a standby
  server; a short cache bounds the cost when several scrapers ask at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from trainguard.model.health import HealthState
from trainguard.model.records import IncidentRecord

DETECTION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
RECOVERY_BUCKETS = (1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)
REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
RECONCILE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def _histogram(
    name: str, doc: str, values: Iterable[float], buckets: Sequence[float]
) -> HistogramMetricFamily:
    vals = sorted(values)
    counts: list[tuple[str, float]] = []
    i = 0
    for le in buckets:
        while i < len(vals) and vals[i] <= le:
            i += 1
        counts.append((repr(float(le)), float(i)))
    counts.append(("+Inf", float(len(vals))))
    return HistogramMetricFamily(name, doc, buckets=counts, sum_value=float(sum(vals)))


def detection_latency(inc: IncidentRecord) -> float | None:
    if inc.fault_at is None:
        return None
    return max(0.0, inc.detected_at - inc.fault_at)


def recovery_latency(inc: IncidentRecord) -> float | None:
    """Fault (or detection, when the fault time is unknown) to verified recovery."""
    if inc.recovered_at is None:
        return None
    start = inc.fault_at if inc.fault_at is not None else inc.detected_at
    return max(0.0, inc.recovered_at - start)


class StoreCollector(Collector):
    """Figures computed from the store's records when Prometheus scrapes."""

    def __init__(
        self,
        store: Any,
        *,
        node_counts: Callable[[], dict[str, int]] | None = None,
        extra: Callable[[], dict[str, float]] | None = None,
        ttl_s: float = 5.0,
    ) -> None:
        self.store = store
        self.node_counts = node_counts
        self.extra = extra
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._cached: list[Metric] = []
        self._cached_at = -1e18

    def describe(self) -> Iterable[Metric]:
        return []  # computed families: do not let the registry call collect() at register time

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            now = time.monotonic()
            if now - self._cached_at > self.ttl_s:
                self._cached = self._compute()
                self._cached_at = now
            yield from self._cached

    def _compute(self) -> list[Metric]:
        out: list[Metric] = []
        incidents = self.store.incidents.list_incidents()
        total = CounterMetricFamily(
            "trainguard_incidents",
            "Incidents recorded, by kind and domain",
            labels=["kind", "domain"],
        )
        open_ = GaugeMetricFamily(
            "trainguard_incidents_open", "Incidents not closed yet", labels=["kind", "domain"]
        )
        by_kd: dict[tuple[str, str], int] = {}
        open_kd: dict[tuple[str, str], int] = {}
        outcomes: dict[str, int] = {}
        lost = 0
        for inc in incidents:
            key = (inc.kind.value, inc.domain.value)
            by_kd[key] = by_kd.get(key, 0) + 1
            if not inc.state.terminal:
                open_kd[key] = open_kd.get(key, 0) + 1
            outcomes[inc.outcome] = outcomes.get(inc.outcome, 0) + 1
            lost += inc.lost_steps or 0
        for (k, d), n in sorted(by_kd.items()):
            total.add_metric([k, d], n)
        for (k, d), n in sorted(open_kd.items()):
            open_.add_metric([k, d], n)
        out += [total, open_]
        outcome_f = GaugeMetricFamily(
            "trainguard_incidents_by_outcome", "Incidents by outcome", labels=["outcome"]
        )
        for o, n in sorted(outcomes.items()):
            outcome_f.add_metric([o], n)
        out.append(outcome_f)
        out.append(
            _histogram(
                "trainguard_detection_latency_seconds",
                "Fault to detection, per incident whose fault time is known",
                (v for v in map(detection_latency, incidents) if v is not None),
                DETECTION_BUCKETS,
            )
        )
        out.append(
            _histogram(
                "trainguard_recovery_latency_seconds",
                "Fault (or detection) to verified recovery, per recovered incident",
                (v for v in map(recovery_latency, incidents) if v is not None),
                RECOVERY_BUCKETS,
            )
        )
        lost_f = CounterMetricFamily(
            "trainguard_lost_steps",
            "Training steps lost to incidents (reached - next restored step, per failed attempt)",
        )
        lost_f.add_metric([], lost)
        out.append(lost_f)

        restarts = 0
        jobs_by_state: dict[str, int] = {}
        for job in self.store.jobs.list_jobs():
            jobs_by_state[job.state.value] = jobs_by_state.get(job.state.value, 0) + 1
            restarts += sum(1 for a in self.store.jobs.list_attempts(job.id) if a.number > 0)
        restarts_f = CounterMetricFamily(
            "trainguard_restarts", "Attempts started after a job's first (restarts)"
        )
        restarts_f.add_metric([], restarts)
        out.append(restarts_f)
        jobs_f = GaugeMetricFamily("trainguard_jobs", "Jobs by state", labels=["state"])
        for s, n in sorted(jobs_by_state.items()):
            jobs_f.add_metric([s], n)
        out.append(jobs_f)

        dev_counts = {s.value: 0 for s in HealthState}
        for dev in self.store.devices.list_devices():
            dev_counts[dev.state.value] += 1
        dev_f = GaugeMetricFamily("trainguard_devices", "Devices by health state", labels=["state"])
        for s, n in dev_counts.items():
            dev_f.add_metric([s], n)
        out.append(dev_f)

        if self.node_counts is not None:
            nodes_f = GaugeMetricFamily(
                "trainguard_nodes", "Agent hosts by heartbeat status", labels=["status"]
            )
            for s, n in sorted(self.node_counts().items()):
                nodes_f.add_metric([s], n)
            out.append(nodes_f)
        if self.extra is not None:
            for name, value in sorted(self.extra().items()):
                g = GaugeMetricFamily(f"trainguard_{name}", f"{name.replace('_', ' ')}")
                g.add_metric([], value)
                out.append(g)
        return out


class OperationsCollector(Collector):
    """The figures the shipped alerting rules watch (decision 0250), at scrape time.

    * ``trainguard_gpu_temperature_celsius{host,gpu}``: from the agents' heartbeats;
    * ``trainguard_gpu_findings_total{host,gpu,kind}`` and
      ``trainguard_gpu_xid_errors_total{host,gpu,xid}``: findings recorded so far
      (``ecc_error`` covers ECC and row-remap failures), counted incrementally;
    * ``trainguard_breaker_open{breaker}``: 1 while a circuit breaker is tripped;
    * ``trainguard_job_progress_age_seconds{job}``: since a running job's last step;
    * ``trainguard_job_checkpoint_age_seconds{job}``,
      ``trainguard_job_checkpoint_last_save_timestamp_seconds{job}``,
      ``trainguard_job_checkpoint_last_save_duration_seconds{job}``,
      ``trainguard_job_checkpoint_max_age_seconds{job}`` (when the policy sets it),
      ``trainguard_job_checkpoint_unprotected{job}`` (decision 0251).
    """

    def __init__(
        self,
        *,
        gpus: Callable[[], dict[str, dict[str, dict[str, Any]]]],
        tally: Any,
        breakers: Callable[[], dict[str, bool]],
        progress_ages: Callable[[], dict[str, float]],
        protections: Callable[[], dict[str, Any]],
        ttl_s: float = 5.0,
    ) -> None:
        self.gpus = gpus
        self.tally = tally
        self.breakers = breakers
        self.progress_ages = progress_ages
        self.protections = protections
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._cached: list[Metric] = []
        self._cached_at = -1e18

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            now = time.monotonic()
            if now - self._cached_at > self.ttl_s:
                self._cached = self._compute()
                self._cached_at = now
            yield from self._cached

    def _compute(self) -> list[Metric]:
        temp = GaugeMetricFamily(
            "trainguard_gpu_temperature_celsius",
            "GPU temperature from the host agent's last heartbeat",
            labels=["host", "gpu"],
        )
        for host, gpus in sorted(self.gpus().items()):
            for gpu, fig in sorted(gpus.items()):
                t = fig.get("temp_c")
                if isinstance(t, int | float):
                    temp.add_metric([host, gpu], float(t))
        self.tally.refresh()
        kinds = CounterMetricFamily(
            "trainguard_gpu_findings",
            "Findings recorded per host, GPU (empty: the host) and kind",
            labels=["host", "gpu", "kind"],
        )
        for (host, gpu, kind), n in sorted(self.tally.by_kind.items()):
            kinds.add_metric([host, gpu, kind], n)
        xids = CounterMetricFamily(
            "trainguard_gpu_xid_errors",
            "XID errors recorded per host, GPU and XID number",
            labels=["host", "gpu", "xid"],
        )
        for (host, gpu, xid), n in sorted(self.tally.by_xid.items()):
            xids.add_metric([host, gpu, str(xid)], n)
        breaker = GaugeMetricFamily(
            "trainguard_breaker_open",
            "1 while the circuit breaker is open (its actions suppressed)",
            labels=["breaker"],
        )
        for name, is_open in sorted(self.breakers().items()):
            breaker.add_metric([name], 1.0 if is_open else 0.0)
        progress = GaugeMetricFamily(
            "trainguard_job_progress_age_seconds",
            "Seconds since a running job's last progress step (or its attempt's start)",
            labels=["job_id"],
        )
        for job, age in sorted(self.progress_ages().items()):
            progress.add_metric([job], age)
        out: list[Metric] = [temp, kinds, xids, breaker, progress]
        out += self._checkpoints()
        return out

    def _checkpoints(self) -> list[Metric]:
        age = GaugeMetricFamily(
            "trainguard_job_checkpoint_age_seconds",
            "Age of the job's newest valid checkpoint",
            labels=["job_id"],
        )
        saved = GaugeMetricFamily(
            "trainguard_job_checkpoint_last_save_timestamp_seconds",
            "When the job's newest valid checkpoint was written (epoch seconds)",
            labels=["job_id"],
        )
        took = GaugeMetricFamily(
            "trainguard_job_checkpoint_last_save_duration_seconds",
            "How long the newest checkpoint took to save, when its manifest records it",
            labels=["job_id"],
        )
        limit = GaugeMetricFamily(
            "trainguard_job_checkpoint_max_age_seconds",
            "The job policy's max_checkpoint_age_seconds",
            labels=["job_id"],
        )
        missing = GaugeMetricFamily(
            "trainguard_job_checkpoint_missing",
            "1 while the job's checkpoint directory holds no valid checkpoint",
            labels=["job_id"],
        )
        unprotected = GaugeMetricFamily(
            "trainguard_job_checkpoint_unprotected",
            "1 when the checkpoint directory is on node-local storage (the compute's "
            "failure domain)",
            labels=["job_id"],
        )
        for job, p in sorted(self.protections().items()):
            if p.age_seconds is not None:
                age.add_metric([job], p.age_seconds)
                saved.add_metric([job], p.newest_at)
            if p.last_save_seconds is not None:
                took.add_metric([job], p.last_save_seconds)
            if p.max_age_seconds is not None:
                limit.add_metric([job], p.max_age_seconds)
            missing.add_metric([job], 1.0 if p.age_seconds is None else 0.0)
            unprotected.add_metric([job], 1.0 if p.unprotected else 0.0)
        return [age, saved, took, limit, missing, unprotected]


class Metrics:
    """The registry of one server, and the instruments the API and the loop update."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.heartbeats = Counter(
            "trainguard_ingest_heartbeats", "Agent heartbeats received", registry=r
        )
        self.inventories = Counter(
            "trainguard_ingest_inventories", "Agent inventory reports received", registry=r
        )
        self.findings = Counter(
            "trainguard_ingest_findings",
            "Findings received from agents, by result",
            ["result"],
            registry=r,
        )
        self.progress = Counter(
            "trainguard_ingest_progress_events", "Progress events received", registry=r
        )
        self.poison = Counter(
            "trainguard_ingest_poison",
            "Reports dropped because they could not be recorded (audited), by kind",
            ["kind"],
            registry=r,
        )
        self.rejected = Counter(
            "trainguard_http_rejected",
            "Requests refused before they changed anything, by reason",
            ["reason"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "trainguard_http_request_duration_seconds",
            "API request handling time by route",
            ["method", "route"],
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.reconcile_seconds = Histogram(
            "trainguard_reconcile_duration_seconds",
            "Duration of one controller reconcile pass",
            buckets=RECONCILE_BUCKETS,
            registry=r,
        )
        self.reconcile_errors = Counter(
            "trainguard_reconcile_errors", "Reconcile passes that raised", registry=r
        )
        self.throttled = Counter(
            "trainguard_ingest_throttled",
            "Reports refused with 429 because the ingestion buffer (or the job's share of"
            " it) was full, by kind",
            ["kind"],
            registry=r,
        )
        self.pass_age = Gauge(
            "trainguard_controller_last_pass_age_seconds",
            "Seconds since the controller last completed a reconcile pass (-1: none yet)",
            registry=r,
        )
        self.progress_pending = Gauge(
            "trainguard_ingest_progress_pending",
            "Progress events waiting for the flusher",
            registry=r,
        )

    def add_store_collector(self, collector: Collector) -> None:
        self.registry.register(collector)


__all__ = [
    "DETECTION_BUCKETS",
    "RECOVERY_BUCKETS",
    "Metrics",
    "OperationsCollector",
    "StoreCollector",
    "detection_latency",
    "recovery_latency",
]
