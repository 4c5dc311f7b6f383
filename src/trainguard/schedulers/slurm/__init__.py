"""The Slurm scheduler adapter: observe and act on a real Slurm cluster.

See :mod:`trainguard.schedulers.slurm.scheduler` (``SlurmScheduler``, the
``ClusterScheduler`` the control plane acts through), ``parse`` (Slurm's JSON and
``scontrol -o`` output), ``names`` (validation), ``optin`` (``--comment trainguard``)
and ``docs/slurm.md``.
"""

from __future__ import annotations

from trainguard.schedulers.slurm.optin import OptIn, parse_opt_in
from trainguard.schedulers.slurm.scheduler import (
    SlurmObservedJob,
    SlurmObservedNode,
    SlurmScheduler,
    from_env,
    load_inventory,
)

__all__ = [
    "OptIn",
    "SlurmObservedJob",
    "SlurmObservedNode",
    "SlurmScheduler",
    "from_env",
    "load_inventory",
    "parse_opt_in",
]
