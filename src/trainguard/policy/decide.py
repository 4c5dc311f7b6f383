"""``decide(snapshot) -> Plan``: the recovery policy as one pure function.

The rules, in the order they are applied (docs/run.md, decision 0050):

1. **Isolate hardware.** Every device named by hardware evidence (the
   attribution's culprit when its domain is ``hardware``, and every hardware
   finding that names a device) is quarantined *before* anything restarts; a
   ``node`` attribution naming a host quarantines the host. Application errors,
   out-of-memory, hangs and collective errors never quarantine.
2. **Out of memory.** Retry once with
   ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (the fragmentation
   case) when the attempt did not already run with it; otherwise stop with
   advice. (Checked before the futile rule, which would stop at once.)
3. **Futile retry.** The same application-error signature ``futile_after``
   times in a row (this failure included) stops the job: retrying would fail
   the same way and only burn the budget.
4. **Budget.** At most ``max_restarts`` restarts; exponential backoff between
   them (the first restart is immediate: the cause has just been isolated).
5. **Capacity.** The next attempt gets ``need`` schedulable devices, keeping the
   failed attempt's healthy devices first (locality, warm caches) and then the
   lowest indices; with fewer, it continues only down to ``min_need``, else it
   waits for capacity (some device may come back from repair) or stops (none
   can).
6. **Checkpoint.** Restart from the newest *valid* checkpoint in the catalog's
   list; every invalid one newer than it is listed in ``skipped_checkpoints``
   with the catalog's reason. No valid checkpoint: start fresh, and say so.
7. **Observe mode** produces exactly the same Plan, marked ``observe``; the
   controller records it and acts on nothing.

Cost is O(devices + checkpoints + history): the fleet simulator calls this
with tens of thousands of devices per call.
"""

from __future__ import annotations

from trainguard.model.checkpoint import CheckpointInfo
from trainguard.model.devices import normalize_pci_bus_id
from trainguard.model.findings import Attribution, Domain, IncidentKind
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

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE = "expandable_segments:True"
OOM_ADVICE = (
    "reduce the per-device micro-batch size (keep the global batch with gradient "
    "accumulation), enable activation checkpointing, or shard the optimizer state "
    "(ZeRO / FSDP)"
)
# Domains whose failures are the job's own doing: retrying the same failure is futile.
_FUTILE_DOMAINS = frozenset({Domain.APPLICATION, Domain.USER_CONFIG})
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


def _hardware_targets(
    attribution: Attribution, by_uuid: dict[str, DeviceStatus], by_pci: dict[str, DeviceStatus]
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Devices and hosts the hardware/node evidence names, as ``(id, reason)``, deduplicated."""
    devices: dict[str, str] = {}
    hosts: dict[str, str] = {}

    def resolve(uuid: str | None, pci: str | None) -> str | None:
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

    candidates = [(attribution.domain, attribution.culprit, attribution.summary)]
    candidates += [(f.domain, f.culprit, f.message) for f in attribution.findings]
    for domain, culprit, why in candidates:
        if domain is Domain.HARDWARE:
            uuid = resolve(culprit.device_uuid, culprit.pci_bus_id)
            if uuid is not None and uuid not in devices:
                devices[uuid] = why
        elif domain is Domain.NODE and culprit.host and culprit.host not in hosts:
            hosts[culprit.host] = why
    return list(devices.items()), list(hosts.items())


def _select_checkpoint(
    checkpoints: tuple[CheckpointInfo, ...],
) -> tuple[CheckpointInfo | None, tuple[CheckpointInfo, ...]]:
    """The newest valid checkpoint and the invalid ones newer than it (newest first)."""
    skipped: list[CheckpointInfo] = []
    for info in checkpoints:
        if info.valid:
            return info, tuple(skipped)
        skipped.append(info)
    return None, tuple(skipped)


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

    # 1. Isolate hardware before anything else.
    bad_devices, bad_hosts = _hardware_targets(attribution, by_uuid, by_pci)
    excluded: set[str] = set()
    excluded_hosts: set[str] = set()
    for uuid, why in bad_devices:
        excluded.add(uuid)
        state = by_uuid[uuid].state
        if state in (HealthState.QUARANTINED, HealthState.REPAIR, HealthState.RETIRED):
            reasons.append(f"device {uuid} is already {state.value}; it stays out of the job")
        elif policy.allow_quarantine:
            actions.append(Quarantine("device", uuid, why))
            reasons.append(f"hardware evidence on device {uuid}: quarantine before restarting")
        else:
            reasons.append(
                f"hardware evidence on device {uuid}, but quarantine is disabled by policy; "
                "the next attempt avoids it"
            )
    for host, why in bad_hosts:
        excluded_hosts.add(host)
        if policy.allow_quarantine:
            actions.append(Quarantine("node", host, why))
            reasons.append(f"node evidence on host {host}: quarantine before restarting")
        else:
            reasons.append(f"node evidence on host {host}, but quarantine is disabled by policy")

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
    signature = attribution.signature
    futile_kind = attribution.kind is not IncidentKind.OOM
    if futile_kind and attribution.domain in _FUTILE_DOMAINS and signature:
        repeats = _consecutive_same_signature(snapshot, signature)
        if repeats >= max(policy.futile_after, 1):
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

    # 5. Capacity: healthy devices not excluded, the failed attempt's own first.
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
        if not status.state.schedulable:
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
    candidates = keep + spare_healthy + spare_suspect
    # need 0: a job without managed devices (a CPU machine with no --devices).
    need = max(policy.need, 0)
    minimum = need if policy.min_need is None else max(min(1, need), min(policy.min_need, need))
    available = len(candidates)
    if available < minimum:
        message = (
            f"need {need} healthy device(s)"
            + (f" (at least {minimum})" if minimum != need else "")
            + f", only {available} available"
        )
        if could_return + available >= minimum:
            return finish(
                WaitForCapacity(
                    reason=f"{message}; waiting for quarantined/repaired devices to return "
                    "(release one with `trainguard devices release`)",
                    needed=minimum,
                    available=available,
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
    replaced = [s.device.uuid for s in chosen if s.device.uuid not in assigned]
    if replaced and snapshot.assigned:
        reasons.append(f"replacement device(s): {', '.join(replaced)}")

    # 6. The newest valid checkpoint.
    checkpoint, skipped = _select_checkpoint(snapshot.checkpoints)
    for info in skipped:
        reasons.append(f"skipped checkpoint {info.path}: {info.reason or 'invalid'}")
    if checkpoint is None:
        reasons.append("no valid checkpoint: the job restarts from the beginning")
    else:
        reasons.append(f"restore checkpoint {checkpoint.path} (step {checkpoint.step})")

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
