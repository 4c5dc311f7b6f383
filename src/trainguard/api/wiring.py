"""How ``trainguard serve`` is wired: its options, the scheduler it drives and the
controller facade it builds.

Both the API process (:mod:`trainguard.api.server`) and the reconcile child
(:mod:`trainguard.api.loop_process`, decision 0095) build the same control plane
from the same options; keeping that here lets each import it without importing
the other (no server <-> loop_process cycle).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.api.middleware import DEFAULT_MAX_BODY
from trainguard.policy.breaker import BreakerConfig
from trainguard.policy.verify import DEFAULT_MAX_RANKS


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8470
    database: str = ".trainguard/state.db"
    token_file: str | None = None
    mode: str = "observe"
    public_read: bool = False
    reconcile_interval: float = 1.0
    heartbeat_interval: float = 1.0
    max_body: int = DEFAULT_MAX_BODY
    log_level: str = "warning"
    controller: bool = True
    holder: str | None = None  # leader-lease identity (default host:pid:random)
    scheduler: str | None = None  # "procs" or MODULE:FACTORY of a ClusterScheduler
    procs_root: str | None = None
    procs_nodes: str = "n1=2"
    repair_webhook: str | None = None
    page_webhook: str | None = None
    loop: str = "process"  # "process": the reconcile loop in a child (0095); "thread"
    tls_cert: str | None = None  # PEM certificate (chain); with tls_key: serve HTTPS
    tls_key: str | None = None
    insecure_bind: bool = False  # allow plain HTTP on a non-loopback address (issue 25)
    default_database: bool = False  # the database is the default path (its dir may be made)
    keep_rejected_in_place: bool = False  # do not move damaged checkpoints aside (0146)
    bmc_config: str | None = None  # nodes' BMCs (TOML): the lost-node step runs (0242)
    breaker: BreakerConfig = field(default_factory=BreakerConfig)  # --breaker-* (0375)
    max_ranks: int = DEFAULT_MAX_RANKS  # ranks of a job whose world size is unknown (0405)

    def to_json(self) -> dict[str, Any]:
        """The options as plain JSON values: how they travel to the reconcile child."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ServeOptions:
        """:meth:`to_json` back: the nested configs become dataclasses again."""
        data = dict(data)
        if isinstance(data.get("breaker"), dict):
            data["breaker"] = BreakerConfig(**data["breaker"])
        return cls(**data)


def parse_nodes(text: str) -> dict[str, int]:
    """``n1=2,n2=4`` -> ``{"n1": 2, "n2": 4}`` (nodes and their simulated devices)."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, count = part.partition("=")
        if not sep or not name.strip() or not count.strip().isdigit():
            raise ValueError(f"--procs-nodes: expected NAME=COUNT[,NAME=COUNT...], got {part!r}")
        out[name.strip()] = int(count)
    if not out:
        raise ValueError("--procs-nodes: no nodes given")
    return out


def load_scheduler(spec: str | None, options: ServeOptions | None = None) -> Any | None:
    """The cluster scheduler named by ``--scheduler``.

    ``procs``: the stand-in :class:`~trainguard.schedulers.procs.ProcessCluster`
    (jobs as local process groups; ``--procs-root``, ``--procs-nodes``). Otherwise
    ``package.module:factory`` or ``path/to/file.py:factory``, where ``factory()``
    returns a ``ClusterScheduler``.
    """
    if not spec:
        return None
    if spec == "procs":
        from trainguard.schedulers.procs import ProcessCluster

        opts = options or ServeOptions()
        root = opts.procs_root or str(Path(opts.database).parent / "cluster")
        return ProcessCluster(root, nodes=parse_nodes(opts.procs_nodes))
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise ValueError(f"--scheduler {spec!r}: expected MODULE:FACTORY or FILE.py:FACTORY")
    if target.endswith(".py"):
        import importlib.util

        mod_spec = importlib.util.spec_from_file_location(Path(target).stem, target)
        if mod_spec is None or mod_spec.loader is None:
            raise ValueError(f"--scheduler: cannot load {target}")
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[mod_spec.name] = module
        mod_spec.loader.exec_module(module)
    else:
        import importlib

        module = importlib.import_module(target)
    factory = getattr(module, attr, None)
    if factory is None:
        raise ValueError(f"--scheduler: {target} has no {attr!r}")
    return factory()


def build_control(
    store: Any, options: ServeOptions, clock: Callable[[], float], scheduler: Any | None = None
) -> Any | None:
    """The controller facade for this server (``None`` with ``controller=False``)."""
    if not options.controller:
        return None
    from trainguard.controller.service import ControlConfig, ControlPlane
    from trainguard.model.plan import Mode

    config = ControlConfig(
        default_mode=Mode(options.mode),
        interval=options.reconcile_interval,
        repair_webhook=options.repair_webhook,
        page_webhook=options.page_webhook,
        keep_rejected_in_place=options.keep_rejected_in_place,
        breaker=options.breaker,
        max_ranks=options.max_ranks,
    )
    control = ControlPlane(store, scheduler, clock, config=config, identity=options.holder)
    if options.bmc_config:
        control.reconciler.node_recovery = _node_recovery(control, scheduler, options)
    return control


def _node_recovery(control: Any, scheduler: Any | None, options: ServeOptions) -> Any:
    """The lost-node step over the BMCs of ``--bmc-config`` (decision 0242); its power
    actions are kept in the shared store with the approvals (decision 0414)."""
    from trainguard.controller.node_recovery import NodeRecovery, scheduler_validation
    from trainguard.schedulers.base import SchedulerError

    if scheduler is None:
        raise ValueError("--bmc-config needs a cluster scheduler (--scheduler)")
    assert options.bmc_config is not None
    try:
        return NodeRecovery.from_config(
            control.fleet,
            scheduler,
            options.bmc_config,
            validate=scheduler_validation(scheduler),
            actor=control.identity,
            webhook=options.repair_webhook,
            clock=control.clock,
        )
    except (SchedulerError, ImportError) as exc:
        raise ValueError(str(exc)) from None


__all__ = ["ServeOptions", "build_control", "load_scheduler", "parse_nodes"]
