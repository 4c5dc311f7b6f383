"""Measurements for ``trainguard advise-interval --from-state DB``.

From trainguard's state database: the GPU-hours the jobs' attempts ran and the
incidents they met (an observed per-GPU MTBF), the time from fault to verified
recovery (restart time), and, from the valid trainguard checkpoints in each job's
checkpoint directory, the measured save time written in their manifests.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any


class NoMeasurements(ValueError):
    """The database cannot give what was asked (no file, no such job, nothing ran)."""


@dataclass
class Measured:
    jobs: list[str]
    gpus: int  # the (largest) job's device count
    gpu_hours: float  # GPU-hours the attempts ran
    failures: int  # incidents
    per_gpu_mtbf_seconds: float | None  # gpu-seconds / failures
    restart_seconds: float | None  # median fault (or detection) -> verified recovery
    restart_samples: int
    save_seconds: float | None  # median of the manifests' save_seconds
    save_samples: int
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _manifest_save_seconds(checkpoint_dir: str) -> list[float]:
    from trainguard.checkpoints import scan
    from trainguard.checkpoints.protection import manifest_save_seconds

    out: list[float] = []
    try:
        infos = scan(checkpoint_dir, verify="quick")
    except OSError:
        return out
    for info in infos:
        if not info.valid or info.format != "trainguard":
            continue
        took = manifest_save_seconds(info.path)
        if took is not None and took > 0:
            out.append(float(took))
    return out


def measure(db_path: str, job_id: str | None, now: float) -> Measured:
    """Read the measurements; raises :class:`NoMeasurements` with a readable message."""
    from trainguard.store import NotFound, Store, StoreError

    try:
        store = Store.open_existing(db_path)
    except StoreError as exc:
        raise NoMeasurements(str(exc)) from exc
    if store is None:
        raise NoMeasurements(f"no state database at {db_path}")
    with store:
        if job_id is not None:
            try:
                jobs = [store.jobs.get_job(job_id)]
            except NotFound as exc:
                raise NoMeasurements(f"no job {job_id!r} in {db_path}") from exc
        else:
            jobs = store.jobs.list_jobs()
        if not jobs:
            raise NoMeasurements(f"no jobs in {db_path}")
        gpu_seconds = 0.0
        failures = 0
        restarts: list[float] = []
        saves: list[float] = []
        notes: list[str] = []
        for job in jobs:
            for att in store.jobs.list_attempts(job.id):
                end = att.ended_at if att.ended_at is not None else (att.last_step_at or now)
                gpu_seconds += max(0.0, end - att.started_at) * max(1, len(att.devices))
            for inc in store.incidents.list_incidents(job_id=job.id):
                failures += 1
                start = inc.fault_at if inc.fault_at is not None else inc.detected_at
                if inc.recovered_at is not None and inc.recovered_at >= start:
                    restarts.append(inc.recovered_at - start)
            if job.checkpoint_dir:
                found = _manifest_save_seconds(job.checkpoint_dir)
                if not found:
                    notes.append(f"job {job.id}: no trainguard manifest with a save time")
                saves += found
            else:
                notes.append(f"job {job.id}: no checkpoint directory recorded")
    if gpu_seconds <= 0:
        raise NoMeasurements("no attempt has run yet: nothing to measure")
    return Measured(
        jobs=[j.id for j in jobs],
        gpus=max(max(1, j.need) for j in jobs),
        gpu_hours=gpu_seconds / 3600.0,
        failures=failures,
        per_gpu_mtbf_seconds=gpu_seconds / failures if failures else None,
        restart_seconds=statistics.median(restarts) if restarts else None,
        restart_samples=len(restarts),
        save_seconds=statistics.median(saves) if saves else None,
        save_samples=len(saves),
        notes=notes,
    )


def resolve(args: Any, now: float) -> Measured | str:
    """Fill the advice inputs the user did not give from the database; an error text if unable.

    Explicit ``--save-seconds``, ``--mtbf-hours``, ``--restart-seconds`` and ``--gpus``
    win over measured values.
    """
    try:
        m = measure(args.from_state, args.job, now)
    except NoMeasurements as exc:
        return str(exc)
    if args.save_seconds is None:
        if m.save_seconds is None:
            return (
                "no measured checkpoint save time (no trainguard manifest with save_seconds "
                "in the jobs' checkpoint directories): give --save-seconds"
            )
        args.save_seconds = m.save_seconds
    if args.mtbf_hours is None:
        if m.per_gpu_mtbf_seconds is None:
            return (
                f"no failures recorded in {m.gpu_hours:.1f} GPU-hours: the MTBF cannot be "
                "estimated yet; give --mtbf-hours"
            )
        # A per-GPU MTBF; the job's is that over its GPU count (independent failures).
        args.mtbf_hours = m.per_gpu_mtbf_seconds / 3600.0
        if args.gpus is None:
            args.gpus = m.gpus
    if args.restart_seconds is None and m.restart_seconds is not None:
        args.restart_seconds = m.restart_seconds
    return m


def expected_ettr(
    save_seconds: float, mtbf_seconds: float, restart_seconds: float, current: float | None
) -> dict[str, Any]:
    """ETTR expected at the recommended (and current) interval, analytic and simulated."""
    from trainguard.simulate.advice import advise_with_simulation

    out = advise_with_simulation(
        save_seconds, mtbf_seconds, restart_seconds, current, failures=1000, trials=3
    )
    return dict(out["expected_ettr"])


def print_measured(m: Measured, db_path: str, ettr: dict[str, Any]) -> None:
    from trainguard._commands._common import print_table

    print(
        f"measured in {db_path} ({len(m.jobs)} job(s)): {m.failures} failure(s) in "
        f"{m.gpu_hours:,.1f} GPU-hours"
        + (
            f" -> per-GPU MTBF {m.per_gpu_mtbf_seconds / 3600:,.1f} h"
            if m.per_gpu_mtbf_seconds
            else ""
        )
        + (
            f"; save time {m.save_seconds:.2f} s (median of {m.save_samples})"
            if m.save_seconds
            else ""
        )
        + (
            f"; restart {m.restart_seconds:.1f} s (median of {m.restart_samples})"
            if m.restart_seconds is not None
            else ""
        )
    )
    for note in m.notes:
        print(f"note: {note}")
    rows = []
    for label, e in ettr.items():
        rows.append(
            (
                label,
                f"{e['interval_seconds']:.0f} s",
                f"{e['first_order']:.3f}",
                f"{e['exact']:.3f}",
                f"{e['simulated']:.3f} ± {e['simulated_sd']:.3f}",
            )
        )
    print_table(
        "expected ETTR (simulated: one job, exponential failures, fixed costs; docs/simulate.md)",
        ("interval", "τ", "first order", "exact", "simulated"),
        rows,
    )
