"""Presenting a simulation: table rows, the calibration check and the timeline plot.

The rows are plain lists so the command can print them with
``_commands._common.print_table`` (rich on a terminal, tab-separated otherwise).
The plot uses matplotlib's Agg backend (no display needed) and writes a PNG:
one timeline band per policy coloured by what the job was doing, and below it
the checkpointed training progress against wall-clock time.
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import fmean
from typing import Any

from trainguard.simulate.engine import CATEGORIES
from trainguard.simulate.runner import SimulationReport

SUMMARY_COLUMNS = (
    "policy",
    "job",
    "ETTR",
    "±sd",
    "interruptions",
    "restarts",
    "failed starts",
    "repeats on bad hw",
    "stops",
    "ckpt every (min)",
    "lost GPU-h",
)
LOST_COLUMNS = ("policy", "job", *CATEGORIES, "total")

STATE_COLORS = {
    "running": "#2e7d32",
    "saving": "#9ccc65",
    "failed": "#ef6c00",
    "recovering": "#1565c0",
    "waiting_capacity": "#8e24aa",
    "waiting_manual": "#c62828",
}
STATE_LABELS = {
    "running": "training",
    "saving": "checkpoint stall",
    "failed": "failed, not yet detected",
    "recovering": "restart / restore",
    "waiting_capacity": "waiting for capacity",
    "waiting_manual": "waiting for a person",
}


def _num(x: float, digits: int = 1) -> str:
    if abs(x - round(x)) < 1e-9:
        return str(round(x))
    return f"{x:.{digits}f}"


def summary_rows(report: SimulationReport) -> list[list[Any]]:
    rows = []
    for s in report.summaries:
        rows.append(
            [
                s.policy,
                s.job,
                f"{s.ettr:.3f}",
                f"{s.ettr_sd:.3f}" if s.trials > 1 else "",
                _num(s.interruptions),
                _num(s.restarts),
                _num(s.failed_starts),
                _num(s.repeat_failures),
                _num(s.stops),
                f"{s.interval_minutes:.1f}",
                f"{sum(s.lost_gpu_hours.values()):,.0f}",
            ]
        )
    return rows


def lost_rows(report: SimulationReport) -> list[list[Any]]:
    rows = []
    for s in report.summaries:
        lost = [s.lost_gpu_hours[c] for c in CATEGORIES]
        rows.append([s.policy, s.job, *(f"{v:,.0f}" for v in lost), f"{sum(lost):,.0f}"])
    return rows


def calibration_rows(report: SimulationReport) -> list[list[Any]]:
    """Per cause: the published count, the mean over trials, and a Poisson z-score."""
    rows = []
    trials = len(report.trace_counts)
    total_ref = 0.0
    total_sim = 0.0
    for comp in report.scenario.components:
        ref = comp.reference_count
        mean = fmean(c[comp.name] for c in report.trace_counts)
        total_sim += mean
        if ref is None:
            rows.append([comp.label, "", f"{mean:.1f}", ""])
            continue
        total_ref += ref
        z = (mean - ref) / math.sqrt(ref / trials) if ref > 0 else 0.0
        rows.append([comp.label, _num(ref), f"{mean:.1f}", f"{z:+.1f}"])
    if total_ref:
        z = (total_sim - total_ref) / math.sqrt(total_ref / trials)
        rows.append(["total", _num(total_ref), f"{total_sim:.1f}", f"{z:+.1f}"])
    return rows


def plot_timeline(report: SimulationReport, path: str | Path, job_index: int = 0) -> Path:
    """Draw the first trial's timeline of one job under every policy; write a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.patches import Patch

    out = Path(path)
    policies = list(report.runs)
    scen = report.scenario
    spec = scen.jobs[job_index]
    fig, (ax_t, ax_p) = plt.subplots(
        2,
        1,
        figsize=(13, 2.2 + 1.0 * len(policies) + 3.2),
        gridspec_kw={"height_ratios": [max(1.0, 0.8 * len(policies)), 2.2]},
        constrained_layout=True,
    )
    day = 86400.0
    for row, policy in enumerate(policies):
        job = report.runs[policy][0].jobs[job_index]
        by_state: dict[str, list[tuple[float, float]]] = {}
        for t0, t1, state in job.timeline:
            by_state.setdefault(state, []).append((t0 / day, (t1 - t0) / day))
        for state, spans in by_state.items():
            ax_t.broken_barh(
                spans,
                (row - 0.4, 0.8),
                facecolors=STATE_COLORS.get(state, "#777777"),
                linewidth=0,
            )
    ax_t.set_yticks(
        range(len(policies)),
        [f"{p}\nETTR {report.summary(p, spec.name).ettr:.3f}" for p in policies],
    )
    ax_t.invert_yaxis()
    ax_t.set_xlim(0, scen.duration_days)
    ax_t.set_xlabel("day")
    ax_t.set_title(
        f"{scen.name}: {spec.name} on {spec.gpus:,} GPUs, {scen.duration_days:g} days "
        f"(seed {report.seeds[0]}) — same failure trace for every policy"
    )
    ax_t.legend(
        handles=[Patch(color=c, label=STATE_LABELS[s]) for s, c in STATE_COLORS.items()],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.35),
        ncol=6,
        fontsize=8,
        frameon=False,
    )
    for policy in policies:
        job = report.runs[policy][0].jobs[job_index]
        if not job.progress:
            continue
        xs = [0.0] + [t / day for t, _ in job.progress]
        ys = [0.0] + [p / day for _, p in job.progress]
        ax_p.step(xs, ys, where="post", label=policy)
    ax_p.plot(
        [0, scen.duration_days],
        [0, scen.duration_days],
        color="#999999",
        linestyle=":",
        label="no failures, no overhead",
    )
    ax_p.set_xlim(0, scen.duration_days)
    ax_p.set_xlabel("wall-clock day")
    ax_p.set_ylabel("checkpointed training (days)")
    ax_p.legend(loc="upper left", fontsize=8)
    ax_p.grid(alpha=0.3)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
