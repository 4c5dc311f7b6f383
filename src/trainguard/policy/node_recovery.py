"""What to do about a node that stops answering, from its BMC's evidence (decision 0241).

Pure: :func:`decide_node` takes :class:`NodeFacts` (in-band answering, the
node's health state, its BMC reading, the power cycle's approval, the cycles
already made, the validation result, times passed in) and returns a
:class:`NodeDecision`. No I/O, no clock. The controller step
(:mod:`trainguard.controller.node_recovery`) gathers the facts and carries the
decision out; it re-decides every pass from what it observes (level-based).

The sequence (design §recovery, steps 3 and 10):

1. a node that answers and is schedulable: nothing.
2. a schedulable node that stops answering: ask its BMC, then **isolate** it
   (drain + quarantine, before anything else), with the route the evidence picks:
   * powered off, or a hardware alarm (fatal SEL entry, sensor over critical,
     critical health roll-up) → ``repair``: a repair record with the BMC's evidence;
   * BMC unreachable / refusing / not configured → ``repair`` too, saying so:
     nobody can tell a dead PSU from a hung kernel from here;
   * powered on, no alarm → ``power_cycle`` (the host is hung).
3. an isolated node on the power-cycle route: the cycle is destructive, so it
   waits for a person's approval (:mod:`trainguard.policy.approvals`) unless the
   policy allows it for **drained** nodes (isolated, with no running job on it).
   A denied approval leaves the node isolated for repair.
4. after a cycle: wait up to ``boot_grace`` for it to answer; then it is
   **validated**, and returns to service only when validation passes. One that
   does not come back, fails validation, or needs more than ``max_power_cycles``
   goes to repair.

A cycle is recorded request by request in the shared power-action ledger; one the
ledger holds unfinished (a crash or a failover between ``ForceOff`` and ``On``) is
carried on (``finish_cycle``) before anything else, never started again. BMC readings
are taken off the pass: until a configured BMC's first reading arrives the step waits
(``wait_bmc``). A host lost together with its BMC names the rack's power or the
management network as the likelier cause (:func:`~trainguard.diagnose.bmc_events.lost_with_bmc`).

Safety rules (property-tested): a power action only on a node that does not
answer, whose BMC is reachable and reports it on without a hardware alarm, and
only with an approval or the drained-node allowance; a node returns to service
only after a passing validation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from trainguard.diagnose.bmc_events import hardware_alarm, lost_with_bmc
from trainguard.model.bmc import BmcReading, PowerState
from trainguard.model.findings import Finding
from trainguard.model.health import HealthState
from trainguard.policy.approvals import approval_reason


class NodeStep(StrEnum):
    NOTHING = "nothing"  # answering and in service, or waiting for a person's repair
    ISOLATE = "isolate"  # drain + quarantine + repair record (route says what next)
    REQUEST_APPROVAL = "request_approval"  # ask a person for the power cycle
    WAIT_APPROVAL = "wait_approval"
    WAIT_BMC = "wait_bmc"  # the BMC's reading is being taken (off the pass)
    POWER_CYCLE = "power_cycle"
    FINISH_CYCLE = "finish_cycle"  # a cycle the ledger holds unfinished: carry it on
    WAIT_BOOT = "wait_boot"  # cycled, not answering yet, within boot_grace
    VALIDATE = "validate"  # cycled and answering: run validation
    RETURN = "return"  # validation passed: back to service
    REPAIR = "repair"  # give up on automatic recovery: a person repairs it


class Route(StrEnum):
    REPAIR = "repair"
    POWER_CYCLE = "power_cycle"


class Approval(StrEnum):
    NONE = "none"  # not requested
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"


@dataclass(frozen=True)
class NodeRecoveryPolicy:
    """``cycle_drained_without_approval``: a drained node (no running job) may be power
    cycled without a person (the default asks a person every time)."""

    cycle_drained_without_approval: bool = False
    max_power_cycles: int = 1
    boot_grace: float = 600.0  # seconds a cycled node has to answer again


@dataclass(frozen=True)
class NodeFacts:
    node: str
    answering: bool  # in-band: the node's agent / scheduler daemon / probe answers
    health: HealthState  # the node's health state in the store
    reading: BmcReading | None  # None: no BMC configured for this node
    drained: bool = False  # isolated and no running job on it
    approval: Approval = Approval.NONE  # of the next power cycle
    power_cycles: int = 0  # cycles finished in this repair episode (the shared ledger)
    last_cycle_at: float | None = None
    cycle_in_progress: bool = False  # the next cycle is in the ledger, not finished
    bmc_pending: bool = False  # a BMC is configured but its reading has not come yet
    peers_lost_with_bmc: tuple[str, ...] = ()  # other nodes silent together with their BMC
    validation: bool | None = None  # the validation after the cycle: None = not run yet
    ours: bool = True  # the isolation is this recovery's (not an operator's or an incident's)
    now: float = 0.0


@dataclass(frozen=True)
class NodeDecision:
    node: str
    step: NodeStep
    reason: str
    route: Route | None = None
    evidence: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = field(default=())
    needs_approval: str | None = None  # why the power cycle waits for a person

    @property
    def power_action(self) -> bool:
        return self.step is NodeStep.POWER_CYCLE


def bmc_evidence(
    reading: BmcReading | None, peers: tuple[str, ...] = ()
) -> tuple[tuple[str, ...], tuple[Finding, ...]]:
    """The evidence lines and alarm findings of a reading (for the repair record)."""
    if reading is None:
        return ("no BMC is configured for this node",), ()
    if not reading.reachable:
        return lost_with_bmc(reading.error, peers)[1], ()
    alarms = tuple(hardware_alarm(reading))
    lines = [
        f"BMC: power {reading.power.value}, health {reading.health.value}, "
        f"roll-up {reading.health_rollup.value}"
    ]
    for f in alarms:
        lines += list(f.evidence)
    return tuple(lines), alarms


def route_for(reading: BmcReading | None, peers: tuple[str, ...] = ()) -> tuple[Route, str]:
    """Where the BMC's evidence sends a node that stopped answering, and why (``peers``:
    other nodes lost together with their BMCs, see :func:`lost_with_bmc`)."""
    if reading is None:
        return Route.REPAIR, "not answering and no BMC is configured: isolated, cause unknown"
    if not reading.reachable:
        cause, _ = lost_with_bmc(reading.error, peers)
        return Route.REPAIR, (
            "not answering and its BMC cannot be read either "
            f"({reading.error or 'no answer'}): isolated; {cause}"
        )
    alarms = hardware_alarm(reading)
    if reading.power is PowerState.OFF:
        return Route.REPAIR, "not answering: the BMC reports it powered off" + (
            f" ({alarms[0].message})" if alarms else ""
        )
    if alarms:
        return Route.REPAIR, f"not answering: the BMC reports a hardware alarm: {alarms[0].message}"
    if reading.power is not PowerState.ON:
        return Route.REPAIR, f"not answering: the BMC reports power {reading.power.value}"
    return Route.POWER_CYCLE, "not answering while the BMC reports it on with no alarm: hung"


def _cycle_allowed(facts: NodeFacts, policy: NodeRecoveryPolicy) -> str | None:
    """``None`` when the cycle may go ahead; else why it needs a person."""
    if policy.cycle_drained_without_approval and facts.drained:
        return None
    why = approval_reason("power_cycle", domain="node")
    assert why is not None  # power_cycle is destructive: always a reason
    return why


def decide_node(facts: NodeFacts, policy: NodeRecoveryPolicy) -> NodeDecision:
    """The next step for one node (see the module docstring)."""
    node = facts.node
    peers = facts.peers_lost_with_bmc
    evidence, alarms = bmc_evidence(facts.reading, peers)

    def out(step: NodeStep, reason: str, route: Route | None = None, **kw: object) -> NodeDecision:
        return NodeDecision(
            node=node,
            step=step,
            reason=reason,
            route=route,
            evidence=evidence,
            findings=alarms,
            **kw,  # type: ignore[arg-type]
        )

    if facts.health.schedulable:
        if facts.answering:
            return out(NodeStep.NOTHING, "answering and in service")
        if facts.bmc_pending:
            return out(NodeStep.WAIT_BMC, "not answering: reading its BMC before isolating it")
        route, why = route_for(facts.reading, peers)
        return out(NodeStep.ISOLATE, why, route)

    if facts.health is HealthState.VALIDATING and facts.ours:
        if facts.validation is True and facts.answering:
            return out(NodeStep.RETURN, "validated after the power cycle: back to service")
        if facts.validation is False:
            return out(NodeStep.REPAIR, "validation failed after the power cycle")
        if not facts.answering:
            return out(NodeStep.REPAIR, "stopped answering again while being validated")
        return out(NodeStep.VALIDATE, "answering after the power cycle: validating")

    if facts.health is not HealthState.QUARANTINED or not facts.ours:
        return out(NodeStep.NOTHING, f"{facts.health.value}: waiting for a person's repair")

    # Isolated by this recovery. A cycle the ledger holds unfinished is carried on first:
    # its approval was given and a request may be out (ForceOff without its On).
    if facts.cycle_in_progress:
        return out(NodeStep.FINISH_CYCLE, "a power cycle is under way: carrying it to its end")
    if facts.power_cycles > 0:
        if facts.answering:
            return out(NodeStep.VALIDATE, "answering after the power cycle: validating")
        since = facts.now - (facts.last_cycle_at if facts.last_cycle_at is not None else facts.now)
        if since < policy.boot_grace:
            return out(NodeStep.WAIT_BOOT, f"power cycled {since:.0f}s ago: waiting for it to boot")
        if facts.power_cycles >= policy.max_power_cycles:
            return out(
                NodeStep.REPAIR,
                f"did not answer within {policy.boot_grace:.0f}s of "
                f"{facts.power_cycles} power cycle(s)",
            )
    if facts.answering:
        return out(NodeStep.NOTHING, "answering again while isolated: a person validates it")
    if facts.bmc_pending:
        return out(NodeStep.WAIT_BMC, "reading its BMC")
    route, why = route_for(facts.reading, peers)
    if route is Route.REPAIR:
        return out(NodeStep.NOTHING, why + "; waiting for repair", route)
    if facts.approval is Approval.DENIED:
        return out(NodeStep.NOTHING, "the power cycle was denied: waiting for repair", route)
    needs = _cycle_allowed(facts, policy)
    if needs is None or facts.approval is Approval.APPROVED:
        return out(NodeStep.POWER_CYCLE, why + ": power cycle", route, needs_approval=needs)
    if facts.approval is Approval.PENDING:
        return out(
            NodeStep.WAIT_APPROVAL,
            "waiting for approval of the power cycle",
            route,
            needs_approval=needs,
        )
    return out(NodeStep.REQUEST_APPROVAL, why, route, needs_approval=needs)


__all__ = [
    "Approval",
    "NodeDecision",
    "NodeFacts",
    "NodeRecoveryPolicy",
    "NodeStep",
    "Route",
    "bmc_evidence",
    "decide_node",
    "route_for",
]
