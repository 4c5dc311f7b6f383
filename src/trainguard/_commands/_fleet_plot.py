"""The PNG of ``trainguard fleet report --plot``: one page, six panels (matplotlib, Agg).

Top: interrupted GPU-hours by cause and by card model. Middle: by node (repeat
offenders in red, with their incident count) and by rack. Bottom: median time to
detect / act / recover per bucket, and checkpoint write time (median and p90). The
title carries the totals and the first-restart success rate.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

TOP_N = 12
REPEAT = "#c0392b"
PLAIN = "#4a78b5"


def _bars(
    ax: Any, groups: list[dict[str, Any]], title: str, repeat: set[str] | None = None
) -> None:
    ax.set_title(title, fontsize=11, loc="left")
    shown = groups[:TOP_N]
    if not shown:
        ax.text(0.5, 0.5, "no interrupted GPU-hours", ha="center", va="center", color="gray")
        ax.set_xticks([])
        ax.set_yticks([])
        return
    labels = [g["key"] for g in shown][::-1]
    values = [g["gpu_hours"] for g in shown][::-1]
    colors = [REPEAT if repeat and g["key"] in repeat else PLAIN for g in shown][::-1]
    bars = ax.barh(labels, values, color=colors)
    for bar, g in zip(bars, shown[::-1], strict=True):
        ax.text(
            bar.get_width(),
            bar.get_y() + bar.get_height() / 2,
            f" {g['gpu_hours']:.1f} h · {g['incidents']}",
            va="center",
            fontsize=8,
        )
    ax.set_xlabel("interrupted GPU-hours · incidents", fontsize=9)
    ax.set_xlim(0, max(values) * 1.35 or 1)
    ax.tick_params(axis="y", labelsize=8)
    if len(groups) > TOP_N:
        ax.text(
            1,
            -0.18,
            f"top {TOP_N} of {len(groups)}",
            transform=ax.transAxes,
            ha="right",
            fontsize=8,
            color="gray",
        )


def _day(point: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(point["start"].replace("Z", "+00:00"))


def _trends(ax: Any, data: dict[str, Any]) -> None:
    ax.set_title("Median time to detect / act / recover", fontsize=11, loc="left")
    drawn = False
    for key, label, style in (
        ("time_to_detect", "detect", "o-"),
        ("time_to_act", "act", "s-"),
        ("time_to_recover", "recover", "^-"),
    ):
        pts = data[key]
        if pts:
            ax.plot([_day(p) for p in pts], [p["median_s"] for p in pts], style, label=label)
            drawn = True
    if not drawn:
        ax.text(0.5, 0.5, "no incidents", ha="center", va="center", color="gray")
        return
    ax.set_ylabel("seconds", fontsize=9)
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.tick_params(axis="x", labelsize=8, rotation=30)


def _checkpoints(ax: Any, data: dict[str, Any]) -> None:
    ax.set_title("Checkpoint write time", fontsize=11, loc="left")
    pts = data["checkpoint_write"]
    if not pts:
        ax.text(
            0.5, 0.5, "no trainguard-format checkpoints", ha="center", va="center", color="gray"
        )
        return
    days = [_day(p) for p in pts]
    ax.plot(days, [p["median_s"] for p in pts], "o-", label="median")
    ax.plot(days, [p["p90_s"] for p in pts], "o--", label="p90")
    ax.set_ylabel("seconds", fontsize=9)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.tick_params(axis="x", labelsize=8, rotation=30)


def plot_report(data: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(3, 2, figsize=(13, 12.5))
    fr = data["first_restart"]
    rate = "-" if fr["rate"] is None else f"{100 * fr['rate']:.0f}%"
    fig.suptitle(
        f"trainguard fleet report  {data['since'][:16]} .. {data['until'][:16]} UTC\n"
        f"{data['incidents']} incidents · {data['recovered']} recovered · "
        f"{data['gpu_hours']:.1f} interrupted GPU-hours · first restart succeeded "
        f"{fr['succeeded']}/{fr['restarted']} ({rate})",
        fontsize=12,
    )
    repeat = {g["key"] for g in data["repeat_nodes"]}
    _bars(axes[0][0], data["by_cause"], "GPU-hours by cause")
    _bars(axes[0][1], data["by_model"], "GPU-hours by card model")
    _bars(axes[1][0], data["by_node"], "GPU-hours by node (red: repeat offender)", repeat)
    _bars(axes[1][1], data["by_rack"], "GPU-hours by rack")
    _trends(axes[2][0], data)
    _checkpoints(axes[2][1], data)
    if data["repeat_cards"]:
        cards = ", ".join(
            f"{c['key']} ({c['model']}, {c['incidents']}x)" for c in data["repeat_cards"][:4]
        )
        fig.text(0.01, 0.005, f"Repeat-offender cards: {cards}", fontsize=9, color=REPEAT)
    fig.tight_layout(rect=(0, 0.02, 1, 0.95))
    fig.savefig(path, dpi=100, format="png")  # exactly PATH, whatever its suffix
    plt.close(fig)
