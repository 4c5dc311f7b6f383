"""The simulated fleet: who holds each device, what is broken, quarantine and repair.

:class:`Fleet` is the hardware half of :class:`~trainguard.simulate.engine.Simulation`
(a base class of it): device ownership (``assign``/``release``), health states and
their transitions, quarantine (trainguard) and draining (baselines), and the repair
and validation pipeline that brings hardware back. It keeps no clock of its own: it
reads the engine's ``now`` and schedules through the engine's ``push``.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import numpy as np

from trainguard.model.health import HealthState, check_health_transition
from trainguard.simulate.jobs import Ev, Fault, Job
from trainguard.simulate.scenario import Dist, Scenario

if TYPE_CHECKING:
    from collections.abc import Callable


class Fleet:
    """Device state and the actions on it; the engine initialises the attributes."""

    scenario: Scenario
    now: float
    rng: random.Random
    gpn: int
    owner: list[int]
    owner_np: np.ndarray
    broken: dict[int, Fault]
    lemon_dev: set[int]
    lemon_node: set[int]
    health: list[HealthState]
    out_of_service: set[int]
    repair_pending: set[int]
    drain_requested: set[int]
    quarantines: int
    push: Callable[..., None]

    def node_devices(self, node: int) -> range:
        return range(node * self.gpn, (node + 1) * self.gpn)

    def hours(self, dist: Dist, u: float | None = None) -> float:
        """Seconds drawn from a distribution given in hours."""
        return dist.quantile(self.rng.random() if u is None else u) * 3600.0

    def set_health(self, device: int, new: HealthState) -> None:
        old = self.health[device]
        if old is new:
            return
        check_health_transition(old, new)
        self.health[device] = new

    def quarantine(self, devices: list[int] | range, fault: Fault | None) -> None:
        """Take devices out of scheduling (trainguard); repair starts once they are free."""
        for d in devices:
            if self.health[d] in (HealthState.HEALTHY, HealthState.SUSPECT):
                self.set_health(d, HealthState.QUARANTINED)
                self.quarantines += 1
                self.repair_pending.add(d)

    def start_pending_repairs(self) -> None:
        """Send quarantined devices that no job holds to repair, one ticket per node."""
        if not self.repair_pending:
            return
        groups: dict[int, list[int]] = {}
        for d in sorted(self.repair_pending):
            if self.owner[d] == -1:
                groups.setdefault(d // self.gpn, []).append(d)
        for devices in groups.values():
            for d in devices:
                self.repair_pending.discard(d)
                self.set_health(d, HealthState.REPAIR)
            at = self.now + self._repair_seconds(devices)
            self.push(at, Ev.RESOURCE, -1, 0, ("repaired", tuple(devices)))

    def _repair_seconds(self, devices: list[int] | range) -> float:
        # The fault that broke the hardware carries the draw, so that the same broken
        # part takes as long to repair under every policy.
        u = next((self.broken[d].u_aux for d in devices if d in self.broken), None)
        return self.hours(self.scenario.repair.hours, u)

    def take_out(self, devices: list[int] | range, repair: bool = True, delay: float = 0.0) -> None:
        """Baselines: a person drains hardware and sends it to repair (one ticket)."""
        fresh = [d for d in devices if d not in self.out_of_service]
        if not fresh:
            return
        self.out_of_service.update(fresh)
        if repair:
            at = self.now + delay + self._repair_seconds(fresh)
            self.push(at, Ev.RESOURCE, -1, 0, ("returned", tuple(fresh)))

    def release(self, job: Job) -> None:
        ji = job.index
        owner = self.owner
        for d in job.alloc:
            if owner[d] == ji:
                owner[d] = -1
        if job.alloc:
            idx = np.asarray(job.alloc, dtype=np.int64)
            self.owner_np[idx[self.owner_np[idx] == ji]] = -1
        job.alloc = []
        job.alloc_set = set()

    def assign(self, job: Job, devices: list[int]) -> None:
        if devices is job.alloc or devices == job.alloc:
            return
        ji = job.index
        owner = self.owner
        new = set(devices)
        old = job.alloc_set
        gone = [d for d in old - new if owner[d] == ji]
        added = list(new - old)
        for d in added:
            if owner[d] != -1 and owner[d] != ji:
                raise RuntimeError(f"device {d} already belongs to job {owner[d]}")
        for d in gone:
            owner[d] = -1
        for d in added:
            owner[d] = ji
        self.owner_np[gone] = -1
        self.owner_np[added] = ji
        job.alloc = list(devices)
        job.alloc_set = new

    def _resource_event(self, data: object) -> bool:
        """Apply a repair/validation step; True when capacity may have come back."""
        assert isinstance(data, tuple)
        what, target = data
        scen = self.scenario
        if what == "drain":  # baselines: a person drains a node that keeps failing
            self.take_out(list(self.node_devices(target)))
            return False
        devices: tuple[int, ...] = target
        if what == "returned":  # baselines: repaired hardware back in service
            for d in devices:
                self._fix(d, scen.repair.fixes_lemon)
                self.out_of_service.discard(d)
                self.drain_requested.discard(d // self.gpn)
        elif what == "repaired":  # trainguard: repair done, validate before return
            for d in devices:
                self._fix(d, scen.repair.fixes_lemon)
                self.set_health(d, HealthState.VALIDATING)
            at = self.now + self.hours(scen.repair.validation_hours)
            self.push(at, Ev.RESOURCE, -1, 0, ("validated", devices))
            return False
        elif what == "validated":
            failed = [
                d
                for d in devices
                if self._is_lemon(d) and self.rng.random() < scen.repair.validation_catches_lemon
            ]
            for d in devices:
                if d in failed:
                    # Validation caught the weak part: back to repair, replaced this time.
                    self.set_health(d, HealthState.REPAIR)
                    self._fix(d, 1.0, forced=True)
                else:
                    self.set_health(d, HealthState.HEALTHY)
            if failed:
                at = self.now + self.hours(scen.repair.hours)
                self.push(at, Ev.RESOURCE, -1, 0, ("repaired", tuple(failed)))
        return True

    def _is_lemon(self, d: int) -> bool:
        return d in self.lemon_dev or (d // self.gpn) in self.lemon_node

    def _fix(self, d: int, p_lemon: float, forced: bool = False) -> None:
        self.broken.pop(d, None)
        if self._is_lemon(d) and (forced or self.rng.random() < p_lemon):
            self.lemon_dev.discard(d)
            self.lemon_node.discard(d // self.gpn)
