"""``decide(snapshot) -> Plan``: the recovery policy as one pure function.

The rules, in the order they are applied (docs/run.md, decision 0050):

1. **Isolate.** Every device named by hardware evidence (the attribution's
   culprit when its domain is ``hardware``, and every hardware finding that
   names a device) is quarantined *before* anything restarts; a ``node``
   attribution naming a host quarantines the host, and so does network
   evidence that names a link or NIC (``network_error`` findings: IB/NIC link
   down ...) on a host or on one of its devices. A symptom-only network failure
   (collective timeout/error) isolates its named culprit only when the same
   culprit failed that way before (``isolate_network_after``, decision 0110).
   Nothing already out of service, and nothing in ``snapshot.isolated`` (done
   for this incident already), is quarantined again (decision 0111).
   A replica checksum mismatch names its device as suspect; the same device named
   again by one (``REPLICA_QUARANTINE_AFTER``) is quarantined (decision 0522).
   Application errors, training-health events, out-of-memory and hangs never
   quarantine.
2. **Out of memory.** Retry once with
   ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (the fragmentation
   case) when the attempt did not already run with it; otherwise stop with
   advice. (Checked before the futile rule, which would stop at once.)
3. **Futile retry.** The same application-error signature ``futile_after``
   times in a row (this failure included) stops the job: retrying would fail
   the same way and only burn the budget. A training-health event's signature
   carries its step: the same NaN or spike at the same step again, replayed from
   a checkpoint before it, is the job's or its data's, never a GPU's (0520).
4. **Budget.** At most ``max_restarts`` restarts; exponential backoff between
   them (the first restart is immediate: the cause has just been isolated).
5. **Capacity.** The next attempt gets ``need`` schedulable devices, keeping the
   failed attempt's healthy devices first (locality, warm caches) and then the
   lowest indices; with fewer, it continues only down to ``min_need``, else it
   waits for capacity (some device may come back from repair) or stops (none
   can, or the policy does not wait: ``wait_for_capacity``, 0381). With
   ``placement="node"`` only whole usable hosts count, so the host
   of a bad device is replaced by a whole spare host (decision 0112).
6. **Checkpoint.** Restart from the newest *valid* checkpoint in the catalog's
   list; every invalid one newer than it is listed in ``skipped_checkpoints``
   with the catalog's reason. After a training-health event (NaN/Inf loss or
   gradient norm, loss spike, replica mismatch) the newest valid one saved
   *before* the event's step; those saved at or after it are listed as suspect
   (``policy.checkpoint_choice.select_checkpoint``, 0521). No valid checkpoint:
   start fresh, and say so.
7. **Observe mode** produces exactly the same Plan, marked ``observe``; the
   controller records it and acts on nothing.

Cost is O(devices + checkpoints + history): the fleet simulator calls this
with tens of thousands of devices per call.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trainguard.diagnose.training_health import REPLICA_MISMATCH, event_step
from trainguard.model.checkpoint import CheckpointInfo
from trainguard.model.devices import Device, normalize_pci_bus_id
from trainguard.model.findings import Attribution, Culprit, Domain, IncidentKind
from trainguard.model.health import HealthState
from trainguard.model.plan import (
    Action,
    DeviceStatus,
    Plan,
    Quarantine,
    RecoverySnapshot,
    Restart,
    Stop,
    WaitForCapacity,
)
from trainguard.policy.checkpoint_choice import planned_restore, select_checkpoint

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE = "expandable_segments:True"
OOM_ADVICE = (
    "reduce the per-device micro-batch size (keep the global batch with gradient "
    "accumulation), enable activation checkpointing, or shard the optimizer state "
    "(ZeRO / FSDP)"
)
# The finding kind of network evidence that names a link or NIC (docs/signatures.md):
# strong enough to isolate the host on a first occurrence (decision 0110).
NETWORK_EVIDENCE_KIND = "network_error"
# Replica mismatches naming one device before it is quarantined (decision 0522).
REPLICA_QUARANTINE_AFTER = 2
# Domains whose failures are the job's own doing: retrying the same failure is futile.
_FUTILE_DOMAINS = frozenset({Domain.APPLICATION, Domain.USER_CONFIG})
# HealthState.schedulable as a set: membership is several times cheaper than the
# property in the per-device loops (16,384 devices per call in the simulator).
_SCHEDULABLE = frozenset(s for s in HealthState if s.schedulable)
# States a device may come back from without an operator retiring it.
_RECOVERABLE_STATES = frozenset(
    {HealthState.QUARANTINED, HealthState.REPAIR, HealthState.VALIDATING}
)


def backoff_seconds(restarts_used: int, base: float, cap: float) -> float:
    """Delay before restart number ``restarts_used + 1``: 0, base, 2·base, 4·base ... ≤ cap."""
    if restarts_used <= 0:
        return 0.0
    # min() before the power keeps a huge restart count from overflowing the float.
    return min(cap, base * 2.0 ** min(restarts_used - 1, 60))


def has_expandable_segments(value: str | None) -> bool:
    """Whether an allocator config string already enables expandable segments."""
    if not value:
        return False
    for part in value.split(","):
        key, _, val = part.partition(":")
        if key.strip() == "expandable_segments" and val.strip().lower() in ("true", "1"):
            return True
    return False


def _with_expandable(value: str | None) -> str:
    if not value:
        return EXPANDABLE
    kept = [p for p in value.split(",") if p.partition(":")[0].strip() != "expandable_segments"]
    return ",".join([*kept, EXPANDABLE])


@dataclass(frozen=True)
class _Target:
    """A resource the evidence says to isolate."""

    kind: str  # "device" or "node"
    rid: str  # device uuid or host name
    reason: str  # the Quarantine's reason (the evidence)
    why: str  # the plan's reason line


def _resolve(
    uuid: str | None,
    pci: str | None,
    by_uuid: dict[str, DeviceStatus],
    by_pci: dict[str, DeviceStatus],
) -> str | None:
    """The inventory uuid a culprit's device uuid or PCI bus id (any notation) names."""
    if uuid and uuid in by_uuid:
        return uuid
    if pci:
        try:
            status = by_pci.get(normalize_pci_bus_id(pci))
        except ValueError:
            status = None
        if status is not None:
            return status.device.uuid
    return None


def _culprit_resource(
    culprit: Culprit, by_uuid: dict[str, DeviceStatus], by_pci: dict[str, DeviceStatus]
) -> tuple[str | None, str | None]:
    """``(device uuid, host)`` a culprit names, resolved against the inventory."""
    uuid = _resolve(culprit.device_uuid, culprit.pci_bus_id, by_uuid, by_pci)
    host = culprit.host or (by_uuid[uuid].device.host if uuid is not None else None)
    return uuid, host


def _same_culprit(a: tuple[str | None, str | None], b: tuple[str | None, str | None]) -> bool:
    """Devices when both name one, else hosts: a link names a host, a rank its device."""
    if a[0] is not None and b[0] is not None:
        return a[0] == b[0]
    return a[1] is not None and a[1] == b[1]


def _evidence_targets(
    attribution: Attribution,
    by_uuid: dict[str, DeviceStatus],
    by_pci: dict[str, DeviceStatus],
) -> tuple[dict[tuple[str, str], _Target], bool]:
    """What the evidence itself names (rule 1 without the network-repeat rule), in
    evidence order, and whether network evidence named a link or NIC."""
    found: dict[tuple[str, str], _Target] = {}
    strong_network = False
    candidates: list[tuple[Domain, Culprit, str, str | None]] = [
        (attribution.domain, attribution.culprit, attribution.summary, None)
    ]
    candidates += [(f.domain, f.culprit, f.message, f.kind) for f in attribution.findings]
    for domain, culprit, why, kind in candidates:
        if domain is Domain.HARDWARE:
            uuid = _resolve(culprit.device_uuid, culprit.pci_bus_id, by_uuid, by_pci)
            if uuid is not None:
                found.setdefault(
                    ("device", uuid),
                    _Target("device", uuid, why, f"hardware evidence on device {uuid}"),
                )
        elif domain is Domain.NODE and culprit.host:
            found.setdefault(
                ("node", culprit.host),
                _Target("node", culprit.host, why, f"node evidence on host {culprit.host}"),
            )
        elif kind == NETWORK_EVIDENCE_KIND:
            strong_network = True
            _uuid, host = _culprit_resource(culprit, by_uuid, by_pci)
            if host is not None:
                found.setdefault(
                    ("node", host),
                    _Target("node", host, why, f"network evidence (link/NIC) on host {host}"),
                )
    return found, strong_network


def evidence_resources(
    attribution: Attribution, devices: Iterable[Device]
) -> tuple[frozenset[str], frozenset[str]]:
    """``(device uuids, hosts)`` that ``decide()``'s evidence rule isolates for this
    attribution, resolved against ``devices`` (the failed attempt's).

    The one definition of those targets (0130): whoever builds a snapshot uses it to
    know which cards decide() must be shown even when another job holds them by now
    (the reconciler, 0120), instead of guessing decide()'s rule a second time.
    """
    by_uuid: dict[str, DeviceStatus] = {}
    by_pci: dict[str, DeviceStatus] = {}
    for dev in devices:
        status = DeviceStatus(dev, HealthState.HEALTHY)  # health plays no part here
        by_uuid[dev.uuid] = status
        by_pci[dev.pci_bus_id] = status
    found, _strong = _evidence_targets(attribution, by_uuid, by_pci)
    uuids = frozenset(t.rid for t in found.values() if t.kind == "device")
    hosts = frozenset(t.rid for t in found.values() if t.kind == "node")
    return uuids, hosts


def _isolation_targets(
    snapshot: RecoverySnapshot,
    by_uuid: dict[str, DeviceStatus],
    by_pci: dict[str, DeviceStatus],
    notes: list[str],
) -> list[_Target]:
    """What the evidence says to isolate, deduplicated, in evidence order (rule 1).

    * hardware evidence naming a device -> that device;
    * node evidence naming a host -> that host;
    * network evidence that names a link or NIC (``network_error``: IB/NIC link
      down, transport retries exceeded ...) on a host, or on a device whose host
      is then meant -> that host (the NIC serves the node);
    * a symptom-only network failure (collective timeout/error) naming a culprit
      -> nothing the first time; the same culprit again in the history
      (``isolate_network_after`` failures) -> that device, or that host when the
      evidence names no device (decision 0110).
    """
    attribution = snapshot.attribution
    policy = snapshot.policy
    found, strong_network = _evidence_targets(attribution, by_uuid, by_pci)

    def add(kind: str, rid: str, reason: str, why: str) -> None:
        found.setdefault((kind, rid), _Target(kind, rid, reason, why))

    replica = _replica_target(snapshot, by_uuid, by_pci, notes)
    if replica is not None:
        found.setdefault((replica.kind, replica.rid), replica)
    if strong_network or attribution.domain is not Domain.NETWORK:
        return list(found.values())

    # Symptom only: a collective timed out or failed, and the evidence points at a culprit.
    current = _culprit_resource(attribution.culprit, by_uuid, by_pci)
    if current == (None, None):
        notes.append("network symptom without a named culprit: nothing to isolate")
        return list(found.values())
    label = f"device {current[0]}" if current[0] is not None else f"host {current[1]}"
    repeats = 1
    for prior in snapshot.history:
        if prior.attempt == snapshot.attempt or prior.domain != Domain.NETWORK.value:
            continue  # the current failure may already be in the history
        if _same_culprit(current, _culprit_resource(prior.culprit, by_uuid, by_pci)):
            repeats += 1
    threshold = max(policy.isolate_network_after, 1)
    if repeats < threshold:
        notes.append(
            f"network symptom ({attribution.kind.value}) names {label}: not isolated on "
            f"occurrence {repeats} of {threshold} (the same culprit again isolates it)"
        )
        return list(found.values())
    why = f"{attribution.summary} (the same culprit in {repeats} network failures)"
    if current[0] is not None:
        add("device", current[0], why, f"network failures keep naming device {current[0]}")
    else:
        assert current[1] is not None
        add("node", current[1], why, f"network failures keep naming host {current[1]}")
    return list(found.values())


def _replica_target(
    snapshot: RecoverySnapshot,
    by_uuid: dict[str, DeviceStatus],
    by_pci: dict[str, DeviceStatus],
    notes: list[str],
) -> _Target | None:
    """A replica whose parameters disagreed with its peers' (a bit flip, silent data
    corruption) names its device as *suspect* only: one occurrence may be a transient
    upset. The same device named by a replica mismatch again in the job's history
    (``REPLICA_QUARANTINE_AFTER`` occurrences) is quarantined (decision 0522)."""
    attribution = snapshot.attribution
    if not (attribution.signature or "").startswith(REPLICA_MISMATCH + ":"):
        return None
    current = _culprit_resource(attribution.culprit, by_uuid, by_pci)
    if current[0] is None:
        notes.append("replica checksum mismatch without a device for its rank: nothing to isolate")
        return None
    repeats = 1
    for prior in snapshot.history:
        if prior.attempt == snapshot.attempt or not (prior.signature or "").startswith(
            REPLICA_MISMATCH + ":"
        ):
            continue
        if prior.signature == attribution.signature:
            # The same first suspect step again, replayed from before it: deterministic,
            # the job's (a code path that differs per rank), not a flipped bit.
            notes.append("replica checksum mismatch at the same step again: not a GPU")
            return None
        if _same_culprit(current, _culprit_resource(prior.culprit, by_uuid, by_pci)):
            repeats += 1
    if repeats < REPLICA_QUARANTINE_AFTER:
        notes.append(
            f"replica checksum mismatch names device {current[0]}: suspect, not quarantined on "
            f"occurrence {repeats} of {REPLICA_QUARANTINE_AFTER} (the same device again "
            "quarantines it)"
        )
        return None
    return _Target(
        "device",
        current[0],
        f"{attribution.summary} (the same device in {repeats} replica mismatches)",
        f"replica checksum mismatches keep naming device {current[0]}",
    )


def _restore_said(checkpoint: CheckpointInfo) -> str:
    """What the restore counts, as every record says it (policy.checkpoint_choice)."""
    point = planned_restore(checkpoint)
    if point.step is not None:
        return f"step {point.step}"
    return f"epoch {point.epoch}" if point.epoch is not None else "step not known"


def _consecutive_same_signature(snapshot: RecoverySnapshot, signature: str) -> int:
    """How many failures in a row, this one included, had ``signature``."""
    count = 1
    for prior in reversed(snapshot.history):
        if prior.attempt == snapshot.attempt:
            continue  # the current failure may already be in the history
        if prior.signature != signature:
            break
        count += 1
    return count


class _Host:
    """One host's devices as node placement sees them (one pass over the inventory)."""

    __slots__ = ("count", "kept", "min_index", "others", "returnable", "suspect", "usable")

    def __init__(self) -> None:
        self.count = 0
        self.others: list[DeviceStatus] = []  # members the failed attempt did not have
        self.usable = True  # every device schedulable and none excluded
        self.returnable = True  # no device retired: the whole host may come back
        self.suspect = False
        self.kept: list[DeviceStatus] | None = None  # the attempt's members, in its order
        self.min_index = 1 << 62


def _index_of(status: DeviceStatus) -> int:
    return status.device.index


def _device_candidates(
    snapshot: RecoverySnapshot, excluded: set[str], excluded_hosts: set[str]
) -> tuple[list[DeviceStatus], int]:
    """Placement ``device``: the failed attempt's survivors, then healthy, then suspect spares."""
    assigned = set(snapshot.assigned)
    keep: list[DeviceStatus] = []
    spare_healthy: list[DeviceStatus] = []
    spare_suspect: list[DeviceStatus] = []
    could_return = 0
    for status in snapshot.devices:
        dev = status.device
        if dev.uuid in excluded or dev.host in excluded_hosts:
            if status.state is not HealthState.RETIRED:
                could_return += 1
            continue
        if status.state not in _SCHEDULABLE:
            if status.state in _RECOVERABLE_STATES:
                could_return += 1
            continue
        if dev.uuid in assigned:
            keep.append(status)
        elif status.state is HealthState.HEALTHY:
            spare_healthy.append(status)
        else:
            spare_suspect.append(status)
    # Keep the failed attempt's order (rank -> device stays stable); spares by index.
    order = {uuid: i for i, uuid in enumerate(snapshot.assigned)}
    keep.sort(key=lambda s: order[s.device.uuid])
    spare_healthy.sort(key=lambda s: s.device.index)
    spare_suspect.sort(key=lambda s: s.device.index)
    return keep + spare_healthy + spare_suspect, could_return


def _node_candidates(
    snapshot: RecoverySnapshot, excluded: set[str], excluded_hosts: set[str], need: int
) -> tuple[list[DeviceStatus], int]:
    """Placement ``node``: devices of whole usable hosts only (decision 0112).

    A host is usable when every one of its devices in the inventory is
    schedulable and none is excluded by this plan; the host that had the bad
    device is therefore replaced as a whole. Hosts of the failed attempt come
    first (in its order), then spare hosts with only healthy devices, then spare
    hosts with suspect ones, each by lowest device index. Within a host the
    failed attempt's devices keep their order, the rest follow by index.
    """
    assigned = set(snapshot.assigned)
    hosts: dict[str, _Host] = {}
    by_uuid: dict[str, DeviceStatus] = {}
    for status in snapshot.devices:
        dev = status.device
        host = dev.host
        h = hosts.get(host)
        if h is None:
            h = hosts[host] = _Host()
        h.count += 1
        state = status.state
        if state not in _SCHEDULABLE or dev.uuid in excluded or host in excluded_hosts:
            h.usable = False
            if state is HealthState.RETIRED:
                h.returnable = False
        elif state is HealthState.SUSPECT:
            h.suspect = True
        if dev.uuid in assigned:
            by_uuid[dev.uuid] = status
        else:
            h.others.append(status)
        if dev.index < h.min_index:
            h.min_index = dev.index
    # The failed attempt's hosts in the order its devices had (no sort needed).
    kept: list[_Host] = []
    for uuid in snapshot.assigned:
        member = by_uuid.get(uuid)
        if member is None:
            continue
        h = hosts[member.device.host]
        if h.kept is None:
            h.kept = []
            kept.append(h)
        h.kept.append(member)
    spare = sorted((h for h in hosts.values() if h.usable and h.kept is None),
                   key=lambda h: (h.suspect, h.min_index))  # fmt: skip
    candidates: list[DeviceStatus] = []
    for h in (*(h for h in kept if h.usable), *spare):
        if len(candidates) >= need:
            break  # enough whole hosts: the rest need no sorting
        if h.kept is not None:
            candidates.extend(h.kept)
        if h.others:
            candidates.extend(sorted(h.others, key=_index_of))
    could_return = sum(h.count for h in hosts.values() if not h.usable and h.returnable)
    return candidates, could_return


def decide(snapshot: RecoverySnapshot) -> Plan:
    """Return the Plan for one failed attempt. Pure: no I/O, no clock but ``snapshot.now``."""
    policy = snapshot.policy
    attribution = snapshot.attribution
    actions: list[Action] = []
    reasons: list[str] = []

    by_uuid: dict[str, DeviceStatus] = {}
    by_pci: dict[str, DeviceStatus] = {}
    for status in snapshot.devices:
        by_uuid[status.device.uuid] = status
        by_pci[status.device.pci_bus_id] = status

    # 1. Isolate before anything else: hardware, node and network evidence.
    targets = _isolation_targets(snapshot, by_uuid, by_pci, reasons)
    excluded: set[str] = set()
    excluded_hosts: set[str] = set()
    isolated = set(snapshot.isolated)
    host_out: dict[str, bool] | None = None
    for t in targets:
        if t.rid in isolated:
            # Asked again for the same incident (after a wait, or after a crash of the
            # controller): isolated once is enough; its health state now decides.
            reasons.append(
                f"{t.why}: {t.kind} {t.rid} was already isolated for this incident, "
                "not again (its health state decides whether it is used)"
            )
            continue
        if t.kind == "device":
            excluded.add(t.rid)
            state = by_uuid[t.rid].state
            if state not in _SCHEDULABLE:
                reasons.append(f"{t.why}: device {t.rid} is already {state.value}; it stays out")
                continue
        else:
            excluded_hosts.add(t.rid)
            if host_out is None:
                host_out = _hosts_out(snapshot.devices)
            if host_out.get(t.rid, False):
                reasons.append(f"{t.why}: every device of host {t.rid} is already out of service")
                continue
        if policy.allow_quarantine:
            actions.append(Quarantine(t.kind, t.rid, t.reason))
            reasons.append(f"{t.why}: quarantine before restarting")
        else:
            reasons.append(
                f"{t.why}, but quarantine is disabled by policy; the next attempt avoids it"
            )

    def finish(final: Action, *why: str, skipped: tuple[CheckpointInfo, ...] = ()) -> Plan:
        return Plan(
            actions=(*actions, final),
            reasons=(*reasons, *why),
            mode=snapshot.mode,
            skipped_checkpoints=skipped,
        )

    env = dict(snapshot.env)
    # 2. Out of memory: one retry with expandable segments, then advice. Checked before
    # the futile rule, which would otherwise stop the second OOM without the advice.
    if attribution.kind is IncidentKind.OOM:
        if has_expandable_segments(env.get(ALLOC_CONF)):
            return finish(
                Stop(
                    reason=(
                        "CUDA out of memory even with "
                        f"{ALLOC_CONF}={env.get(ALLOC_CONF)}: the job needs less memory"
                    ),
                    advice=OOM_ADVICE,
                ),
                "out of memory is not a hardware fault: no quarantine",
            )
        env[ALLOC_CONF] = _with_expandable(env.get(ALLOC_CONF))
        reasons.append(
            f"out of memory: retry once with {ALLOC_CONF}={env[ALLOC_CONF]} "
            "(fragmentation case); no quarantine"
        )

    # 3. Futile retry: the job's own error, the same way again.
    bad_step = event_step(attribution.findings)
    signature = attribution.signature
    futile_kind = attribution.kind is not IncidentKind.OOM
    futile_domain = attribution.domain in _FUTILE_DOMAINS or bad_step is not None
    if futile_kind and futile_domain and signature:
        repeats = _consecutive_same_signature(snapshot, signature)
        if repeats >= max(policy.futile_after, 1):
            if bad_step is not None:
                # A health event is dated by its step: the same one again at the same
                # step after a restore replayed the run is the job's or its data's (0520).
                return finish(
                    Stop(
                        reason=(
                            f"futile retry: the same training-health event ({signature}) "
                            f"{repeats} times in a row at step {bad_step}, replayed from a "
                            "checkpoint before it: an application or data problem, not a GPU"
                        ),
                        advice="look at the data and the step's inputs (learning rate, "
                        "batch) at that step, fix them, then run again",
                    ),
                    "same training-health event at the same step as the previous attempt: "
                    "stop, no quarantine",
                )
            return finish(
                Stop(
                    reason=(
                        f"futile retry: the same {attribution.domain.value} error "
                        f"({signature}) {repeats} times in a row; restarting would fail "
                        "the same way"
                    ),
                    advice="fix the error shown in the evidence, then run again",
                ),
                "same application-error signature as the previous attempt: stop, no quarantine",
            )

    # 4. Restart budget.
    if snapshot.restarts_used >= policy.max_restarts:
        return finish(
            Stop(
                reason=(
                    f"restart budget exhausted: {snapshot.restarts_used} of "
                    f"{policy.max_restarts} restarts used"
                ),
                advice="look at the incident reports (trainguard incidents) for the cause",
            )
        )

    # 5. Capacity: schedulable devices not excluded, the failed attempt's own first.
    # need 0: a job without managed devices (a CPU machine with no --devices).
    need = max(policy.need, 0)
    minimum = need if policy.min_need is None else max(min(1, need), min(policy.min_need, need))
    if policy.placement == "node":
        candidates, could_return = _node_candidates(snapshot, excluded, excluded_hosts, need)
    else:
        candidates, could_return = _device_candidates(snapshot, excluded, excluded_hosts)
    available = len(candidates)
    unit = "device(s) on whole healthy hosts" if policy.placement == "node" else "device(s)"
    if available < minimum:
        message = (
            f"need {need} healthy {unit}"
            + (f" (at least {minimum})" if minimum != need else "")
            + f", only {available} available"
        )
        if could_return + available >= minimum and policy.wait_for_capacity:
            return finish(
                WaitForCapacity(
                    reason=f"{message}; waiting for quarantined/repaired devices to return "
                    "(release one with `trainguard devices release`)",
                    needed=minimum,
                    available=available,
                )
            )
        if could_return + available >= minimum:
            # The policy does not wait (trainguard run, 0381): said now, with the way out.
            return finish(
                Stop(
                    reason=f"{message}; the policy does not wait for quarantined/repaired "
                    "devices to return",
                    advice="release one with `trainguard devices release ID --reason ...` "
                    "and run again",
                )
            )
        return finish(
            Stop(
                reason=f"{message}, and the inventory cannot provide more",
                advice="add devices or lower --need / --min-need",
            )
        )
    chosen = candidates[:need]
    if len(chosen) < need:
        reasons.append(
            f"continuing with {len(chosen)} of {need} devices (the job allows at least {minimum})"
        )
    if snapshot.assigned:
        assigned = set(snapshot.assigned)
        if policy.placement == "node":
            before = {by_uuid[u].device.host for u in snapshot.assigned if u in by_uuid}
            new_hosts = list(dict.fromkeys(s.device.host for s in chosen))
            added = [h for h in new_hosts if h not in before]
            if added:
                gone = sorted(before - set(new_hosts))
                reasons.append(
                    f"replacement node(s): {', '.join(added)}"
                    + (f" for {', '.join(gone)}" if gone else "")
                )
        else:
            replaced = [s.device.uuid for s in chosen if s.device.uuid not in assigned]
            if replaced:
                reasons.append(f"replacement device(s): {', '.join(replaced)}")

    # 6. The newest valid checkpoint; after a training-health event, the newest valid
    # one saved before it (policy.checkpoint_choice, 0521).
    checkpoint, skipped = select_checkpoint(snapshot.checkpoints, bad_step)
    for info in skipped:
        reasons.append(f"skipped checkpoint {info.path}: {info.reason or 'invalid'}")
    pre_event = "" if bad_step is None else f", the newest from before step {bad_step}"
    if checkpoint is None:
        reasons.append(
            "no valid checkpoint"
            + ("" if bad_step is None else f" from before step {bad_step}")
            + ": the job restarts from the beginning"
        )
    else:
        reasons.append(
            f"restore checkpoint {checkpoint.path} ({_restore_said(checkpoint)}{pre_event})"
        )

    delay = backoff_seconds(
        snapshot.restarts_used, policy.backoff_base_seconds, policy.backoff_max_seconds
    )
    return finish(
        Restart(
            devices=tuple(s.device.uuid for s in chosen),
            checkpoint=checkpoint,
            delay_seconds=delay,
            env=env,
        ),
        f"restart {snapshot.restarts_used + 1} of {policy.max_restarts}"
        + (f" after {delay:g} s backoff" if delay else ""),
        skipped=skipped,
    )


def _hosts_out(devices: tuple[DeviceStatus, ...]) -> dict[str, bool]:
    """Per host: True when none of its devices is schedulable (the node is already out)."""
    out: dict[str, bool] = {}
    for status in devices:
        host = status.device.host
        out[host] = out.get(host, True) and status.state not in _SCHEDULABLE
    return out
