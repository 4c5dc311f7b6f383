"""The reconciler's state and shared reads: one store, one scheduler, caches that only save work.

Part of the one recovery engine (decision 0211): the store reads every other part
uses (live incidents, attempts, the job's policy and mode, earlier failures, the
restart budget, checkpoints on disk). Nothing here acts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from trainguard.controller.checkpoint_care import select_checkpoints
from trainguard.controller.crash import CrashPoints
from trainguard.controller.engine.config import (
    _LIVE,
    ControlConfig,
    PassReport,
    _HealthView,
    _OutputState,
    resolve_mode,
)
from trainguard.controller.engine.traits import SchedulerTraits, traits_of
from trainguard.controller.lease import LeaderElector
from trainguard.controller.policies import DEFAULT_POLICY, merge, parse_policy, resolve
from trainguard.diagnose.detectors import HangDetector, ProgressLineParser
from trainguard.model.checkpoint import CheckpointInfo
from trainguard.model.fleet import (
    ActionRecord,
    ActionState,
    EffectiveMode,
    FleetJob,
    PolicyDocument,
)
from trainguard.model.plan import ActionKind, Mode, PriorFailure, RecoveryPolicy
from trainguard.model.records import AttemptRecord, IncidentRecord, IncidentState, JobRecord
from trainguard.policy.budget import BudgetEntry, restarts_used
from trainguard.policy.history import failure_history
from trainguard.policy.lost import Segment, incident_segments
from trainguard.schedulers.base import ClusterScheduler, Observation
from trainguard.store import NotFound, Store
from trainguard.store.fleet import Fence, FleetStore


class NodeStepRunner(Protocol):
    """A pass step over the cluster's nodes (the BMC node-recovery step): ``run_once``
    returns one outcome per node it acted on, each with ``node`` and ``step``."""

    def run_once(self, obs: Observation, fence: Fence, now: float) -> Sequence[Any]: ...


class EngineCore:
    """The engine's state and the store reads every part shares."""

    def __init__(
        self,
        store: Store,
        scheduler: ClusterScheduler | None,
        *,
        identity: str,
        config: ControlConfig | None = None,
        clock: Callable[[], float] = time.time,
        crash: CrashPoints | None = None,
    ) -> None:
        self.store = store
        # What the scheduler does by itself, as it declares it (decision 0326).
        self.traits: SchedulerTraits = traits_of(scheduler)
        self.fleet = FleetStore(store)
        self.scheduler = scheduler
        self.config = config or ControlConfig()
        self.clock = clock
        self.crash = crash or CrashPoints()
        self.elector = LeaderElector(
            self.fleet, identity, self.config.lease_name, self.config.lease_ttl
        )
        # The lost-node step (controller/node_recovery.py, 0242), set by the control plane
        # when BMCs are configured; run in act mode after the jobs' incidents.
        self.node_recovery: NodeStepRunner | None = None
        self._seen_devices: dict[str, tuple[str, int, str]] = {}
        self._seen_nodes: dict[str, tuple[str | None, tuple[tuple[str, str], ...]]] = {}
        self._health = _HealthView()
        self._outputs: dict[tuple[str, int], _OutputState] = {}
        self._warned_no_step: set[str] = set()  # jobs told they have no progress signal
        # One hang detector per live attempt, fed the progress the store holds. Lost on a
        # restart of the controller: the new one starts from the stored last step with
        # the start-up allowance, so a restart can delay a hang verdict, never invent one.
        self._hangs: dict[tuple[str, int], HangDetector] = {}
        # Findings up to this id were read by an earlier pass (None: none yet); each pass
        # reads what is new once (_pass_findings) for the running attempts and idle cards.
        self._finding_cursor: int | None = None
        self._pass_findings: list[dict[str, Any]] = []
        # Attempts whose whole evidence history was read once; later passes read the new.
        self._evidence_read: set[tuple[str, int]] = set()
        self._progress = ProgressLineParser(self.config.progress_pattern)
        self.last_report: PassReport | None = None
        self._policy_cache: dict[str, PolicyDocument | None] = {}
        # traits.requeues_by_itself: the nodes each attempt started on.
        self._attempt_nodes: dict[tuple[str, int], tuple[str, ...]] = {}
        # traits.shared_output: what the file began with when an attempt's output was
        # seeded (a truncation on requeue changes it).
        self._heads: dict[tuple[str, int], bytes] = {}

    @property
    def identity(self) -> str:
        return self.elector.identity

    def _made_by_us(self, job_id: str, attempt: int) -> bool:
        """Whether trainguard made ``attempt`` (a restart of an incident of this job)."""
        for inc in self.store.list_incidents(job_id=job_id):
            if inc.recovery_attempt == attempt:
                return True
            if not inc.state.terminal and any(
                a.type == ActionKind.RESTART and a.state is ActionState.INTENDED
                for a in self.fleet.list_actions(inc.id)
            ):
                return True
        return False

    def _live_incidents(self) -> list[IncidentRecord]:
        out: list[IncidentRecord] = []
        for state in _LIVE:
            out += self.store.list_incidents(state=state)
        return sorted(out, key=lambda i: i.id)

    def _fleet_job_or_none(self, job_id: str) -> FleetJob | None:
        try:
            return self.fleet.get_fleet_job(job_id)
        except NotFound:
            return None

    def _attempt_or_none(self, job_id: str, number: int) -> AttemptRecord | None:
        try:
            return self.store.get_attempt(job_id, number)
        except NotFound:
            return None

    def _segments(
        self, inc_id: int, job_id: str, running: int, restored: int | None
    ) -> list[Segment]:
        """The incident's attempts as policy.lost counts them, attempt ``running``
        having restored ``restored`` (0370): read as run reads them, from the store."""
        attempts = {a.number: a for a in self.store.list_attempts(job_id)}
        return incident_segments(
            self.store.get_incident(inc_id), attempts, running=running, restored=restored
        )

    def _incident_for_attempt(self, job_id: str, number: int) -> IncidentRecord | None:
        for inc in self.store.list_incidents(job_id=job_id):
            if inc.attempt == number or inc.recovery_attempt == number:
                return inc
        return None

    @staticmethod
    def _restored_step(inc: IncidentRecord) -> int | None:
        if inc.checkpoint_step is not None:
            return inc.checkpoint_step
        for action in (inc.plan or {}).get("actions") or ():
            ckpt = action.get("checkpoint") if isinstance(action, dict) else None
            if isinstance(ckpt, dict) and ckpt.get("step") is not None:
                return int(ckpt["step"])
        return None

    def policy_document(self, fj: FleetJob) -> PolicyDocument | None:
        """The job's document over the operator default (read once per pass)."""
        key = fj.policy or ""
        if key not in self._policy_cache:
            default = self.fleet.get_policy(DEFAULT_POLICY)
            own = self.fleet.get_policy(fj.policy) if fj.policy else None
            base = parse_policy(default) if default else None
            doc = parse_policy(own) if own else None
            self._policy_cache[key] = merge(base, doc)
        return self._policy_cache[key]

    def _policy(self, fj: FleetJob, job: JobRecord) -> RecoveryPolicy:
        return resolve(self.policy_document(fj), need=job.need, min_need=job.min_need)

    def effective_mode(
        self, fj: FleetJob, modes: Mapping[str, Mode] | None = None
    ) -> EffectiveMode:
        if not fj.opted_in:
            return EffectiveMode(Mode.OBSERVE, None)
        if modes is None:
            modes = {m.scope.key: m.mode for m in self.fleet.list_scope_modes()}
        return resolve_mode(modes, fj.job_id, fj.partition, self.config.default_mode)

    def _checkpoints(self, job: JobRecord) -> tuple[CheckpointInfo, ...]:
        return select_checkpoints(job.checkpoint_dir, "full")

    def _failures(self, job_id: str, before_incident: int) -> list[PriorFailure]:
        """The job's failures before incident ``before_incident``, one per failure (0360)."""
        return failure_history(self.store.list_incidents(job_id=job_id), before=before_incident)

    def _restarts_used(self, inc: IncidentRecord, ledger: Sequence[ActionRecord]) -> int:
        """The job's restarts that count against this incident's budget (0130): the
        earlier incidents' too, until a recovery verified and the job got further."""

        def done(actions: Sequence[ActionRecord]) -> int:
            return sum(
                1 for a in actions if a.type == ActionKind.RESTART and a.state is ActionState.DONE
            )

        earlier = sorted(
            (i for i in self.store.list_incidents(job_id=inc.job_id) if i.id < inc.id),
            key=lambda i: i.id,
        )
        entries = [
            BudgetEntry(
                failed_step=i.failed_step,
                restarts=done(self.fleet.list_actions(i.id)),
                recovered=i.state is IncidentState.RECOVERED,
            )
            for i in earlier
        ]
        entries.append(BudgetEntry(inc.failed_step, done(ledger), recovered=False))
        return restarts_used(entries)

    @staticmethod
    def _valid_checkpoints(root: str | None) -> list[tuple[int | None, float]]:
        """Valid checkpoints in ``root`` (quick check): ``(step, mtime)``."""
        if not root or not os.path.isdir(root):
            return []
        from trainguard.checkpoints import scan

        try:
            found = scan(root, "quick")
        except OSError:
            return []
        return [
            (i.step if i.step_unit == "step" else None, float(i.created_at))
            for i in found
            if i.valid and i.created_at is not None
        ]

    def _trained_on_to(self, inc: IncidentRecord) -> int | None:
        """The failed attempt's last step when it trained on past the failed step."""
        failed = self._attempt_or_none(inc.job_id, inc.attempt)
        if failed is None or failed.last_step is None or inc.failed_step is None:
            return None
        return failed.last_step if failed.last_step > inc.failed_step else None
