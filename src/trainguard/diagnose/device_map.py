"""The job's device map: which rank had which device, from what the launch says
and from what the ranks themselves report.

Pure (no I/O): the launch command line's world size (``torchrun_world_size``) and
the attempt's devices in order (``TRAINGUARD_DEVICES``, node by node) give each
rank's view (:class:`~trainguard.diagnose.detectors.RankView`); ``rank_using``
then names the rank that had a device. Without it a device's position in the
attempt names a rank, which is wrong when ranks != devices (a 2-rank job on two
2-GPU nodes: the second node's second card is not "rank 3"; issue 13).

A rank that reports progress through ``trainguard.train`` says its node,
``LOCAL_RANK`` and ``CUDA_VISIBLE_DEVICES`` (``RankReport``, decision 0322):
``reported_views`` resolves those to the attempt's devices, which covers any
launcher (``mp.spawn``, ``srun``), and ``merge_views`` puts them before the views
a command line implies.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from trainguard.diagnose.detectors import RankView
from trainguard.model.devices import Device
from trainguard.model.records import RankReport

_TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")


# torchrun options that take no value (everything else of the form --opt takes one).
_TORCHRUN_FLAGS = frozenset(
    {"--standalone", "--no-python", "--no_python", "-m", "--module", "--run-path", "--run_path"}
)


def torchrun_world_size(command: Sequence[str]) -> int | None:
    """``--nproc-per-node`` x ``--nnodes`` of a torchrun command line, when both are fixed.

    Recognises ``torchrun ...`` and ``python -m torch.distributed.run|launch ...``
    (also behind a wrapper such as ``env`` or ``srun``). ``None`` when the command
    is not torchrun, ``--nproc-per-node`` is missing or symbolic (``gpu``,
    ``auto``) or ``--nnodes`` is a range (``1:4``).
    """
    args = list(command)
    start = None
    for i, token in enumerate(args):
        if posixpath.basename(token) == "torchrun":
            start = i + 1
            break
        if token == "-m" and i + 1 < len(args) and args[i + 1] in _TORCHRUN_MODULES:
            start = i + 2
            break
    if start is None:
        return None
    values: dict[str, str] = {}
    i = start
    while i < len(args):
        token = args[i]
        if not token.startswith("-"):
            break  # the training script: its own options follow
        key, eq, value = token.partition("=")
        key = key.replace("_", "-")
        if eq:
            values[key] = value
            i += 1
        elif token in _TORCHRUN_FLAGS:
            i += 1
        else:
            if i + 1 < len(args):
                values[key] = args[i + 1]
            i += 2
    nproc = values.get("--nproc-per-node")
    nnodes = values.get("--nnodes", "1")
    if nproc is None or not nproc.isdigit():
        return None
    lo, _, hi = nnodes.partition(":")
    if not lo.isdigit() or (hi and hi != lo):
        return None
    return int(nproc) * int(lo)


def rank_views(devices: Sequence[Device], world_size: int | None) -> tuple[RankView, ...]:
    """Each rank's view of an attempt on ``devices`` (in launch order, node by node)
    with ``world_size`` ranks spread evenly over its nodes (torchrun, Slurm tasks):
    rank = node index x ranks per node + local rank. A node with one rank per device
    gives each rank its own device; otherwise every rank of a node sees all of the
    node's devices and uses its ``local_rank``-th (torchrun's convention). Empty
    when the world size is unknown or does not divide over the nodes."""
    if not world_size or world_size <= 0 or not devices:
        return ()
    nodes: dict[str, list[Device]] = {}
    for d in devices:
        nodes.setdefault(d.host, []).append(d)
    if world_size % len(nodes):
        return ()
    per = world_size // len(nodes)
    views: list[RankView] = []
    for n, devs in enumerate(nodes.values()):
        uuids = tuple(d.uuid for d in devs)
        for local in range(per):
            visible = (uuids[local],) if per == len(uuids) else uuids
            views.append(RankView(rank=n * per + local, local_rank=local, visible=visible))
    return tuple(views)


def _resolve(entry: str, node: Sequence[Device], devices: Sequence[Device]) -> str:
    """One ``CUDA_VISIBLE_DEVICES`` entry as the UUID of the attempt's device it names:
    a UUID (or a unique ``GPU-`` prefix of one) anywhere, an index on the rank's own
    node. Unresolved, a token no device matches (an index alone would match the card
    of that index on every node)."""
    if entry.startswith(("GPU-", "MIG-")):
        hits = [d.uuid for d in devices if d.uuid == entry or d.uuid.startswith(entry)]
        if len(hits) == 1:
            return hits[0]
    elif entry.isdigit():
        hits = [d.uuid for d in node if d.index == int(entry)]
        if len(hits) == 1:
            return hits[0]
    return f"unresolved:{entry}"


def reported_views(
    reports: Sequence[RankReport], devices: Sequence[Device]
) -> tuple[RankView, ...]:
    """The views the ranks reported, their entries resolved to the attempt's ``devices``.

    A rank's node is the one it named when the attempt has a device there; with one
    node, that node (a host name need not match the scheduler's node name). A rank
    whose node is unknown still resolves UUID entries."""
    hosts = {d.host for d in devices}
    out: list[RankView] = []
    for r in reports:
        if not r.visible and r.local_rank is None:
            continue  # it reported progress, not its devices: the launch's view stands
        host = r.host if r.host in hosts else (next(iter(hosts)) if len(hosts) == 1 else None)
        node = [d for d in devices if host is not None and d.host == host]
        visible = tuple(_resolve(e, node, devices) for e in r.visible)
        out.append(RankView(rank=r.rank, local_rank=r.local_rank, visible=visible))
    return tuple(out)


def merge_views(reported: Sequence[RankView], derived: Sequence[RankView]) -> tuple[RankView, ...]:
    """The ranks' own reports first; a rank that reported nothing keeps the view the
    launch implies (a job that reports from rank 0 only)."""
    seen = {v.rank for v in reported}
    return (*reported, *(v for v in derived if v.rank not in seen))


__all__ = ["merge_views", "rank_views", "reported_views", "torchrun_world_size"]
