"""Which nodes of a Slurm allocation the next attempt runs on (decisions 0510, 0511).

Inside a job's allocation (``trainguard run --spares K`` under ``srun``) the leader
restarts a failed attempt without leaving the allocation: on the survivors plus a
spare, on fewer nodes when the job allows it, or, when neither is possible, by giving
the job back to Slurm's requeue path. Pure: the allocation scheduler
(schedulers/allocation/) gathers the facts and applies the answer.

The safety rule, checked by property tests: a node out of the job's use is never
chosen again, whatever else happens.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from trainguard.model.allocation import Placement, PlacementKind


def next_placement(
    order: Sequence[str],
    current: Sequence[str],
    out: Collection[str],
    want: int,
    min_nodes: int,
) -> Placement:
    """The nodes of the next attempt.

    ``order``: the allocation's nodes (Slurm's order); ``current``: the last attempt's
    nodes (empty before the first); ``out``: nodes out of this job's use (lost, left out
    after a failure, drained); ``want``: the nodes the job runs on; ``min_nodes``: the
    fewest it may continue on. The survivors keep their places; spares are taken in
    allocation order.
    """
    if want < 1 or min_nodes < 1 or min_nodes > want:
        raise ValueError(f"need 1 <= min_nodes ({min_nodes}) <= want ({want})")
    bad = set(out)
    was = set(current)  # once: a set per element made this quadratic at 1,024 nodes
    usable = [n for n in dict.fromkeys(order) if n not in bad]
    keep = [n for n in usable if n in was]
    spares = [n for n in usable if n not in was]
    chosen_set = set(keep[:want]) | set(spares[: max(0, want - len(keep))])
    chosen = tuple(n for n in usable if n in chosen_set)
    left = len(usable) - len(chosen)
    lost = [n for n in current if n in bad]
    lost_words = ", ".join(lost) if lost else "none"
    if len(chosen) < min_nodes:
        return Placement(
            PlacementKind.REQUEUE,
            (),
            f"{len(usable)} usable node(s) of {len(set(order))} in the allocation "
            f"({', '.join(usable) or 'none'}), the job needs at least {min_nodes}; "
            f"out of its use: {', '.join(sorted(bad)) or 'none'}",
        )
    if len(chosen) < want:
        return Placement(
            PlacementKind.SMALLER,
            chosen,
            f"no spare left: continuing on {len(chosen)} of {want} node(s) "
            f"(--min-nodes {min_nodes}); lost {lost_words}",
            left,
        )
    if current and set(chosen) == was:
        return Placement(
            PlacementKind.SAME, chosen, "every node of the last attempt is usable", left
        )
    if not current:
        return Placement(PlacementKind.SAME, chosen, f"first attempt on {want} node(s)", left)
    added = [n for n in chosen if n not in was]
    return Placement(
        PlacementKind.SPARE,
        chosen,
        f"spare {', '.join(added)} replaces {lost_words}; {left} spare(s) left",
        left,
    )


def failed_nodes(
    failures: Sequence[tuple[float, str]], lost: Collection[str], attempt_nodes: Collection[str]
) -> frozenset[str]:
    """The nodes a failed attempt leaves out of the job's use.

    A lost node (its agent went silent) explains every other node's failure (their ranks
    die when a peer disappears): only the lost ones. Else the node whose rank failed
    first (``failures``: when each node reported its first failure, as the leader
    received it); the others' deaths followed from it. Nodes outside the attempt are
    never blamed for it.
    """
    mine = set(attempt_nodes)
    gone = frozenset(n for n in lost if n in mine)
    if gone:
        return gone
    ours = sorted((at, n) for at, n in failures if n in mine)
    return frozenset({ours[0][1]}) if ours else frozenset()


__all__ = ["Placement", "PlacementKind", "failed_nodes", "next_placement"]
