"""The local recovery loop behind ``trainguard run``: the ten-step sequence on one machine.

One :class:`RunController` supervises one job::

    launch attempt 0
    loop:
      wait for events (output lines, progress datagrams, kernel-log lines, process
      exits) on one queue, with a timeout = the next deadline (hang, evidence
      settling, verification window): no polling loop of our own
      1  detect      crash (pidfd on every rank, torchrun's summary, the launcher's
                     exit), hang (no progress for the hang timeout), fatal XID on
                     one of the attempt's devices (kernel log)
      2  identify    every event carries its attempt; XIDs map to devices by PCI id
         (settle)    collect late evidence for up to ``settle`` seconds
         attribute   evidence beats symptom (diagnose.attribution)
         decide      policy.decide(snapshot) -> Plan
         persist     the Plan in the store before acting (durable intent)
      3  isolate     quarantine devices (health state machine) before any restart
      4  checkpoint  the catalog's newest valid checkpoint (damaged ones skipped,
                     with the reason, in the plan)
      5-6 restart    stop the old tree, launch on the plan's devices with
                     TRAINGUARD_RESUME_FROM, after the plan's backoff
      7-8 (the job)  restores and continues
      9  verify      the first progress starts from the restored step, and the
                     step rate over the verification window is plausible against
                     the pre-failure baseline; otherwise the restart counts as a
                     failed attempt and the same incident is acted on again
      10 repair      the quarantined device waits for `trainguard devices release`
                     or validation; the incident records the repair advice

Every observation, decision and action is written to the store; actions are
audited as ``intent`` before and ``result`` after (the result names its intent).
In observe mode the plan is recorded (incident outcome ``observed``) and nothing
is acted on.

Crash safety: one ``run`` at a time holds the state database's lease (decision
0220); the job runs under a watchdog that stops it when this process dies
(schedulers/_reaper.py, decision 0113); the next ``run`` of the same command on
the same state resumes the dead supervisor's job from its ledger — leftovers
stopped, unanswered intents marked abandoned, the persisted plan's actions not
yet recorded carried out, one restart, verified (0220) — and closes any other
job it left (0114).

The controller is one class built in a line, one module per concept (0220):
run_base.py (options, the attempt record, state, launch) -> run_observe.py
(event dispatch and detection) -> run_verify.py (verification of a restart) ->
run_gate.py (approvals) -> run_quarantine.py (quarantine, through the breaker) ->
run_act.py (attribution, plan, restart, stop) -> run_resume.py (a dead
supervisor's job) -> this module (the loop, the lease, start-up).
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
from collections.abc import Callable

from trainguard.controller.checkpoint_care import select_checkpoints
from trainguard.controller.interrupts import on_interrupt
from trainguard.controller.lease import (
    CONTROLLER_LEASE,
    LeaseKeeper,
    holder_alive,
    process_holder,
    take_from_dead,
)
from trainguard.controller.run_base import (
    ACTOR,
    EXIT_INTERRUPTED,
    EXIT_STOPPED,
    SUPERVISOR_DIED,
    RunOptions,
    RunResult,
    _Attempt,
    _Interrupt,
    _LeaseLost,
    no_progress_hint,
    resume_arg_tokens,
    resume_command,
    torchrun_world_size,
)
from trainguard.controller.run_resume import RunResume
from trainguard.model.health import HealthState
from trainguard.model.records import (
    AttemptState,
    AuditKind,
    JobState,
)
from trainguard.policy.verify import (
    verify_restart,
)
from trainguard.schedulers.local import (
    process_identity,
)
from trainguard.signals.inventory import InventoryError, load
from trainguard.signals.kernel_log import open_kernel_log
from trainguard.signals.progress import ProgressListener, short_socket_dir
from trainguard.store import Store
from trainguard.store.fleet import Fence, Fenced, FleetStore


class RunController(RunResume):
    """Supervise one job end to end; see the module docstring."""

    def run(self) -> RunResult:
        o = self.opt
        now = self.clock()
        self.store = Store.open(o.state, at=now)
        refused = self._take_lease(now)
        if refused is not None:
            self.store.close()
            self.say(refused)
            return RunResult("", EXIT_STOPPED, JobState.STOPPED, refused)
        assert self.fence is not None
        keeper = LeaseKeeper(
            o.state,
            self.fence,
            self.lease_ttl,
            lambda why: self.events.put(_LeaseLost(why)),
            self.clock,
        )
        keeper.start()
        sock_dir = short_socket_dir()
        listener: ProgressListener | None = None
        kernel = None
        restore_signals = self._install_signal_handlers()
        try:
            try:
                inv = load(simulate=o.simulate_devices, inventory_file=o.inventory_file)
            except (InventoryError, OSError) as exc:
                self.say(f"bad inventory: {exc}")
                return RunResult("", 2, JobState.STOPPED, str(exc))
            self.inventory = inv.devices
            if not inv.found:
                self.say(f"{inv.message}; running without device management")
            self.db.register_devices(self.inventory, at=now, actor=ACTOR)
            problem, adopted = self._recover_abandoned()
            if problem is not None:
                self.say(problem)
                return RunResult("", EXIT_STOPPED, JobState.STOPPED, problem)
            now = self.clock()  # the job starts after the clean-up
            if o.preflight and self.inventory:
                self._preflight(o.preflight)
            statuses = self.device_statuses()
            if adopted is not None:
                job = adopted
                self.need = job.need
            else:
                healthy = [s for s in statuses if s.state.schedulable]
                self.need = o.need if o.need is not None else len(healthy)
                job = self.db.create_job(
                    name=o.display_name(),
                    command=o.command,
                    need=self.need,
                    at=now,
                    mode=o.mode.value,
                    min_need=o.min_need,
                    checkpoint_dir=o.checkpoint_dir,
                    actor=ACTOR,
                )
            self.job_id = job.id
            me = process_identity()
            # Who supervises the job: how the next `trainguard run` on this state tells a
            # job left open by a dead supervisor from one still supervised (decision 0114).
            self.audit(
                AuditKind.NOTE,
                f"job:{job.id}",
                f"supervised by trainguard run (pid {me['pid']} on {me['host']})",
                {"supervisor": me, "resumed": adopted is not None},
            )
            self.log_dir = o.log_dir or os.path.join(
                os.path.dirname(os.path.abspath(o.state)), "logs", job.id
            )
            os.makedirs(self.log_dir, exist_ok=True)
            self.say(f"job {job.id}: {inv.message}; logs in {self.log_dir}")

            devices = None if adopted is not None else self._initial_devices(statuses)
            if adopted is None and devices is None:
                return self._stop_job(None, "not enough healthy devices to start", EXIT_STOPPED)

            listener = ProgressListener(os.path.join(sock_dir, "progress.sock"), self.events.put)
            listener.start()
            self.progress_url = listener.url
            kernel, description = open_kernel_log(o.kernel_log, self.events.put, self.clock)
            self.say(description)
            self.audit(AuditKind.NOTE, f"job:{job.id}", description)
            if kernel is not None:
                kernel.start()

            if adopted is not None:
                resumed = self._resume(adopted)
                if isinstance(resumed, RunResult):
                    return resumed
                att = resumed
            else:
                assert devices is not None
                self.db.update_job_state(job.id, JobState.RUNNING, at=self.clock(), actor=ACTOR)
                started = self._launch(0, devices, None, {}, incident_id=None)
                if started is None:
                    return self._stop_job(None, "the command could not be started", EXIT_STOPPED)
                att = started
            return self._loop(att)
        except Fenced as exc:
            return self._lease_lost(str(exc))
        finally:
            keeper.stop()
            self.scheduler.close()  # the parked standby, if any, goes with the job
            restore_signals()
            if kernel is not None:
                kernel.stop()
            if listener is not None:
                listener.stop()
            shutil.rmtree(sock_dir, ignore_errors=True)
            if self.store is not None:
                self.store.close()

    def _take_lease(self, now: float) -> str | None:
        """Take the state database's controller lease; why not, as one line, when refused.

        A holder that provably died (a SIGKILLed ``trainguard run`` of this host)
        loses the lease at once, so a restart after a crash need not wait for expiry.
        """
        fleet = FleetStore(self.db)
        holder = process_holder()
        lease = take_from_dead(fleet, CONTROLLER_LEASE, holder, self.lease_ttl, now)
        if lease is not None:
            self.fence = Fence(CONTROLLER_LEASE, holder, lease.token)
            return None
        current = fleet.get_lease(CONTROLLER_LEASE)
        who = "another trainguard"
        if current is not None:
            parts = current.holder.split(":")
            alive = holder_alive(current.holder)
            who = (
                f"trainguard (pid {parts[1]} on {parts[0]})"
                if alive is not None and len(parts) > 1
                else f"trainguard {current.holder}"
            )
        return (
            f"{self.opt.state} is in use: {who} holds its lease and supervises the jobs "
            "on it; stop that one first, or give this run another --state"
        )

    def _preflight(self, level: str) -> None:
        """``--preflight LEVEL``: check the schedulable devices before the first attempt;
        one that fails is quarantined (recorded with its measurements), so it is never
        assigned. See trainguard.preflight.gate."""
        from trainguard.preflight.gate import preflight_gate

        candidates = [s.device for s in self.device_statuses() if s.state.schedulable]
        if not candidates:
            return
        histories = {d.uuid: self.db.device_history(d.uuid) for d in candidates}
        gate = preflight_gate(
            candidates, level, histories=histories, kernel_log=self.opt.kernel_log
        )
        self.say(gate.summary)
        for fail in gate.failed:
            at = self.clock()
            reason = f"preflight {gate.level} failed: {fail.reason}"
            with self.db.transaction():
                self.db.append_audit(
                    at, ACTOR, AuditKind.RESULT, f"device:{fail.uuid}", reason, fail.data
                )
                self.db.transition_device(fail.uuid, HealthState.QUARANTINED, reason, ACTOR, at)

    def _install_signal_handlers(self) -> Callable[[], None]:
        return on_interrupt(lambda signum: self.events.put(_Interrupt(signum)))

    def _loop(self, att: _Attempt) -> RunResult:
        while True:
            timeout = max(0.0, self._next_deadline(att) - self.clock())
            try:
                ev = self.events.get(timeout=min(timeout, 3600.0))
            except queue.Empty:
                ev = None
            if isinstance(ev, _Interrupt):
                return self._interrupted(att, ev.signum)
            if isinstance(ev, _LeaseLost):
                return self._lease_lost(ev.reason)
            if ev is not None:
                self._dispatch(att, ev)
            now = self.clock()
            if att.trigger is None:
                hang = self._check_hang(att, now)
                if hang is not None and not (att.launcher_exit and not att.launcher_exit.failed):
                    self._record_finding(att, hang)
                    self._trigger(att, hang)
            if att.incident_id is not None and not att.verified and att.trigger is None:
                self._maybe_verify(att, now)
            # The job finished cleanly: done (a pending trigger loses to a clean exit).
            if att.launcher_exit is not None and not att.launcher_exit.failed:
                if att.closed_streams >= {"stdout", "stderr"} or self._settled(att, now, 2.0):
                    return self._completed(att)
                continue
            if att.trigger is None or not self._settled(att, now):
                continue
            if att.observed:
                # Observe mode: the plan is recorded; wait for the job to end by itself.
                if att.launcher_exit is not None and (
                    att.closed_streams >= {"stdout", "stderr"} or self._settled(att, now, 2.0)
                ):
                    return self._observed_end(att)
                continue
            outcome = self._handle_failure(att)
            if isinstance(outcome, RunResult):
                return outcome
            if outcome is att:
                # Observed: the job may already be gone (a launcher exit was the trigger).
                if att.launcher_exit is not None and att.closed_streams >= {"stdout", "stderr"}:
                    return self._observed_end(att)
                continue
            att = outcome

    def _interrupted(self, att: _Attempt, signum: int) -> RunResult:
        name = signal.Signals(signum).name
        self._end_attempt(att, f"interrupted by {name}", AttemptState.STOPPED)
        open_inc = att.incident_id if att.incident_id and not att.verified else None
        return self._stop_job(open_inc, f"interrupted by {name}", EXIT_INTERRUPTED)

    def _completed(self, att: _Attempt) -> RunResult:
        self._check_fence()  # a deposed run closes nothing
        now = self.clock()
        att.launch.wait_closed(2.0)
        if att.steps.last_step is not None and att.steps.last_at is not None:
            self.db.update_attempt_progress(
                self.job_id, att.number, att.steps.last_step, at=att.steps.last_at
            )
        if att.incident_id is not None and not att.verified:
            # The job finished inside the verification window: that verifies it.
            v = verify_restart(self._observation(att, now, completed=True), self._verify_rules())
            self._verified(att, now, v)
        rec = self.db.get_attempt(self.job_id, att.number)
        if not rec.state.terminal:
            self.db.finish_attempt(
                self.job_id, att.number, AttemptState.COMPLETED, at=now, exit_code=0, actor=ACTOR
            )
        self.db.update_job_state(
            self.job_id, JobState.COMPLETED, at=now, reason="the job exited 0", actor=ACTOR
        )
        self.say(
            f"job {self.job_id} completed"
            + (f" after {self.restarts_total} restart(s)" if self.restarts_total else "")
        )
        return RunResult(self.job_id, 0, JobState.COMPLETED, None, tuple(self.incidents))

    def _observed_end(self, att: _Attempt) -> RunResult:
        self._check_fence()  # a deposed run closes nothing
        exit = att.launcher_exit
        assert exit is not None
        att.launch.wait_closed(2.0)
        code = exit.exit_code if exit.exit_code else (128 + exit.signal if exit.signal else 1)
        reason = "observe mode: the job failed and nothing was restarted"
        self._end_attempt(att, reason, AttemptState.FAILED)
        self.db.update_job_state(
            self.job_id, JobState.STOPPED, at=self.clock(), reason=reason, actor=ACTOR
        )
        self.say(f"job stopped: {reason} (exit {code})")
        return RunResult(self.job_id, code, JobState.STOPPED, reason, tuple(self.incidents))


def run_job(options: RunOptions) -> RunResult:
    """Run one job under supervision (what ``trainguard run`` calls)."""
    from trainguard.controller.local_driver import LocalDriver

    return LocalDriver(options).run()


__all__ = [
    "SUPERVISOR_DIED",
    "RunController",
    "RunOptions",
    "RunResult",
    "no_progress_hint",
    "resume_arg_tokens",
    "resume_command",
    "run_job",
    "select_checkpoints",
    "torchrun_world_size",
]
