"""Parity of the gates on a recovery: observe mode, approvals and the quarantine breaker
give the same world under ``trainguard run`` and under the cluster reconciler (``serve``
over procs). Each scenario is one expectation, parametrised over the mode (issue 12).

The operator acts through the operations interface in both modes
(:class:`~trainguard.controller.operations.LocalOperations` on the state database, what
``trainguard approve --state`` calls): for ``run`` from a thread while the supervisor
runs, for ``serve`` between the reconcile passes.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from _modes import (
    PARITY_MODES,
    SERVE_PROC,
    Fleet,
    Outcome,
    Policy,
    _read,
    _wait,
    run_options,
    supervise,
    xid_line,
)
from _serve_proc_mode import ServeProc

from trainguard.controller.operations import LocalOperations
from trainguard.controller.service import ControlPlane
from trainguard.model.plan import Mode
from trainguard.policy.breaker import BreakerConfig
from trainguard.policy.step import RESTART_DENIED
from trainguard.store import Store
from trainguard.store.fleet import FleetStore

pytestmark = pytest.mark.slow

OPERATOR = "operator:test"


@dataclasses.dataclass
class World:
    """What a gate scenario asserts, read from the state database at the end."""

    out: Outcome
    job: str  # the job's state
    job_reason: str | None
    approvals: list[tuple[str, str]]  # (kind, state), oldest first
    approval_why: list[str]
    breaker: str  # the quarantine breaker's state
    suppressed: list[str]  # resource ids the breaker held back
    health: dict[str, str]  # the named cards' health states
    ledger: list[tuple[str, str]]  # the incidents' recorded actions: (type, result)
    attempt_devices: list[tuple[str, ...]] = dataclasses.field(default_factory=list)
    named: list[str] = dataclasses.field(default_factory=list)  # the cards the XIDs named


def _world(store: Store, job_id: str, named: Sequence[str]) -> World:
    fleet = FleetStore(store)
    incidents = store.incidents.list_incidents(job_id=job_id)
    return World(
        out=_read(store, job_id, named[0] if named else None),
        job=store.jobs.get_job(job_id).state.value,
        job_reason=store.jobs.get_job(job_id).reason,
        approvals=[
            (a.kind, a.state.value)
            for a in sorted(fleet.approvals.list_approvals(), key=lambda a: a.id)
        ],
        approval_why=[a.why for a in sorted(fleet.approvals.list_approvals(), key=lambda a: a.id)],
        breaker=fleet.breaker.get_breaker("quarantine").state.value,
        suppressed=[s.resource_id for s in fleet.breaker.list_suppressions()],
        health={u: store.devices.get_device(u).state.value for u in named},
        ledger=[
            (str(a["type"]), str(a.get("result") or a.get("skipped") or ""))
            for i in incidents
            for a in i.actions
        ],
        attempt_devices=[tuple(a.device_uuids) for a in store.jobs.list_attempts(job_id)],
        named=list(named),
    )


Operator = Callable[[LocalOperations], bool]  # one look; True: its work is done


def _operations(store: Store) -> LocalOperations:
    """What ``trainguard approve --state DB`` gets (``_commands/_remote.operations``)."""
    return LocalOperations(ControlPlane(store, None), OPERATOR)


def _is_last(store: Store, job_id: str, attempt: int) -> bool:
    return store.jobs.list_attempts(job_id)[-1].number == attempt


def run_gate(
    tmp: Path,
    job_args: Sequence[str],
    policy: Policy,
    *,
    job_mode: Mode = Mode.ACT,
    devices: int = 2,
    xids: Sequence[tuple[int, int]] = (),
    operator: Operator | None = None,
) -> World:
    """``trainguard run`` (its driver in this process) on ``devices`` simulated cards; each of
    ``xids`` is (attempt, checkpoint step): once that attempt wrote that checkpoint, an
    XID 79 on its first card. ``operator`` looks at the state database from a thread."""
    ckpt = tmp / "ckpt"
    kern = tmp / "kern.log"
    kern.write_text("")
    state = tmp / "state.db"
    options = run_options(tmp, job_args, policy, mode=job_mode, devices=devices)
    named: list[str] = []
    stop = threading.Event()

    def inject() -> None:
        for attempt, step in xids:
            _wait((ckpt / f"step_{step:08d}").is_dir, 60, f"checkpoint {step}")
            with Store.open(state) as store:
                [job] = store.jobs.list_jobs()
                _wait(partial(_is_last, store, job.id, attempt), 30, f"attempt {attempt}")
                att = store.jobs.list_attempts(job.id)[-1]
                dev = store.devices.get_device(att.device_uuids[0])
            named.append(dev.uuid)
            with kern.open("a") as fh:
                fh.write(xid_line(dev.device.pci_bus_id, 79) + "\n")

    def operate() -> None:
        assert operator is not None
        while not stop.is_set():
            if state.exists():
                with Store.open(state) as store:
                    if operator(_operations(store)):
                        return
            time.sleep(0.1)

    threads = [threading.Thread(target=inject, daemon=True)] if xids else []
    if operator is not None:
        threads.append(threading.Thread(target=operate, daemon=True))
    for t in threads:
        t.start()
    try:
        result = supervise(options)
    finally:
        stop.set()
        for t in threads:
            t.join(5)
    with Store.open(state) as store:
        return _world(store, result.job_id, named)


def serve_gate(
    store_target: str,
    tmp: Path,
    job_args: Sequence[str],
    policy: Policy,
    *,
    job_mode: Mode = Mode.ACT,
    devices: int = 2,
    xids: Sequence[tuple[int, int]] = (),
    operator: Operator | None = None,
    timeout: float = 60.0,
) -> World:
    """The same under the cluster reconciler: ``devices`` cards on two nodes, the mode
    set on the cluster through the operations interface, passes driven here, the
    operator looking between them."""
    per_node = devices // 2
    fleet = Fleet(
        store_target,
        tmp,
        nodes={"n1": per_node, "n2": devices - per_node},
        config=policy.control_config(),
    )
    try:
        ops = _operations(fleet.store)
        ops.set_mode("cluster", job_mode.value, "the scenario's mode")
        fleet.cp.put_policy(policy.document(), OPERATOR)
        fj = fleet.submit(*job_args, devices_per_node=1, policy="scenario")
        ckpt = Path(str(fleet.store.jobs.get_job(fj.job_id).checkpoint_dir or ""))
        named: list[str] = []
        operated = operator is None

        def look() -> None:
            nonlocal operated
            if not operated:
                operated = operator(ops)  # type: ignore[misc]

        for attempt, step in xids:
            target = ckpt / f"step_{step:08d}"

            def reached(a: int = attempt, t: Path = target) -> bool:
                look()
                oj = fleet.observed(fj)
                return oj.attempt == a and oj.phase.value == "running" and t.is_dir()

            fleet.run_until(reached, timeout=60, interval=0.05)
            dev = fleet.observed(fj).devices[0]
            named.append(dev.uuid)
            fleet.report_xid(dev)

        def finished() -> bool:
            look()
            return fleet.store.jobs.get_job(fj.job_id).state.terminal

        fleet.run_until(finished, timeout=timeout, interval=0.05)
        return _world(fleet.store, fj.job_id, named)
    finally:
        fleet.close()


def serve_proc_gate(
    store_target: str,
    tmp: Path,
    job_args: Sequence[str],
    policy: Policy,
    *,
    job_mode: Mode = Mode.ACT,
    devices: int = 2,
    xids: Sequence[tuple[int, int]] = (),
    operator: Operator | None = None,
    timeout: float = 90.0,
) -> World:
    """The same under the real two-process serve over procs (``devices`` cards on two
    nodes): the mode set on the cluster through the operations interface, the XIDs posted
    as an agent posts them, the operator looking at the state database from a thread."""
    per_node = devices // 2
    serve = ServeProc(store_target, policy, nodes=f"n1={per_node},n2={devices - per_node}")
    ckpt = tmp / "ckpt"
    named: list[str] = []
    stop = threading.Event()

    def operate() -> None:
        assert operator is not None
        while not stop.is_set():
            with Store.open(store_target) as store:
                if operator(_operations(store)):
                    return
            time.sleep(0.1)

    thread = threading.Thread(target=operate, daemon=True) if operator is not None else None
    try:
        with Store.open(store_target) as store:
            _operations(store).set_mode("cluster", job_mode.value, "the scenario's mode")
        job_id = serve.submit(job_args, ckpt)
        if thread is not None:
            thread.start()
        with Store.open(store_target) as store:
            for attempt, step in xids:
                _wait((ckpt / f"step_{step:08d}").is_dir, 60, f"checkpoint {step}")

                def recorded(a: int = attempt) -> bool:
                    # The pass that saw the attempt running has recorded it.
                    return bool(store.jobs.list_attempts(job_id)) and _is_last(store, job_id, a)

                _wait(recorded, 30, f"attempt {attempt}")
                uuid = store.jobs.list_attempts(job_id)[-1].device_uuids[0]
                named.append(uuid)
                if job_mode is not Mode.OBSERVE:
                    serve.xid_on(store, uuid)
                    continue
                # Nothing stops the job in observe mode: it is held still until the
                # server's own pass has seen the XID, or a loaded machine lets it run to
                # its end first (the in-process modes see it in the pass after it).
                with serve.held():
                    serve.xid_on(store, uuid)
                    _wait(
                        lambda: bool(store.incidents.list_incidents(job_id=job_id)),
                        30,
                        "the XID seen",
                    )
        serve.wait_ended(job_id, timeout)
    finally:
        stop.set()
        if thread is not None:
            thread.join(5)
        serve.close()
    with Store.open(store_target) as store:
        return _world(store, job_id, named)


def _scenario(
    mode: str, tmp: Path, store_target: str, job_args: list[str], policy: Policy, **kw: Any
) -> World:
    if mode == "run":
        return run_gate(tmp, job_args, policy, **kw)
    if mode == SERVE_PROC:
        return serve_proc_gate(store_target, tmp, job_args, policy, **kw)
    return serve_gate(store_target, tmp, job_args, policy, **kw)


# --- observe mode ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", PARITY_MODES)
def test_observe_mode_records_the_plan_for_an_xid_and_touches_nothing(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    # An XID on the running card would quarantine it and restart the job in act mode;
    # in observe mode the incident and its plan are recorded and nothing else happens:
    # the card stays in service, the job runs on to its end untouched.
    w = _scenario(
        mode, tmp_path, sqlite_target, ["--steps", "20"], Policy(), job_mode=Mode.OBSERVE,
        xids=[(0, 10)],
    )  # fmt: skip
    [inc] = w.out.incidents
    assert (inc["kind"], inc["domain"], inc["state"]) == ("xid", "hardware", "observed"), w
    assert inc["culprit"] == w.named[0], w
    assert inc["actions"] == [] and w.ledger == [], w
    # The plan is recorded (what act mode would have done), said to be not carried out.
    assert "plan 1: quarantine, restart" in inc["notes"], w
    assert "open -> observed" in inc["notes"], w
    assert any("nothing done (would: " in n for n in inc["notes"]), w
    assert w.out.attempts == ["completed"] and w.job == "completed", w
    assert w.out.quarantined == [] and w.out.repairs == [], w
    assert w.health == {w.named[0]: "healthy"}, w


@pytest.mark.parametrize("mode", PARITY_MODES)
def test_observe_mode_an_observed_xid_then_the_crash_it_caused_is_one_incident(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    # The job runs on after the observed XID and dies on the card 0.6 s later: that
    # ends the attempt and stops the job, and it is the same failure, not a second one.
    w = _scenario(
        mode, tmp_path, sqlite_target, ["--fail-attempts", "0", "--fail-at", "16",
        "--interval", "0.1", "--steps", "30"], Policy(), job_mode=Mode.OBSERVE,
        xids=[(0, 10)],
    )  # fmt: skip
    [inc] = w.out.incidents
    assert (inc["kind"], inc["state"]) == ("xid", "observed"), w
    assert inc["actions"] == [] and w.ledger == [], w
    assert w.out.attempts == ["failed"] and w.job == "stopped", w
    assert w.out.quarantined == [] and w.out.repairs == [], w
    assert w.health == {w.named[0]: "healthy"}, w


@pytest.mark.parametrize("mode", PARITY_MODES)
def test_observe_mode_records_the_plan_for_a_crash_and_restarts_nothing(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    w = _scenario(
        mode, tmp_path, sqlite_target, ["--fail-attempts", "0", "--fail-at", "6",
        "--steps", "20"], Policy(), job_mode=Mode.OBSERVE,
    )  # fmt: skip
    [inc] = w.out.incidents
    assert (inc["kind"], inc["state"]) == ("crash", "observed"), w
    assert inc["actions"] == [] and w.ledger == [], w
    assert "plan 1: restart" in inc["notes"], w
    assert w.out.attempts == ["failed"] and w.job == "stopped", w
    assert w.out.quarantined == [] and w.out.repairs == [], w


@pytest.mark.parametrize("mode", PARITY_MODES)
def test_observe_mode_records_a_hang_and_the_attempt_that_steps_on_completes(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    # Attempt 0 goes silent at step 6 for 3 s (the adaptive detector: 1 s floor), then
    # steps on to its end. Observe mode records the hang and its plan; the attempt was
    # never over, so its record is not "failed" and the job completes (serve used to fail
    # the attempt's record while the process hung on, 0365).
    w = _scenario(
        mode, tmp_path, sqlite_target, ["--fail-attempts", "0", "--fail-at", "6",
        "--hang-for", "3", "--steps", "10"], Policy(), job_mode=Mode.OBSERVE,
    )  # fmt: skip
    [inc] = w.out.incidents
    assert (inc["kind"], inc["state"]) == ("hang", "observed"), w
    assert inc["failed_step"] == 6 and inc["actions"] == [] and w.ledger == [], w
    assert "plan 1: restart" in inc["notes"], w
    assert w.out.attempts == ["completed"] and w.job == "completed", w


# --- approvals ---------------------------------------------------------------------------


def _decide(approve: bool) -> Operator:
    """An operator who decides the first pending approval the controller asks for."""

    def look(ops: LocalOperations) -> bool:
        pending = ops.approvals("pending")
        if not pending:
            return False
        verb = ops.approve if approve else ops.deny
        verb(int(pending[0]["id"]), "looked at it")
        return True

    return look


# Attempts 0 and 1 both exit 1 at step 6 with nothing that explains it: the second
# unknown failure of the job waits for a person before it is restarted (approvals.py).
REPEATED_UNKNOWN = ["--fail-attempts", "0,1", "--fail-at", "6", "--steps", "14"]


@pytest.mark.parametrize("mode", PARITY_MODES)
def test_a_repeated_unknown_failure_waits_for_approval_and_an_approved_restart_runs(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    w = _scenario(mode, tmp_path, sqlite_target, REPEATED_UNKNOWN, Policy(), operator=_decide(True))
    assert w.approvals == [("restart", "approved")], w
    [why] = w.approval_why
    assert "unknown and this job failed for an unknown cause 1 time(s) before" in why, w
    [inc] = w.out.incidents
    assert (inc["domain"], inc["state"]) == ("unknown", "recovered"), w
    assert inc["actions"] == ["restart", "restart"], w
    assert w.out.attempts == ["failed", "failed", "completed"] and w.job == "completed", w
    assert w.out.quarantined == [], w


@pytest.mark.parametrize("mode", PARITY_MODES)
def test_a_denied_restart_is_skipped_and_the_job_stops(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    w = _scenario(
        mode, tmp_path, sqlite_target, REPEATED_UNKNOWN, Policy(), operator=_decide(False)
    )
    assert w.approvals == [("restart", "denied")], w
    [inc] = w.out.incidents
    assert inc["state"] == "stopped", w
    # The first restart ran; the denied one is skipped, not recorded as done, and no
    # stop action is invented: the plan ran out.
    assert inc["actions"] == ["restart"], w
    assert f"acting -> stopped: {RESTART_DENIED}" in inc["notes"], w
    assert w.out.attempts == ["failed", "failed"] and w.job == "stopped", w
    assert w.job_reason == RESTART_DENIED, w


# --- the quarantine breaker ----------------------------------------------------------------


# Four cards, two XIDs: the first on attempt 0's card, the second on the card the
# restart runs on before it verified. Checkpoints every 10 steps: attempt 0 cannot write
# step 20 before it is killed.
TWO_XIDS = ["--steps", "30", "--every", "10", "--interval", "0.08"]


@pytest.mark.parametrize("mode", PARITY_MODES)
def test_the_breaker_holds_back_a_quarantine_beyond_the_share_and_the_job_avoids_the_card(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    # The default breaker (at most 25% quarantined within an hour, from 4 cards on): the
    # first XID quarantines its card (1 of 4); the second would make it 2 of 4: held back
    # with its reason, the breaker trips. The job is still restarted, on neither card.
    w = _scenario(
        mode, tmp_path, sqlite_target, TWO_XIDS, Policy(verify_window=5.0), devices=4,
        xids=[(0, 10), (1, 20)],
    )  # fmt: skip
    first, second = w.named
    assert first != second, w
    [inc] = w.out.incidents  # the restart failed before it verified: the same incident
    assert (inc["kind"], inc["state"]) == ("xid", "recovered"), w
    assert w.ledger == [
        ("quarantine", "quarantined"),
        ("restart", ""),
        ("quarantine", "suppressed"),
        ("restart", ""),
    ], w
    held = [n for n in inc["notes"] if f"{second} not quarantined: 2 of 4 devices" in n]
    assert len(held) == 1, w
    assert w.out.quarantined == [first] and w.out.repairs == [first], w
    assert w.suppressed == [second] and w.breaker == "open", w
    assert w.health == {first: "quarantined", second: "healthy"}, w
    assert w.out.attempts == ["failed", "failed", "completed"] and w.job == "completed", w
    # each restart's first trained step, after the restored 10 and 20 (0497)
    assert w.out.resumed_steps == [1, 11, 21], w
    assert not {first, second} & set(w.attempt_devices[2]), w


@pytest.mark.parametrize("mode", PARITY_MODES)
def test_a_breaker_set_to_a_larger_share_lets_the_second_quarantine_through(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    # The scenario above with --breaker-max-share 0.5 (run's option, serve's
    # ControlConfig.breaker, decision 0375): 2 of 4 is not more than half, so the
    # quarantine the default breaker suppresses is made, and the breaker stays closed.
    policy = Policy(verify_window=5.0, breaker=BreakerConfig(max_share=0.5))
    w = _scenario(
        mode, tmp_path, sqlite_target, TWO_XIDS, policy, devices=4, xids=[(0, 10), (1, 20)]
    )
    first, second = w.named
    assert first != second, w
    [inc] = w.out.incidents
    assert (inc["kind"], inc["state"]) == ("xid", "recovered"), w
    assert w.ledger == [
        ("quarantine", "quarantined"),
        ("restart", ""),
        ("quarantine", "quarantined"),
        ("restart", ""),
    ], w
    assert not any("not quarantined" in n for n in inc["notes"]), w
    assert w.out.quarantined == sorted([first, second]), w
    assert w.out.repairs == sorted([first, second]), w
    assert w.suppressed == [] and w.breaker == "closed", w
    assert w.health == {first: "quarantined", second: "quarantined"}, w
    assert w.out.attempts == ["failed", "failed", "completed"] and w.job == "completed", w
    assert not {first, second} & set(w.attempt_devices[2]), w


@pytest.mark.parametrize("mode", PARITY_MODES)
def test_a_known_cause_after_an_unknown_one_in_the_same_incident_does_not_wait(
    mode: str, tmp_path: Path, sqlite_target: str
) -> None:
    # Attempt 0 exits 1 at step 6 for no known reason; its restart dies on an XID before
    # it verified (the same incident). That failure's cause is known (the card), so its
    # quarantine and restart go ahead: the rule judges the failure the plan answers,
    # not the incident's first one.
    w = _scenario(
        mode, tmp_path, sqlite_target, ["--fail-attempts", "0", "--fail-at", "6",
        "--steps", "20"], Policy(verify_window=5.0), devices=3, xids=[(1, 10)],
    )  # fmt: skip
    assert w.approvals == [], w
    [inc] = w.out.incidents
    assert inc["state"] == "recovered", w
    assert inc["actions"] == ["restart", "quarantine", "restart"], w
    assert w.out.quarantined == [w.named[0]], w
    assert w.out.attempts == ["failed", "failed", "completed"] and w.job == "completed", w
