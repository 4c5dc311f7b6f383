"""How a Slurm job opts in to trainguard: its ``--comment`` (decision 0104).

    sbatch --comment trainguard ...
    sbatch --comment 'trainguard:policy=fast' ...
    sbatch --comment 'trainguard:policy=fast,ckpt=/data/ck/run7' ...
    sbatch --comment 'nightly run; trainguard:ckpt=/data/ck/run7' ...

The word ``trainguard`` (optionally followed by ``:key=value,...``) anywhere in the
comment, as its own token, opts the job in. Keys: ``policy`` (a policy stored in
the control plane), ``ckpt`` (the job's checkpoint directory: trainguard selects
the checkpoint to resume from there), ``mode`` (``observe``: record plans for this
job, never act). ``trainguard:off`` opts out explicitly. Unknown keys are kept and
reported, never an error: a typo must not break a running job's protection.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TOKEN_RE = re.compile(r"(?:^|[\s;])trainguard(?::(?P<args>[^\s;]*))?(?=$|[\s;])")
KNOWN_KEYS = frozenset({"policy", "ckpt", "mode"})


@dataclass(frozen=True)
class OptIn:
    policy: str | None = None
    checkpoint_dir: str | None = None
    mode: str | None = None  # "observe" or "act"; None: the control plane's mode
    unknown: dict[str, str] = field(default_factory=dict)


def parse_opt_in(comment: str | None) -> OptIn | None:
    """The job's opt-in, or ``None`` when its comment does not opt in."""
    if not comment:
        return None
    m = _TOKEN_RE.search(comment)
    if m is None:
        return None
    args = m.group("args") or ""
    if args.strip().lower() in ("off", "no", "false"):
        return None
    values: dict[str, str] = {}
    unknown: dict[str, str] = {}
    for part in args.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep:
            unknown[key] = ""
            continue
        (values if key in KNOWN_KEYS else unknown)[key] = value.strip()
    mode = values.get("mode")
    if mode is not None and mode not in ("observe", "act"):
        unknown["mode"] = mode
        mode = None
    return OptIn(
        policy=values.get("policy") or None,
        checkpoint_dir=values.get("ckpt") or None,
        mode=mode,
        unknown=unknown,
    )


__all__ = ["KNOWN_KEYS", "OptIn", "parse_opt_in"]
