"""The failure trace: every fault of one simulated run, drawn up front with numpy.

The trace depends only on the scenario and the seed, never on the policy, so the
three policies are compared on the *same* faults at the same times and places.
What a fault does to a job does depend on the policy: a fault on a device the
job no longer uses interrupts nothing, and the repeats of a "lemon" device only
hurt a policy that keeps using it.

Sampling is vectorised: the superposition of many independent per-device
Poisson processes is one Poisson process with the summed rate whose events land
on a uniformly chosen device, so each component costs one Poisson draw and two
array draws, whatever the cluster size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainguard.simulate.jobs import Fault
from trainguard.simulate.scenario import ComponentSpec, Scenario

# Each random stream is keyed by (seed, purpose, index) so that adding a component
# or a job leaves the draws of the others unchanged.
_BASE = 1
_LEMON = 2


@dataclass(frozen=True)
class FaultTrace:
    """Faults sorted by time. ``loc`` is a device, node or job index by the component's scope."""

    time: np.ndarray  # seconds since the start of the run
    comp: np.ndarray  # index into scenario.components
    loc: np.ndarray
    hard: np.ndarray  # leaves the resource broken until repaired
    lemon: np.ndarray  # makes the resource a lemon from now on
    culprit_known: np.ndarray  # the evidence names the device/host
    deterministic: np.ndarray  # a software fault that recurs at the same step
    u_detect: np.ndarray  # uniform draw for the detection delay (common random numbers)
    u_aux: np.ndarray  # uniform draw for the repair / human response durations
    u_fix: np.ndarray  # uniform draw for a software fix
    repeat_of: np.ndarray  # -1 for a primary fault; the index of the lemon's first fault

    def __len__(self) -> int:
        return int(self.time.shape[0])

    def faults(
        self, components: Sequence[ComponentSpec]
    ) -> Iterator[tuple[float, ComponentSpec, int, Fault, bool]]:
        """(time, component, location, fault, lemon) in time order; the fault's devices
        and node are filled in by the engine, which knows the placement."""
        for at, c, loc, hard, lemon, known, det, ud, ua, uf, rep in zip(
            self.time.tolist(),
            self.comp.tolist(),
            self.loc.tolist(),
            self.hard.tolist(),
            self.lemon.tolist(),
            self.culprit_known.tolist(),
            self.deterministic.tolist(),
            self.u_detect.tolist(),
            self.u_aux.tolist(),
            self.u_fix.tolist(),
            self.repeat_of.tolist(),
            strict=True,
        ):
            comp = components[c]
            fault = Fault(
                comp=comp,
                at=at,
                devices=(),
                node=None,
                hard=hard,
                culprit_known=known,
                deterministic=det,
                u_detect=ud,
                u_aux=ua,
                u_fix=uf,
                repeat=rep >= 0,
            )
            yield at, comp, loc, fault, lemon

    def primary_counts(self, scenario: Scenario) -> dict[str, int]:
        """Primary faults per component on the jobs' initial allocation.

        This is the count a calibration compares with a published table: the
        faults a job of that size would meet if it ran all the time.
        """
        gpn = scenario.cluster.gpus_per_node
        devices = np.zeros(scenario.cluster.total_gpus, dtype=bool)
        for alloc in placement(scenario):
            devices[alloc] = True
        nodes: np.ndarray = np.asarray(devices.reshape(-1, gpn).any(axis=1))
        counts = {c.name: 0 for c in scenario.components}
        primary = self.repeat_of < 0
        for ci, comp in enumerate(scenario.components):
            mask = primary & (self.comp == ci)
            locs = self.loc[mask]
            if comp.scope == "device":
                counts[comp.name] = int(devices[locs].sum())
            elif comp.scope == "node":
                counts[comp.name] = int(nodes[locs].sum())
            else:
                counts[comp.name] = int(locs.size)
        return counts


def trace_from_faults(scenario: Scenario, faults: list[dict[str, Any]]) -> FaultTrace:
    """A hand-written trace (tests, what-if questions): one dict per fault.

    Keys: ``time`` (s), ``comp`` (component name), ``loc`` (device, node or job
    index); optional ``hard``, ``lemon``, ``culprit_known``, ``deterministic``
    (bool), ``u_detect``, ``u_aux``, ``u_fix`` (uniform draws, default 0.5) and
    ``repeat_of`` (index of the lemon's first fault in this list, default -1).
    """
    names = {c.name: i for i, c in enumerate(scenario.components)}
    rows = sorted(enumerate(faults), key=lambda kv: float(kv[1]["time"]))
    new_index = {old: new for new, (old, _) in enumerate(rows)}
    cols: dict[str, list[Any]] = {k: [] for k in _COLUMNS}
    for _, f in rows:
        cols["time"].append(float(f["time"]))
        cols["comp"].append(names[f["comp"]])
        cols["loc"].append(int(f["loc"]))
        for key in ("hard", "lemon", "deterministic"):
            cols[key].append(bool(f.get(key, False)))
        cols["culprit_known"].append(bool(f.get("culprit_known", True)))
        for key in ("u_detect", "u_aux", "u_fix"):
            cols[key].append(float(f.get(key, 0.5)))
        rep = int(f.get("repeat_of", -1))
        cols["repeat_of"].append(new_index[rep] if rep >= 0 else -1)
    dtypes = {"time": float, "u_detect": float, "u_aux": float, "u_fix": float}
    arrays = {
        k: np.asarray(v, dtype=dtypes.get(k, bool if k in _BOOLS else np.int64))
        for k, v in cols.items()
    }
    return FaultTrace(**arrays)


_COLUMNS = (
    "time",
    "comp",
    "loc",
    "hard",
    "lemon",
    "culprit_known",
    "deterministic",
    "u_detect",
    "u_aux",
    "u_fix",
    "repeat_of",
)
_BOOLS = frozenset({"hard", "lemon", "culprit_known", "deterministic"})


def placement(scenario: Scenario) -> list[list[int]]:
    """Initial allocation: each job on its own run of whole nodes, in order."""
    gpn = scenario.cluster.gpus_per_node
    out: list[list[int]] = []
    node = 0
    for job in scenario.jobs:
        out.append(list(range(node * gpn, node * gpn + job.gpus)))
        node += -(-job.gpus // gpn)
    return out


def _rng(seed: int, purpose: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, purpose, index])


def generate_trace(scenario: Scenario, seed: int) -> FaultTrace:
    """Draw every fault of one run (``scenario.duration_seconds`` long)."""
    horizon = scenario.duration_seconds
    cluster = scenario.cluster
    parts: list[dict[str, np.ndarray]] = []
    for ci, comp in enumerate(scenario.components):
        if comp.scope == "job":
            # Job-scope faults (software) belong to a job; drawn per job on wall time,
            # they count only while that job runs (the engine drops the others).
            for ji, _job in enumerate(scenario.jobs):
                rng = _rng(seed, _BASE, ci * 1000 + ji)
                n = rng.poisson(comp.rate_per_second * horizon)
                parts.append(_draw(rng, n, ci, np.full(n, ji, dtype=np.int64), comp, horizon))
            continue
        units = cluster.total_gpus if comp.scope == "device" else cluster.total_nodes
        rng = _rng(seed, _BASE, ci * 1000)
        n = rng.poisson(comp.rate_per_second * units * horizon)
        loc = rng.integers(0, units, size=n, dtype=np.int64)
        parts.append(_draw(rng, n, ci, loc, comp, horizon))
    merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    merged["repeat_of"] = np.full(merged["time"].shape[0], -1, dtype=np.int64)
    order = np.lexsort((merged["loc"], merged["comp"], merged["time"]))
    base = {k: v[order] for k, v in merged.items()}

    # Lemon repeats: after its first failure a lemon fails again at its own rate
    # whenever it is used. Drawn on wall time; the engine counts a repeat only while
    # a running job uses the lemon (memoryless, so that equals a rate on in-use time).
    lemon_idx = np.flatnonzero(base["lemon"])
    if lemon_idx.size:
        rate = 1.0 / (scenario.lemon_mtbf_hours * 3600.0)
        reps: list[dict[str, np.ndarray]] = []
        for i in lemon_idx:
            rng = _rng(seed, _LEMON, int(i))
            start = float(base["time"][i])
            n = rng.poisson(rate * (horizon - start))
            if n == 0:
                continue
            comp = scenario.components[int(base["comp"][i])]
            rep = _draw(
                rng,
                n,
                int(base["comp"][i]),
                np.full(n, base["loc"][i], dtype=np.int64),
                comp,
                horizon - start,
            )
            rep["time"] = rep["time"] + start
            rep["hard"][:] = False  # a lemon passes a restart; it fails again later
            rep["lemon"][:] = False
            rep["deterministic"][:] = False
            rep["repeat_of"] = np.full(n, i, dtype=np.int64)
            reps.append(rep)
        if reps:
            allp = [base, *reps]
            merged = {k: np.concatenate([p[k] for p in allp]) for k in base}
            order = np.lexsort((merged["repeat_of"], merged["loc"], merged["time"]))
            base = {k: v[order] for k, v in merged.items()}
    return FaultTrace(**base)


def _draw(
    rng: np.random.Generator,
    n: int,
    ci: int,
    loc: np.ndarray,
    comp: ComponentSpec,
    horizon: float,
) -> dict[str, np.ndarray]:
    return {
        "time": rng.uniform(0.0, horizon, size=n),
        "comp": np.full(n, ci, dtype=np.int64),
        "loc": loc,
        "hard": rng.random(n) < comp.hard_fraction,
        "lemon": rng.random(n) < comp.lemon_fraction,
        "culprit_known": rng.random(n) < comp.culprit_known,
        "deterministic": rng.random(n) < comp.deterministic_fraction,
        "u_detect": rng.random(n),
        "u_aux": rng.random(n),
        "u_fix": rng.random(n),
    }
