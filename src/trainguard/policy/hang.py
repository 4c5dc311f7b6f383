"""When "no progress" is a hang: one rule for every mode (decision 0130).

``trainguard run`` and the cluster reconciler (``serve``, ``slurm watch``) both
build their :class:`~trainguard.diagnose.detectors.HangDetector` from the job's
:class:`~trainguard.model.plan.RecoveryPolicy` through :func:`hang_config`:
adaptive by default (``max(floor, multiple x the slowest recent step interval)``,
the start-up allowance until two progress points are known), a fixed timeout
only when ``hang_timeout_seconds`` is set. Before this, ``serve`` detected no
hang at all unless a fixed timeout was configured.
"""

from __future__ import annotations

from trainguard.diagnose.detectors import HangConfig, HangDetector
from trainguard.model.plan import RecoveryPolicy


def hang_config(policy: RecoveryPolicy) -> HangConfig:
    """The hang detector's configuration for a job under ``policy``."""
    return HangConfig(
        hang_timeout_seconds=policy.hang_timeout_seconds,
        hang_floor_seconds=policy.hang_floor_seconds,
        hang_multiple=policy.hang_multiple,
        hang_startup_seconds=policy.hang_startup_seconds,
    )


def no_progress_hint(pattern: str | None) -> str:
    """What a user can do when a job never showed progress: it may be training fine in a
    form trainguard cannot see, and will then be restarted as hung again and again."""
    matched = (
        f"no output line matched --progress-pattern {pattern!r}"
        if pattern
        else "no output line looked like progress (step=N, step N, iteration N, [N/M])"
    )
    return (
        f"{matched} and no trainguard.train progress report arrived; if the job does make "
        "progress, give --progress-pattern REGEX with a group for the step, or report it "
        "with trainguard.train.report_progress(step) or a trainguard.integrations callback "
        "(Hugging Face Trainer, Lightning); docs/run.md"
    )


def hang_detector(
    policy: RecoveryPolicy, started_at: float, no_progress_hint: str = ""
) -> HangDetector:
    """A fresh detector for an attempt that started at ``started_at``; ``no_progress_hint``
    is what its finding tells a user when no progress was ever seen."""
    return HangDetector(
        hang_config(policy), started_at=started_at, no_progress_hint=no_progress_hint
    )


__all__ = ["hang_config", "hang_detector", "no_progress_hint"]
