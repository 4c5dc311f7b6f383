"""The control plane's step for lost nodes: gather facts, decide purely, act, verify.

:class:`NodeRecovery` is self-contained: the engine calls
:meth:`NodeRecovery.run_once` once per pass with the pass's observation, its
fencing token and the time (decision 0242). Each call re-reads what it needs
(level-based): in-band answering (the ``probe``; default: the scheduler does
not report the node ``down``), the node's health and repair record in the
store, the BMC's latest reading (only for a node that does not answer or that
this recovery holds), the approval of the next power cycle, and the power cycles
of the shared power-action ledger (decision 0414). It asks
:func:`trainguard.policy.node_recovery.decide_node` and carries the step out:

* ``isolate``: drain through the scheduler, quarantine in the store, open the
  repair record with the BMC evidence (controller/repair.py), audit the
  route; the node's health reason starts with :data:`MARK`, which is how later
  passes know the isolation is this recovery's.
* ``request_approval``: an approval row for the power cycle's action key.
* ``power_cycle``: the ledger row and its intent audit (one fenced transaction),
  then the BMC action is handed to the node's lane of the :class:`BmcWorker`
  (decision 0416): every request is written ahead in the ledger under the fencing
  token, the result (verified from fresh reads) and its audit are written when it
  ends, with the result on the repair record; the pass never waits for a BMC.
* ``finish_cycle``: a cycle the ledger holds unfinished (this server crashed, or
  another server led when it started) is resumed from its recorded requests.
* ``validate``: quarantined -> validating, the validation (``validate``), its
  result on the repair record; ``return``: resume the node, validating ->
  healthy, the repair closed as ``validated``; ``repair``: -> repair, record open.

Keys are per repair episode (``node-recovery:<node>:r<repair id>:...``) and live
in the shared store with the approvals, so neither a restarted controller nor a
new leader on another server repeats a cycle or asks twice.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from trainguard.controller.bmc_worker import BmcWorker
from trainguard.controller.repair import open_repair_for
from trainguard.model.bmc import BmcActionResult, BmcReading, PowerActionRecord
from trainguard.model.fleet import ApprovalState, RepairRecord, RepairState
from trainguard.model.health import HealthState
from trainguard.model.records import AuditKind
from trainguard.policy.node_recovery import (
    Approval,
    NodeDecision,
    NodeFacts,
    NodeRecoveryPolicy,
    NodeStep,
    decide_node,
)
from trainguard.schedulers.base import (
    ClusterScheduler,
    JobPhase,
    NodePhase,
    Observation,
    SchedulerError,
)
from trainguard.schedulers.redfish import ActionJournal
from trainguard.store.errors import NotFound
from trainguard.store.fleet import Fence, Fenced, FleetStore

MARK = "node recovery: "
log = logging.getLogger(__name__)


class Bmc(Protocol):
    """What the step needs of a node's BMC (:class:`~trainguard.schedulers.redfish.RedfishBmc`)."""

    def read(self) -> BmcReading: ...

    def act(self, action: str, *, key: str, journal: ActionJournal) -> BmcActionResult: ...


class StoreJournal:
    """One power action's requests in the shared ledger, written under ``fence``: a
    deposed leader's ``intend`` raises :class:`Fenced` and its request is not sent."""

    def __init__(
        self, fleet: FleetStore, key: str, fence: Fence, clock: Callable[[], float]
    ) -> None:
        self.fleet, self.key, self.fence, self.clock = fleet, key, fence, clock

    def requests(self) -> list[tuple[str, str]]:
        got = self.fleet.power.get_power_action(self.key)
        return [] if got is None else [(r.request, r.state) for r in got.requests]

    def intend(self, request: str) -> None:
        self.fleet.power.record_power_request(
            self.key, request, "intended", fence=self.fence, at=self.clock()
        )

    def sent(self, request: str) -> None:
        self.fleet.power.record_power_request(
            self.key, request, "sent", fence=self.fence, at=self.clock()
        )


@dataclass(frozen=True)
class Validation:
    passed: bool
    detail: str


@dataclass(frozen=True)
class NodeOutcome:
    """What one pass did for one node (for logs, the CLI and the demo)."""

    node: str
    step: NodeStep
    reason: str
    detail: dict[str, Any] = field(default_factory=dict)


class NodeRecovery:
    """See the module docstring."""

    def __init__(
        self,
        fleet: FleetStore,
        scheduler: ClusterScheduler,
        bmcs: Mapping[str, Bmc],
        *,
        validate: Callable[[str], Validation],
        probe: Callable[[str], bool] | None = None,
        policy: NodeRecoveryPolicy | None = None,
        actor: str = "trainguard",
        webhook: str | None = None,
        clock: Callable[[], float] = time.time,
        worker: BmcWorker | None = None,
    ) -> None:
        self.fleet = fleet
        self.scheduler = scheduler
        self.worker = worker or BmcWorker(bmcs)
        self.clock = clock
        # why a cycle was left unfinished on this server (shown while it is resumed)
        self._unfinished: dict[str, str] = {}
        self.validate = validate
        self.probe = probe
        self.policy = policy or NodeRecoveryPolicy()
        self.actor = actor
        self.webhook = webhook

    @property
    def bmcs(self) -> dict[str, Bmc]:
        return {n: self.worker.bmc(n) for n in self.worker.nodes}

    @classmethod
    def from_config(
        cls,
        fleet: FleetStore,
        scheduler: ClusterScheduler,
        bmc_config: str | os.PathLike[str],
        *,
        validate: Callable[[str], Validation],
        **kwargs: Any,
    ) -> NodeRecovery:
        """The step for the nodes of a BMC config file (``schedulers.redfish.load_bmc_config``);
        its power actions are kept in ``fleet``'s shared power-action ledger."""
        from trainguard.schedulers.redfish import bmcs_from_config, load_bmc_config

        bmcs = bmcs_from_config(load_bmc_config(bmc_config))
        return cls(fleet, scheduler, bmcs, validate=validate, **kwargs)

    def close(self) -> None:
        self.worker.close()

    # --- facts -----------------------------------------------------------------------

    def _answering(self, obs: Observation, node: str) -> bool:
        if self.probe is not None:
            return self.probe(node)
        return obs.nodes[node].phase is not NodePhase.DOWN

    def _drained(self, obs: Observation, node: str) -> bool:
        """Isolated by the scheduler with no running or pending work on it."""
        if obs.nodes[node].phase is NodePhase.UP:
            return False
        return not any(
            node in j.nodes and j.phase in (JobPhase.RUNNING, JobPhase.PENDING)
            for j in obs.jobs.values()
        )

    @staticmethod
    def key(node: str, repair_id: int, what: str) -> str:
        return f"node-recovery:{node}:r{repair_id}:{what}"

    def _cycles(
        self, node: str, repair: RepairRecord | None
    ) -> tuple[int, float | None, PowerActionRecord | None]:
        """Power cycles finished in this repair episode, when the last one finished, and
        the next one when the ledger holds it unfinished (all from the shared store)."""
        if repair is None:
            return 0, None, None
        n, last = 0, None
        while True:
            got = self.fleet.power.get_power_action(
                self.key(node, repair.id, f"power_cycle:{n + 1}")
            )
            if got is None:
                return n, last, None
            if not got.finished:
                return n, last, got
            n, last = n + 1, got.finished_at

    def _seen(self, obs: Observation, node: str) -> tuple[bool, BmcReading | None, bool]:
        """In-band answering, the BMC's latest reading (when it is needed) and whether a
        configured BMC's reading is still pending (off the pass: never waits)."""
        answering = self._answering(obs, node)
        if node not in self.worker.nodes:
            return answering, None, False
        try:
            rec = self.fleet.nodes.get_node(node)
            wanted = (not answering and rec.state.schedulable) or (
                (rec.reason or "").startswith(MARK)
                and rec.state in (HealthState.QUARANTINED, HealthState.VALIDATING)
            )
        except NotFound:
            wanted = not answering
        if not wanted:
            return answering, None, False
        reading = self.worker.reading(node)
        return answering, reading, reading is None

    def facts(
        self,
        obs: Observation,
        node: str,
        now: float,
        seen: Mapping[str, tuple[bool, BmcReading | None, bool]] | None = None,
    ) -> tuple[NodeFacts, RepairRecord | None]:
        """Everything :func:`decide_node` needs about ``node``, read fresh (``seen``: the
        pass's in-band and BMC view of every node, for the nodes lost with their BMC)."""
        seen = dict(seen) if seen is not None else {node: self._seen(obs, node)}
        try:
            rec = self.fleet.nodes.get_node(node)
        except NotFound:
            rec = self.fleet.nodes.register_node(
                node, at=now, partition=obs.nodes[node].partition, actor=self.actor
            )
        answering, reading, pending = seen[node]
        ours = (rec.reason or "").startswith(MARK)
        repair = self.fleet.repairs.open_repair_for("node", node) if ours else None
        cycles, last, unfinished = self._cycles(node, repair)
        approval = Approval.NONE
        if repair is not None:
            got = self.fleet.approvals.approval_for(
                self.key(node, repair.id, f"power_cycle:{cycles + 1}")
            )
            if got is not None:
                approval = Approval(got.state.value)
        validation = None
        if repair is not None and repair.validations:
            last_v = repair.validations[-1]
            if last_v.get("by") == "node-recovery" and last_v.get("after_cycle") == cycles:
                validation = bool(last_v.get("passed"))
        peers = tuple(
            sorted(
                n
                for n, (ans, r, _) in seen.items()
                if n != node and not ans and r is not None and not r.reachable
            )
        )
        return (
            NodeFacts(
                node=node,
                answering=answering,
                health=rec.state,
                reading=reading,
                drained=self._drained(obs, node),
                approval=approval,
                power_cycles=cycles,
                last_cycle_at=last,
                cycle_in_progress=unfinished is not None,
                bmc_pending=pending,
                peers_lost_with_bmc=peers,
                validation=validation,
                ours=ours,
                now=now,
            ),
            repair,
        )

    # --- the pass --------------------------------------------------------------------

    def run_once(self, obs: Observation, fence: Fence, now: float) -> list[NodeOutcome]:
        """One pass over every node of ``obs`` (nodes with nothing to do are not listed)."""
        self.fleet.lease.check_fence(fence, now)
        out: list[NodeOutcome] = []
        seen = {node: self._seen(obs, node) for node in sorted(obs.nodes)}
        for node in sorted(obs.nodes):
            facts, repair = self.facts(obs, node, now, seen)
            decision = decide_node(facts, self.policy)
            if decision.step is NodeStep.NOTHING and (
                not facts.ours or facts.health in (HealthState.REPAIR, HealthState.RETIRED)
            ):
                continue
            out.append(self._carry_out(decision, facts, repair, fence, now))
        return out

    def _audit(
        self, kind: AuditKind, node: str, message: str, data: dict[str, Any], now: float
    ) -> None:
        self.fleet.store.audit.append_audit(now, self.actor, kind, f"node:{node}", message, data)

    def _carry_out(
        self,
        d: NodeDecision,
        facts: NodeFacts,
        repair: RepairRecord | None,
        fence: Fence,
        now: float,
    ) -> NodeOutcome:
        node, step = d.node, d.step
        detail: dict[str, Any] = {"route": d.route.value if d.route else None}
        if facts.reading is not None:
            detail["bmc"] = {
                "power": facts.reading.power.value,
                "reachable": facts.reading.reachable,
                "error": facts.reading.error,
            }
        if step is NodeStep.ISOLATE:
            repair = self._isolate(d, fence, now)
            detail["repair"] = repair.id
        elif step is NodeStep.REQUEST_APPROVAL:
            assert repair is not None
            key = self.key(node, repair.id, f"power_cycle:{facts.power_cycles + 1}")
            approval = self.fleet.approvals.request_approval(
                kind="power_cycle",
                subject=f"node:{node}",
                why=d.needs_approval or d.reason,
                at=now,
                actor=self.actor,
                action_key=key,
                data={"node": node, "reason": d.reason, "evidence": list(d.evidence)},
                fence=fence,
            )
            detail.update(approval=approval.id, key=key)
        elif step is NodeStep.POWER_CYCLE:
            assert repair is not None
            detail.update(self._power_cycle(d, facts, repair, fence, now))
        elif step is NodeStep.FINISH_CYCLE:
            assert repair is not None
            detail.update(self._finish_cycle(node, facts, repair, fence))
        elif step is NodeStep.VALIDATE:
            assert repair is not None
            detail.update(self._validate(d, facts, repair, fence, now))
        elif step is NodeStep.RETURN:
            assert repair is not None
            self._return(node, repair, fence, now)
        elif step is NodeStep.REPAIR:
            self._to_repair(d, facts, repair, now)
        return NodeOutcome(node=node, step=step, reason=d.reason, detail=detail)

    def _isolate(self, d: NodeDecision, fence: Fence, now: float) -> RepairRecord:
        node = d.node
        reason = MARK + d.reason
        self._audit(
            AuditKind.DECISION,
            node,
            f"node {node}: {d.reason}",
            {"route": d.route.value if d.route else None, "evidence": list(d.evidence)},
            now,
        )
        self.scheduler.drain(
            node, reason[:200], key=f"node-recovery:{node}:drain:{now:.3f}", token=fence.token
        )
        with self.fleet.lease.fenced(fence, now):
            self.fleet.nodes.transition_node(node, HealthState.QUARANTINED, reason, self.actor, now)
            return open_repair_for(
                self.fleet,
                resource_kind="node",
                resource_id=node,
                host=node,
                what_failed=f"node lost: {d.reason}",
                attribution={"kind": "node", "findings": [f.to_dict() for f in d.findings]},
                evidence=d.evidence,
                at=now,
                actor=self.actor,
                webhook=self.webhook,
            )

    def _power_cycle(
        self, d: NodeDecision, facts: NodeFacts, repair: RepairRecord, fence: Fence, now: float
    ) -> dict[str, Any]:
        """The ledger row and intent (fenced), then the cycle on the node's BMC lane."""
        node = d.node
        key = self.key(node, repair.id, f"power_cycle:{facts.power_cycles + 1}")
        approval = self.fleet.approvals.approval_for(key)
        why = (
            f"approved by {approval.decided_by}"
            if approval is not None and approval.state is ApprovalState.APPROVED
            else "allowed by policy for a drained node"
        )
        self.fleet.power.begin_power_action(
            key,
            node=node,
            action="power_cycle",
            message=f"power cycle {node} ({why}): {d.reason}",
            data={"why": why, "repair": repair.id},
            fence=fence,
            at=now,
        )
        submitted = self._submit(node, key, repair.id, facts.power_cycles + 1, why, fence)
        return {"key": key, "submitted": submitted}

    def _finish_cycle(
        self, node: str, facts: NodeFacts, repair: RepairRecord, fence: Fence
    ) -> dict[str, Any]:
        """Carry on a cycle the ledger holds unfinished (unless this server's lane is on it)."""
        key = self.key(node, repair.id, f"power_cycle:{facts.power_cycles + 1}")
        got = self.fleet.power.get_power_action(key)
        requests = [f"{r.request}:{r.state}" for r in got.requests] if got else []
        if node not in self.worker.nodes:
            return {"key": key, "requests": requests, "error": "no BMC is configured any more"}
        out: dict[str, Any] = {"key": key, "requests": requests}
        if key in self._unfinished:
            out["last_error"] = self._unfinished[key]
        if self.worker.busy(node, key):
            return {**out, "in_progress": True}
        submitted = self._submit(
            node, key, repair.id, facts.power_cycles + 1, "resumed from the ledger", fence
        )
        return {**out, "resumed": submitted}

    def _submit(self, node: str, key: str, repair_id: int, n: int, why: str, fence: Fence) -> bool:
        bmc = self.worker.bmc(node)

        def job() -> None:
            self._run_cycle(bmc, node, key, repair_id, n, why, fence)

        return self.worker.submit(node, key, job)

    def _run_cycle(
        self, bmc: Bmc, node: str, key: str, repair_id: int, n: int, why: str, fence: Fence
    ) -> None:
        """On the node's BMC lane: the cycle to its end, its result in the ledger (fenced)
        and on the repair record. A deposed leader stops at its next write (the new one
        resumes); a BMC error after a request went out leaves the action unfinished, to be
        resumed by a later pass, never counted done half-way."""
        journal = StoreJournal(self.fleet, key, fence, self.clock)
        try:
            result = bmc.act("power_cycle", key=key, journal=journal)
        except Fenced as exc:
            log.warning("power cycle %s stopped: %s", key, exc)
            return
        except SchedulerError as exc:
            if journal.requests():
                log.warning("power cycle %s left unfinished, resumed later: %s", key, exc)
                self._unfinished[key] = str(exc)
                return
            result = None
            error = str(exc)
        at = self.clock()
        if result is None:
            data: dict[str, Any] = {"verified": False, "error": error, "sent": []}
            message = f"power cycle {node}: nothing sent ({error})"
            line = f"power cycle {n} ({why}): nothing sent: {error}"
        else:
            data = result.to_dict()
            message = (
                f"power cycle {node}: "
                + ("verified on" if result.verified else "NOT verified")
                + f" (power {result.power_after.value}; sent "
                + (", ".join(result.detail.get("sent") or []) or "nothing")
                + ")"
            )
            line = f"power cycle {n} ({why}): " + (
                "verified, power on"
                if result.verified
                else f"not verified, power {result.power_after.value}"
            )
        self._unfinished.pop(key, None)
        try:
            self.fleet.power.finish_power_action(key, data, message=message, fence=fence, at=at)
        except Fenced as exc:
            log.warning("power cycle %s: result not recorded, deposed: %s", key, exc)
            return
        self.fleet.repairs.update_repair(repair_id, at=at, actor=self.actor, evidence=[line])

    def _validate(
        self, d: NodeDecision, facts: NodeFacts, repair: RepairRecord, fence: Fence, now: float
    ) -> dict[str, Any]:
        node = d.node
        with self.fleet.lease.fenced(fence, now):
            if facts.health is HealthState.QUARANTINED:
                self.fleet.nodes.transition_node(
                    node, HealthState.VALIDATING, MARK + d.reason, self.actor, now
                )
            if repair.state is RepairState.OPEN:
                self.fleet.repairs.update_repair(
                    repair.id, at=now, actor=self.actor, state=RepairState.VALIDATING
                )
        v = self.validate(node)
        self.fleet.repairs.update_repair(
            repair.id,
            at=now,
            actor=self.actor,
            validation={
                "by": "node-recovery",
                "after_cycle": facts.power_cycles,
                "passed": v.passed,
                "detail": v.detail,
                "at": now,
            },
        )
        # Decide again on the result in the same pass: back to service or to repair.
        again = decide_node(
            NodeFacts(
                **{**facts.__dict__, "health": HealthState.VALIDATING, "validation": v.passed}
            ),
            self.policy,
        )
        fresh = self.fleet.repairs.get_repair(repair.id)
        if again.step is NodeStep.RETURN:
            self._return(node, fresh, fence, now)
        elif again.step is NodeStep.REPAIR:
            self._to_repair(again, facts, fresh, now)
        return {"validation": {"passed": v.passed, "detail": v.detail}, "then": again.step.value}

    def _return(self, node: str, repair: RepairRecord, fence: Fence, now: float) -> None:
        self.scheduler.resume_node(
            node,
            "validated after a power cycle",
            key=self.key(node, repair.id, "resume"),
            token=fence.token,
        )
        with self.fleet.lease.fenced(fence, now):
            self.fleet.nodes.transition_node(
                node, HealthState.HEALTHY, "validated after a power cycle", self.actor, now
            )
            self.fleet.repairs.update_repair(
                repair.id, at=now, actor=self.actor, state=RepairState.CLOSED, outcome="validated"
            )

    def _to_repair(
        self, d: NodeDecision, facts: NodeFacts, repair: RepairRecord | None, now: float
    ) -> None:
        node = d.node
        current = self.fleet.nodes.get_node(node).state
        if current in (HealthState.QUARANTINED, HealthState.VALIDATING):
            self.fleet.nodes.transition_node(
                node, HealthState.REPAIR, MARK + d.reason, self.actor, now
            )
        if repair is not None:
            self.fleet.repairs.update_repair(
                repair.id,
                at=now,
                actor=self.actor,
                state=RepairState.OPEN if repair.state is RepairState.VALIDATING else None,
                evidence=[d.reason],
                note="automatic recovery gave up: a person repairs it",
            )


def scheduler_validation(scheduler: ClusterScheduler) -> Callable[[str], Validation]:
    """The validation ``trainguard serve`` uses after a power cycle when nothing richer is
    configured: a fresh observation shows the node answering again (not DOWN). The
    device-level checks of ``trainguard validate`` (preflight) remain the operator's
    to run through the repair record; this only decides the node may take work."""

    def validate(node: str) -> Validation:
        seen = scheduler.observe().nodes.get(node)
        if seen is None:
            return Validation(False, f"the scheduler no longer lists {node}")
        if seen.phase is NodePhase.DOWN:
            return Validation(False, f"{node} still does not answer the scheduler")
        return Validation(True, f"{node} answers the scheduler again ({seen.phase.value})")

    return validate


__all__ = ["MARK", "Bmc", "NodeOutcome", "NodeRecovery", "Validation", "scheduler_validation"]
