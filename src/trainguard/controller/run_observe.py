"""Event dispatch and detection for ``trainguard run``: output lines, progress
datagrams, process exits and kernel-log lines become findings; a crash, a hang or
a fatal XID on the attempt's device triggers a recovery (steps 1-2 of the sequence).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from trainguard.controller.breaker import check_quarantine, hold_back
from trainguard.controller.repair import idle_card_repair
from trainguard.controller.run_base import (
    ACTOR,
    PROGRESS_WRITE_SECONDS,
    SAVE_SCAN_SECONDS,
    SHUTDOWN_ALLOWANCE_S,
    RunBase,
    _Attempt,
)
from trainguard.diagnose.detectors import (
    ProcessExit,
    crash_finding,
    line_finding,
    rank_prefix,
    rank_using,
)
from trainguard.diagnose.signatures import Classifier, classify_line
from trainguard.model.findings import Domain, Finding, Severity
from trainguard.model.health import HealthState
from trainguard.model.records import (
    AttemptState,
    AuditKind,
)
from trainguard.policy.evidence import Route, idle_quarantine_reason, route_finding
from trainguard.policy.verify import first_progress_note, no_step_signal_warning
from trainguard.signals.kernel_log import KernelLine
from trainguard.signals.output import OutputClosed, OutputLine
from trainguard.signals.process import AttemptProcessExit
from trainguard.signals.progress import ProgressReceived
from trainguard.store.fleet import FleetStore


class RunObservers(RunBase):
    """Event dispatch and detection for ``trainguard run`` (see the module docstring)."""

    def _next_deadline(self, att: _Attempt) -> float:
        """When the loop must wake up without an event (only deadlines still ahead matter)."""
        deadlines = []
        if att.trigger is None and att.finishing_since is not None:
            deadlines.append(att.finishing_since + self._shutdown_allowance())
        elif att.trigger is None and not att.hang.fired:
            deadlines.append(att.hang.deadline())
        if att.trigger is not None and not att.observed and att.settle_until is not None:
            deadlines.append(att.settle_until)
        if att.launcher_exit is not None:
            deadlines.append(att.launcher_exit.at + 2.0)  # output drained or not, decide then
        if att.incident_id is not None and not att.verified and self.opt.checkpoint_dir:
            # A restart being verified: look for the checkpoints it writes (a job that
            # prints nothing still saves), see _scan_saves.
            deadlines.append(self.clock() + SAVE_SCAN_SECONDS)
        return min(deadlines) if deadlines else self.clock() + 3600.0

    def _shutdown_allowance(self) -> float:
        return max(SHUTDOWN_ALLOWANCE_S, 10.0 * (self.opt.hang_timeout or 0.0))

    def _check_hang(self, att: _Attempt, now: float) -> Finding | None:
        if att.finishing_since is None:
            return att.hang.check(now)
        allowance = self._shutdown_allowance()
        if att.hang.fired or now < att.finishing_since + allowance:
            return None
        att.hang.fired = True
        return Finding(
            kind="hang",
            domain=Domain.UNKNOWN,
            at=now,
            source="detector:hang",
            message=(
                f"the job did not finish: a rank exited cleanly {now - att.finishing_since:.0f} s "
                f"ago but the others are still running (last step {att.steps.last_step})"
            ),
            severity=Severity.FATAL,
            signature="hang:shutdown",
            details={"since": att.finishing_since, "last_step": att.steps.last_step},
        )

    def _settled(self, att: _Attempt, now: float, extra: float = 0.0) -> bool:
        if att.settle_until is None:
            return att.launcher_exit is not None and (
                att.closed_streams >= {"stdout", "stderr"} or now >= att.launcher_exit.at + extra
            )
        if now >= att.settle_until + extra:
            return True
        # The launcher is gone and its output drained: no more evidence will come.
        return att.launcher_exit is not None and att.closed_streams >= {"stdout", "stderr"}

    def _dispatch(self, att: _Attempt, ev: Any) -> None:
        if isinstance(ev, OutputLine):
            if ev.attempt == att.number:
                self._on_output(att, ev)
        elif isinstance(ev, ProgressReceived):
            e = ev.event
            if e.attempt is None or e.attempt == att.number:
                self._on_progress_event(att, ev)
        elif isinstance(ev, AttemptProcessExit):
            if ev.attempt == att.number:
                self._on_exit(att, ev.exit)
        elif isinstance(ev, KernelLine):
            self._on_kernel(att, ev)
        elif isinstance(ev, OutputClosed) and ev.attempt == att.number:
            att.closed_streams.add(ev.stream)

    def _on_output(self, att: _Attempt, ev: OutputLine) -> None:
        rank = rank_prefix(ev.text)
        att.tail.append((rank, ev.text))
        # trainguard.train's own messages ("resumed from ... (step 8 ...)") are not progress.
        own = ev.text.startswith("trainguard:")
        reading = None if own else self.progress_parser.read(ev.text)
        step = reading.step if reading is not None and reading.is_step else None
        if step is not None and not att.structured:
            # A JSON progress line's own "rank" names it, as serve counts it (0350).
            named = reading.rank if reading is not None and reading.rank is not None else rank
            self._on_step(att, step, ev.at, named)
        elif reading is not None and not reading.is_step:
            # A changing liveness reading (an evaluation bar, a logged loss) defers the
            # hang deadline: a long evaluation between steps is not a hang (0143).
            att.hang.alive(ev.at, reading.token)
            att.output_lines += 1
            if att.first_output_at is None:
                att.first_output_at = ev.at
            att.last_output_at = ev.at
        if not own and ev.text.strip():
            if att.first_line_at is None:
                att.first_line_at = ev.at
            self._warn_no_step_signal(att, ev.at)
        exit = att.torchrun.feed(ev.text, ev.at)
        if exit is not None:
            self._on_exit(att, exit)
        classifier = att.classifiers.setdefault(ev.stream, Classifier())
        try:
            matches = classifier.feed(ev.text + "\n")
        except Exception as exc:  # a classifier bug must not stop supervision
            self.say(f"output classification failed: {exc}")
            return
        for m in matches:
            f = line_finding(m, m.text, ev.at, f"output:{ev.stream}", att.devices, self.inventory)
            att.findings.append(f)

    def _on_progress_event(self, att: _Attempt, ev: ProgressReceived) -> None:
        e = ev.event
        att.reported_ranks.add(e.rank)
        if e.event in ("progress", "resumed"):
            att.structured = True
        if e.event == "progress":
            self._on_step(att, e.step, ev.at, e.rank)
        elif e.event == "resumed":
            if att.steps.resumed_step is None:
                att.steps.resumed_step = e.step
                att.steps.resumed_checkpoint = e.checkpoint
            if e.metrics.get("source") == "memory":
                att.memory_step = (
                    e.step if att.memory_step is None else min(att.memory_step, e.step)
                )
        elif e.event == "checkpoint_saved":
            att.saved_steps.append(e.step)

    def _warn_no_step_signal(self, att: _Attempt, at: float) -> None:
        """The first attempt has produced output for a verification window and not one
        step: a restart of this job can only be verified by liveness. Said once."""
        text = no_step_signal_warning(
            attempt=att.number,
            step_signal=self.step_signal,
            first_output_at=att.first_line_at,
            now=at,
            window_seconds=self.opt.verify_window,
        )
        if text is None or text in self.warnings:
            return
        self.warnings.append(text)
        self.audit(AuditKind.NOTE, f"job:{self.job_id}", f"warning: {text}")
        self.say(f"warning: {text}")

    def _on_step(self, att: _Attempt, step: int, at: float, rank: int | None) -> None:
        self.step_signal = True
        if rank is not None:
            att.reported_ranks.add(rank)
        att.hang.observe(step, at, rank)
        new = att.steps.observe(step, at, rank)
        if att.first_progress_at is None:
            att.first_progress_at = at
            self._first_progress(att, step, at)
        if new and at - att.last_store_write >= PROGRESS_WRITE_SECONDS:
            att.last_store_write = at
            self.db.update_attempt_progress(self.job_id, att.number, step, at=at)

    def _first_progress(self, att: _Attempt, step: int, at: float) -> None:
        if att.incident_id is None:
            with contextlib.suppress(Exception):
                self.db.transition_attempt(
                    self.job_id, att.number, AttemptState.RUNNING, at=at, actor=ACTOR
                )
            return
        self.db.update_incident(
            att.incident_id,
            at=at,
            note=first_progress_note(step, att.number),
            resumed_step=step,
            actor=ACTOR,
        )

    def _on_exit(self, att: _Attempt, exit: ProcessExit) -> None:
        if exit.source == "launcher":
            att.launcher_exit = exit
        if not exit.failed:
            if exit.source == "rank" and att.finishing_since is None:
                att.finishing_since = exit.at  # clean (or already reaped) rank exit
            return
        if exit.source != "launcher" or not any(
            f.kind == "crash" and f.culprit.rank is not None for f in att.findings
        ):
            tail_rank = exit.local_rank if exit.local_rank is not None else exit.rank
            tail = tuple(
                t for r, t in list(att.tail) if tail_rank is None or r in (tail_rank, None)
            )[-10:]
            exit = ProcessExit(
                at=exit.at,
                source=exit.source,
                pid=exit.pid,
                rank=exit.rank,
                local_rank=exit.local_rank,
                exit_code=exit.exit_code,
                signal=exit.signal,
                tail=tail,
            )
            f = crash_finding(exit, att.devices)
            if f is not None:
                self._record_finding(att, f)
                self._trigger(att, f)

    def _on_kernel(self, att: _Attempt, ev: KernelLine) -> None:
        try:
            m = classify_line(ev.text)
        except Exception:
            return
        if m is None:
            return
        f = line_finding(m, m.text, ev.at, "kernel_log", att.devices, self.inventory)
        if f.culprit.device_uuid in {d.uuid for d in att.devices}:
            f = self._culprit_from_device_map(att, f)
        # The same routing as the cluster reconciler (policy/evidence.py, 0130).
        route = route_finding(f, attempt_devices={d.uuid for d in att.devices})
        if route in (Route.RECOVER, Route.EVIDENCE):
            self._record_finding(att, f)
            # A fatal hardware fault on the job's own device: act now, do not wait for
            # the job to crash or hang on it.
            if route is Route.RECOVER:
                self._trigger(att, f)
        elif f.domain is Domain.HARDWARE and f.culprit.device_uuid is not None:
            self._quarantine_unassigned(f, route)
        else:
            if f.domain is Domain.NETWORK and f.culprit.host is None:
                # This machine's kernel log: a NIC/link event names this host (0110).
                host = self._local_host()
                if host is not None:
                    f = dataclasses.replace(f, culprit=dataclasses.replace(f.culprit, host=host))
            self.audit(AuditKind.OBSERVATION, "kernel", f"kernel log: {f.message}", f.to_dict())
            if f.culprit.device_uuid is None and f.severity is not Severity.WARNING:
                # Host-level evidence (the kernel's OOM killer, a machine check): the
                # attribution may need it to explain a rank that was killed.
                att.findings.append(f)

    def _culprit_from_device_map(self, att: _Attempt, f: Finding) -> Finding:
        """The culprit's rank is the rank that had the device, from the job's own
        device map (each rank's CUDA_VISIBLE_DEVICES and LOCAL_RANK), not the device's
        position, which names a rank that may not exist when ranks != devices."""
        dev = next((d for d in att.devices if d.uuid == f.culprit.device_uuid), None)
        if dev is None:
            return f
        known, rank = rank_using(att.launch.ranks.views(), dev)
        if not known or rank == f.culprit.rank:
            return f
        return dataclasses.replace(f, culprit=dataclasses.replace(f.culprit, rank=rank))

    def _local_host(self) -> str | None:
        """The host of this machine's devices, when the inventory names exactly one."""
        hosts = {d.host for d in self.inventory}
        return next(iter(hosts)) if len(hosts) == 1 else None

    def _quarantine_unassigned(self, f: Finding, route: Route) -> None:
        """Hardware evidence on a device the job is not using: keep it out of future plans."""
        uuid = f.culprit.device_uuid
        assert uuid is not None
        self.audit(AuditKind.OBSERVATION, f"device:{uuid}", f"kernel log: {f.message}", f.to_dict())
        if route is not Route.QUARANTINE_IDLE:
            return
        try:
            state = self.db.get_device_state(uuid)
        except Exception:
            return
        if state in (HealthState.HEALTHY, HealthState.SUSPECT):
            now = self.clock()
            fleet = FleetStore(self.db)
            # The fleet-share breaker refuses it as serve's idle-card quarantine does (0347).
            verdict = check_quarantine(
                fleet,
                self.opt.breaker,
                resource_kind="device",
                population=len(self.inventory),
                now=now,
            )
            if not verdict.allow:
                reason = verdict.reason or "breaker"
                with self.db.transaction():
                    hold_back(
                        fleet,
                        resource_kind="device",
                        resource_id=uuid,
                        reason=reason,
                        trip=verdict.tripped_now,
                        at=now,
                        actor=ACTOR,
                        incident_id=None,
                    )
                self.say(f"device {uuid} not quarantined (not in use): {reason}")
                return
            with self.db.transaction():
                self.db.transition_device(
                    uuid,
                    HealthState.QUARANTINED,
                    idle_quarantine_reason(f),
                    ACTOR,
                    now,
                    job_id=self.job_id,
                )
                fleet.record_quarantine("device", uuid, at=now, incident_id=None)
                repair = idle_card_repair(
                    FleetStore(self.db),
                    f,
                    uuid=uuid,
                    host=next((d.host for d in self.inventory if d.uuid == uuid), None),
                    at=now,
                    actor=ACTOR,
                )
            self.say(f"device {uuid} quarantined (not in use, repair {repair.id}): {f.message}")

    def _record_finding(self, att: _Attempt, f: Finding) -> None:
        att.findings.append(f)
        if (
            att.trigger is not None
            and att.settle_until is not None
            and f.domain is Domain.HARDWARE
            and f.severity is Severity.FATAL
        ):
            att.settle_until = min(att.settle_until, self.clock())  # conclusive: act now
        if att.trigger is not None and f.kind == "crash":
            return  # the rest of the tree going down after the failure: evidence, not news
        if f.kind in ("crash", "hang", "xid", "verify_failed") or f.domain is Domain.HARDWARE:
            self.audit(
                AuditKind.OBSERVATION,
                f"attempt:{self.job_id}/{att.number}",
                f"{f.kind}: {f.message}",
                f.to_dict(),
            )

    def _trigger(self, att: _Attempt, f: Finding) -> None:
        if att.trigger is not None or att.observed:
            return
        detected = self.clock()
        # Evidence already conclusive (hardware on our device): no need to wait for more.
        if f.domain is Domain.HARDWARE:
            att.settle_until = detected
        else:
            att.settle_until = detected + self.opt.settle
        att.trigger = dataclasses.replace(f, details={**f.details, "detected_at": detected})
        self.say(f"detected {f.kind}: {f.message}")
