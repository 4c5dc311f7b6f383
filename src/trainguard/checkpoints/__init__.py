"""Checkpoint catalog: find and validate checkpoints of several formats; interval advice.

Public API (stdlib only, never imports torch)::

    scan(root, verify="full"|"quick", cache=None) -> list[CheckpointInfo]   # newest first
    latest_valid(root, verify=..., cache=None) -> CheckpointInfo | None
    validate(path, verify=..., cache=None) -> CheckpointInfo
    VerdictCache()   # verdicts kept per (path, mtime, size): pass it as cache=
    locate(root) -> Located   # an output directory's checkpoint directory (.locate)
    advise(save_seconds, mtbf_seconds, restart_seconds=0.0, current_interval=None)
        -> IntervalAdvice                                         # see .interval

Formats and their completeness rules are documented in docs/checkpoints.md.
"""

from __future__ import annotations

from trainguard.checkpoints._fs import VERIFY_MODES, VerifyMode
from trainguard.checkpoints.catalog import (
    IN_PROGRESS_REASON,
    VerdictCache,
    latest_valid,
    scan,
    validate,
)
from trainguard.checkpoints.interval import (
    IntervalAdvice,
    Waste,
    advise,
    daly_interval,
    expected_waste,
    job_mtbf_seconds,
    young_interval,
)
from trainguard.checkpoints.locate import Located, checkpoint_root, locate
from trainguard.model.checkpoint import CheckpointInfo

__all__ = [
    "IN_PROGRESS_REASON",
    "VERIFY_MODES",
    "CheckpointInfo",
    "IntervalAdvice",
    "Located",
    "VerdictCache",
    "VerifyMode",
    "Waste",
    "advise",
    "checkpoint_root",
    "daly_interval",
    "expected_waste",
    "job_mtbf_seconds",
    "latest_valid",
    "locate",
    "scan",
    "validate",
    "young_interval",
]
