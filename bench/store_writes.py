"""Benchmark: what a durable store write costs, and how many the recovery loop can afford.

Measures, on a temporary SQLite file, the per-call latency of the store's write
paths (audit append, progress update, a device quarantine with history + audit in
one transaction, a whole incident's worth of writes) and of reading the audit log,
and compares the audit append against a bare ``INSERT`` + ``COMMIT`` on the same
kind of file with ``synchronous=FULL`` and with ``synchronous=NORMAL``, in the same
run, to show what the store's own overhead and its durability setting cost.

Run: ``.venv/bin/python bench/store_writes.py`` (writes bench/results/store_writes.json).
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from trainguard.model import Attribution, Culprit, Device, Domain, HealthState, IncidentKind
from trainguard.model.records import IncidentState
from trainguard.store import Store

N = 400


def timed(fn: Callable[[int], object], n: int) -> list[float]:
    out = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t)
    return out


def summary(name: str, samples: list[float]) -> dict[str, float | str | int]:
    s = sorted(samples)
    return {
        "operation": name,
        "n": len(s),
        "median_ms": round(statistics.median(s) * 1000, 3),
        "p95_ms": round(s[int(0.95 * (len(s) - 1))] * 1000, 3),
        "max_ms": round(s[-1] * 1000, 3),
        "per_s": round(len(s) / sum(s), 1),
    }


def bare_insert(path: Path, synchronous: str) -> list[float]:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, at REAL, data TEXT)")

    def one(i: int) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (at, data) VALUES (?, ?)", (float(i), '{"i": 1}'))
        conn.execute("COMMIT")

    try:
        return timed(one, N)
    finally:
        conn.close()


def main() -> int:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = Store.open(root / "state.db")
        devs = [Device(i, f"GPU-{i}", f"0000:{i // 32:02x}:{i % 32:02x}.0") for i in range(N + 8)]
        store.devices.register_devices(devs, at=0.0)
        store.jobs.create_job(name="bench", command=["x"], need=8, at=0.0, job_id="j")
        store.jobs.start_attempt("j", 0, devs[:8], at=0.0)

        audit = timed(
            lambda i: store.audit.append_audit(float(i), "bench", "note", "bench", "m", {"i": i}), N
        )
        rows.append(summary("store.audit.append_audit", audit))
        rows.append(
            summary(
                "store.jobs.update_attempt_progress",
                timed(lambda i: store.jobs.update_attempt_progress("j", 0, i, at=float(i)), N),
            )
        )
        rows.append(
            summary(
                "store.devices.transition_device (quarantine)",
                timed(
                    lambda i: store.devices.transition_device(
                        devs[8 + i].uuid, HealthState.QUARANTINED, "xid", "bench", float(i)
                    ),
                    N,
                ),
            )
        )
        attribution = Attribution(
            IncidentKind.XID, Domain.HARDWARE, Culprit(device_uuid="GPU-1", rank=1), 0.9, "xid"
        )

        def incident(i: int) -> None:
            inc = store.incidents.open_incident(
                "j", 0, attribution, detected_at=float(i), failed_step=10
            )
            store.incidents.record_plan(inc.id, {"actions": [{"type": "restart"}]}, at=float(i))
            with store.transaction():
                store.incidents.update_incident(inc.id, at=float(i), state=IncidentState.ACTING)
                store.incidents.add_incident_action(inc.id, {"type": "restart"}, at=float(i))
            store.incidents.update_incident(inc.id, at=float(i), state=IncidentState.VERIFYING)
            store.incidents.update_incident(inc.id, at=float(i), state=IncidentState.RECOVERED)

        rows.append(summary("incident life (5 transactions)", timed(incident, N // 4)))
        total = store.audit.count_audit()
        rows.append(
            summary(
                f"store.audit.list_audit (all {total})",
                timed(lambda i: store.audit.list_audit(), 5),
            )
        )
        store.close()
        full = bare_insert(root / "full.db", "FULL")
        normal = bare_insert(root / "normal.db", "NORMAL")
        rows.append(summary("bare INSERT+COMMIT, synchronous=FULL", full))
        rows.append(summary("bare INSERT+COMMIT, synchronous=NORMAL", normal))
        ratios = {
            "append_audit / bare FULL (median)": round(
                statistics.median(audit) / statistics.median(full), 2
            ),
            "bare FULL / bare NORMAL (median)": round(
                statistics.median(full) / statistics.median(normal), 2
            ),
        }

    cols = ["operation", "n", "median_ms", "p95_ms", "max_ms", "per_s"]
    widths = [
        max(len(str(r[c])) for r in [*rows, dict(zip(cols, cols, strict=True))]) for c in cols
    ]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for r in rows:
        print("  ".join(str(r[c]).ljust(w) for c, w in zip(cols, widths, strict=True)))
    for k, v in ratios.items():
        print(f"{k}: {v}")
    out = Path(__file__).resolve().parent / "results" / "store_writes.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "ratios": ratios}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
