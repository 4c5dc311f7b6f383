"""One failure scenario, run in each mode on real parts, reduced to what both must agree on.

* ``run``: ``trainguard run`` (``LocalDriver`` in this process: the engine over
  LocalCluster, the local supervisor as a scheduler, decision 0380; simulated devices,
  a real kernel-log file the test appends XID lines to);
* ``serve``: the cluster reconciler (``ControlPlane`` over the procs stand-in
  cluster, passes driven by the test, XIDs ingested as an agent sends them);
* ``serve-proc``: the real two-process ``trainguard serve`` (default ``--loop
  process``) over the same procs stand-in cluster, driven only over HTTP
  (:mod:`_serve_proc_mode`);
* ``slurm``: ``trainguard slurm watch``'s reconciler over the local Slurm cluster, for
  the scenarios that need a scheduler with real nodes (:mod:`_slurm_mode`; slow, in the
  ``slurm`` xdist group).

Which scheduler each driver uses, and why: ``serve`` and ``serve-proc`` share one
scheduler (procs), so a difference between them can only come from the driver (one
process or two, passes driven by the test or by the server's own loop). ``run`` keeps
LocalCluster: it is the scheduler ``trainguard run`` has (its supervisor launches and
watches the job on this host, decision 0380), and procs is not reachable from ``run``;
the scenarios that name hosts give ``run`` the procs cluster's cards
(:func:`procs_inventory`), so both schedulers hand out the same cards. ``slurm watch``
has only Slurm. ``PARITY_MODES`` are the modes every parity scenario runs in; the
scenarios that need a scheduler with real nodes (a hang, an XID) add the ``slurm`` mode.

Every mode runs the same job (``tests/jobs/cluster_job.py``: ``step=N`` lines, a
checkpoint every 5 steps, failures on cue) under the same recovery policy, and
each returns an :class:`Outcome` read from the state database, so a parity test
asserts one expectation for both.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "jobs" / "cluster_job.py"
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from _fleet import Fleet, xid_line  # noqa: E402

from trainguard.controller.local_driver import LocalDriver  # noqa: E402
from trainguard.controller.local_options import RunOptions, RunResult  # noqa: E402
from trainguard.controller.reconcile import ControlConfig  # noqa: E402
from trainguard.controller.service import ControlPlane  # noqa: E402
from trainguard.model.health import HealthState  # noqa: E402
from trainguard.model.plan import Mode  # noqa: E402
from trainguard.policy.breaker import BreakerConfig  # noqa: E402
from trainguard.schedulers.local import job_processes  # noqa: E402
from trainguard.store import Store  # noqa: E402
from trainguard.store.fleet import FleetStore  # noqa: E402

MODES = ("run", "serve")
# The real two-process serve over the same procs cluster as "serve" (_serve_proc_mode).
SERVE_PROC = "serve-proc"
PARITY_MODES = (*MODES, SERVE_PROC)


@dataclass(frozen=True)
class Policy:
    """The recovery policy of a scenario, said once for both modes."""

    hang_timeout: float | None = None  # None: adaptive
    hang_floor: float = 1.0
    hang_multiple: float = 3.0
    hang_startup: float = 30.0
    verify_window: float = 0.5
    max_restarts: int = 3
    # The quarantine breaker: run's --breaker-* (RunOptions.breaker), serve's
    # ControlConfig.breaker; not part of the policy document.
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    # Uncertain actions wait for a person: serve's default, run's --approvals (0425);
    # the scenarios compare the two asking.
    approvals: bool = True

    def control_config(self) -> ControlConfig:
        """serve's controller configuration for the scenario."""
        return ControlConfig(breaker=self.breaker)

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": "scenario",
            "hang_floor_seconds": self.hang_floor,
            "hang_multiple": self.hang_multiple,
            "hang_startup_seconds": self.hang_startup,
            "verify_window_seconds": self.verify_window,
            "max_restarts": self.max_restarts,
            "backoff": 0.0,
            "approvals": self.approvals,
        }
        if self.hang_timeout is not None:
            doc["hang_timeout_seconds"] = self.hang_timeout
        return doc


@dataclass(frozen=True)
class Xid:
    """An XID once the job's checkpoint at ``after_checkpoint`` exists (the job is still
    running): on the GPU of the running attempt, or (``idle``) on a card no job holds."""

    after_checkpoint: int = 10
    xid: int = 79
    idle: bool = False


@dataclass
class Outcome:
    incidents: list[dict[str, Any]]  # kind, domain, state, failed/checkpoint/lost steps, culprit
    attempts: list[str]  # attempt states, in order
    attempt0_reason: str | None
    quarantined: list[str]  # device uuids out of service
    repairs: list[str]  # resource ids with a repair record
    xid_device: str | None = None  # the card the XID named
    resumed_steps: list[int | None] = field(default_factory=list)  # each attempt's first step
    nodes_out: list[str] = field(default_factory=list)  # hosts out of service
    attempt_hosts: list[list[str]] = field(default_factory=list)  # each attempt's hosts


_SECONDS = re.compile(r"\b\d+(?:\.\d+)? s\b")


def seconds_masked(text: str | None) -> str | None:
    """``text`` with every "N s" (a duration) as "# s": what a user reads, compared
    across the modes without the timing of their loops (run's events, serve's passes)."""
    return None if text is None else _SECONDS.sub("# s", text)


def _read(store: Store, job_id: str, xid_device: str | None) -> Outcome:
    incidents = [
        {
            "kind": i.kind.value,
            "domain": i.domain.value,
            "state": i.state.value,
            "failed_step": i.failed_step,
            "checkpoint_step": i.checkpoint_step,
            "lost_steps": i.lost_steps,
            "culprit": i.culprit.device_uuid,
            "actions": [a["type"] for a in i.actions],
            "notes": [t.what for t in i.timeline],
        }
        for i in store.incidents.list_incidents(job_id=job_id)
    ]
    attempts = store.jobs.list_attempts(job_id)
    return Outcome(
        incidents=incidents,
        attempts=[a.state.value for a in attempts],
        attempt0_reason=attempts[0].reason if attempts else None,
        quarantined=sorted(
            d.uuid
            for d in store.devices.list_devices()
            if d.state in (HealthState.QUARANTINED, HealthState.REPAIR)
        ),
        repairs=sorted(r.resource_id for r in FleetStore(store).repairs.list_repairs()),
        xid_device=xid_device,
        resumed_steps=[a.first_step for a in attempts],
        nodes_out=sorted(
            n.name
            for n in FleetStore(store).nodes.list_nodes()
            if n.state in (HealthState.QUARANTINED, HealthState.REPAIR)
        ),
        attempt_hosts=[sorted({d.host or "" for d in a.devices}) for a in attempts],
    )


def _ingest_idle_xid(fleet: Fleet, held: set[str], xid: int) -> str:
    """An agent reports an XID for a card no job holds (by PCI bus id on its host)."""
    dev = next(d for d in fleet.cluster.observe().devices if d.uuid not in held)
    fleet.report_xid(dev, xid)
    return dev.uuid


def _wait(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def run_options(
    tmp: Path, job_args: Sequence[str], policy: Policy, *, mode: Mode = Mode.ACT, devices: int = 2
) -> RunOptions:
    """``trainguard run``'s options for a scenario: the job under ``policy`` on ``devices``
    simulated cards, its checkpoints, kernel log and state in ``tmp``."""
    ckpt = tmp / "ckpt"
    return RunOptions(
        command=(sys.executable, str(JOB), *job_args, "--ckpt", str(ckpt)),
        state=str(tmp / "state.db"),
        checkpoint_dir=str(ckpt),
        need=1,
        simulate_devices=devices,
        kernel_log=str(tmp / "kern.log"),
        policy={
            "hang_timeout_seconds": policy.hang_timeout,
            "hang_floor_seconds": policy.hang_floor,
            "hang_multiple": policy.hang_multiple,
            "hang_startup_seconds": policy.hang_startup,
            "max_restarts": policy.max_restarts,
            "backoff_base_seconds": 0.0,
            "verify_window_seconds": policy.verify_window,
            "approvals": policy.approvals,
        },
        grace=1.0,
        echo=False,
        mode=mode,
        breaker=policy.breaker,
    )


def supervise(options: RunOptions) -> RunResult:
    """Run the job as ``trainguard run`` does, in this process."""
    return LocalDriver(options, say=lambda _m: None).run()


def run_mode(
    tmp: Path,
    job_args: Sequence[str],
    policy: Policy,
    *,
    xid: Xid | None = None,
    inventory: Sequence[dict[str, Any]] | None = None,
) -> Outcome:
    """The scenario under ``trainguard run`` (its driver in this process); ``inventory``:
    its cards as named
    (``procs_inventory()``) instead of 2 simulated."""
    ckpt = tmp / "ckpt"
    kern = tmp / "kern.log"
    kern.write_text("")
    state = tmp / "state.db"
    options = run_options(tmp, job_args, policy)
    if inventory is not None:
        (tmp / "inventory.json").write_text(json.dumps(list(inventory)))
        options = dataclasses.replace(
            options, simulate_devices=None, inventory_file=str(tmp / "inventory.json")
        )
    named: list[str] = []
    injector = None
    if xid is not None:

        def inject() -> None:  # the kernel's line for the card, once the checkpoint exists
            _wait(lambda: (ckpt / f"step_{xid.after_checkpoint:08d}").is_dir(), 60, "checkpoint")
            with Store.open(state) as store:
                [job] = store.jobs.list_jobs()
                [att] = store.jobs.list_attempts(job.id)
                if xid.idle:
                    dev = next(
                        d for d in store.devices.list_devices() if d.uuid not in att.device_uuids
                    )
                else:
                    dev = store.devices.get_device(att.device_uuids[0])
            named.append(dev.uuid)
            with kern.open("a") as fh:
                fh.write(xid_line(dev.device.pci_bus_id, xid.xid) + "\n")

        injector = threading.Thread(target=inject, daemon=True)
        injector.start()
    result = supervise(options)
    if injector is not None:
        injector.join(5)
    with Store.open(state) as store:
        return _read(store, result.job_id, named[0] if named else None)


def serve_mode(
    store_target: str,
    tmp: Path,
    job_args: Sequence[str],
    policy: Policy,
    *,
    xid: Xid | None = None,
    done: Callable[[ControlPlane, str], bool] | None = None,
    timeout: float = 60.0,
) -> Outcome:
    """The scenario under the cluster reconciler (``serve`` over procs)."""
    fleet = Fleet(
        store_target, tmp, verify_window=policy.verify_window, config=policy.control_config()
    )
    try:
        fleet.cp.put_policy(policy.document(), "operator:test")
        fj = fleet.submit(*job_args, devices_per_node=1, policy="scenario")
        named = None
        if xid is not None:
            oj = fleet.wait_running(fj)
            ckpt = Path(str(fleet.store.jobs.get_job(fj.job_id).checkpoint_dir or ""))
            # Passes follow the job's progress until its checkpoint is on disk.
            target = ckpt / f"step_{xid.after_checkpoint:08d}"
            fleet.run_until(target.is_dir, timeout=60, interval=0.05)
            if xid.idle:
                named = _ingest_idle_xid(fleet, {d.uuid for d in oj.devices}, xid.xid)
            else:
                named = fleet.xid(fj, device_index=0, xid=xid.xid)
                assert named == oj.devices[0].uuid
        finished = done or (lambda cp, job_id: fleet.store.jobs.get_job(job_id).state.terminal)
        fleet.run_until(lambda: finished(fleet.cp, fj.job_id), timeout=timeout)
        return _read(fleet.store, fj.job_id, named)
    finally:
        fleet.close()


def scenario(
    mode: str,
    tmp: Path,
    store_target: str,
    job_args: Sequence[str],
    policy: Policy,
    *,
    xid: Xid | None = None,
    inventory: Sequence[dict[str, Any]] | None = None,
) -> Outcome:
    """One scenario in ``mode``: :func:`run_mode` (on ``inventory``'s cards when given),
    :func:`serve_mode` or ``serve_proc_mode`` (on ``store_target``)."""
    if mode == "run":
        return run_mode(tmp, job_args, policy, xid=xid, inventory=inventory)
    if mode == SERVE_PROC:
        from _serve_proc_mode import serve_proc_mode

        return serve_proc_mode(store_target, tmp, job_args, policy, xid=xid)
    if mode == "slurm":
        from _slurm_mode import slurm_mode

        return slurm_mode(tmp, job_args, policy, xid=xid)
    return serve_mode(store_target, tmp, job_args, policy, xid=xid)


def state_of(mode: str, tmp: Path, store_target: str) -> str:
    """Where a scenario's state database is: run and slurm watch keep it in ``tmp``."""
    return str(tmp / "state.db") if mode in ("run", "slurm") else store_target


# --- crash points: trainguard itself SIGKILLed mid-recovery, then restarted ----------------

CONTROLLER_PROC = ROOT / "tests" / "integration" / "_controller_proc.py"
CRASH_ENV = "TRAINGUARD_TEST_CRASH_AT"


@dataclass
class CrashWorld:
    """The state of the world after the restarted controller finished the recovery the
    killed one began, read from the state database (and, for serve, the scheduler)."""

    bad: str  # the card the XID named
    incidents: list[str]  # incident states
    attempts: list[str]  # attempt states, in order
    attempt_devices: list[tuple[str, ...]]  # each attempt's cards, in order
    bad_history: list[str]  # the bad card's health states, in order
    states: dict[str, str]  # every card's health state now
    repairs: list[str]  # resource ids with a repair record
    ledger: list[str]  # the incident's recorded actions, in order (type)
    intents: list[tuple[str, str, int, bool]]  # (subject, first word, answers, abandoned)
    action_keys: list[str] = field(default_factory=list)  # serve: the action ledger's keys
    starts: list[int] = field(default_factory=list)  # serve: attempt of each process start
    held_by_scheduler: bool = False  # serve: the scheduler still hands the bad card out
    lease: tuple[str, int] | None = None  # serve: (holder, token) at the end


def _crash_world(store: Store, job_id: str, bad: str) -> CrashWorld:
    attempts = store.jobs.list_attempts(job_id)
    incidents = store.incidents.list_incidents(job_id=job_id)
    audit = store.audit.list_audit()
    results = [a for a in audit if a.kind.value in ("result", "error")]
    intents = []
    for ev in audit:
        if ev.kind.value != "intent":
            continue
        key = ev.data.get("key")
        answers = [
            r
            for r in results
            if r.data.get("intent_id") == ev.id or (key is not None and r.data.get("key") == key)
        ]
        abandoned = any(r.data.get("abandoned") for r in answers)
        intents.append((ev.subject, ev.message.split(" ", 1)[0], len(answers), abandoned))
    return CrashWorld(
        bad=bad,
        incidents=[i.state.value for i in incidents],
        attempts=[a.state.value for a in attempts],
        attempt_devices=[tuple(a.device_uuids) for a in attempts],
        bad_history=[h.new_state.value for h in store.devices.device_history(bad)],
        states={d.uuid: d.state.value for d in store.devices.list_devices()},
        repairs=sorted(r.resource_id for r in FleetStore(store).repairs.list_repairs()),
        ledger=[str(a["type"]) for i in incidents for a in i.actions],
        intents=intents,
    )


def _no_crash_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != CRASH_ENV}


def crash_run_mode(tmp: Path, point: str, then: str | None = None) -> CrashWorld:
    """``trainguard run`` (a real process) SIGKILLed at ``point`` of the recovery from an
    XID on its second card, then the same command run again on the same state (with
    ``then``: the second run SIGKILLed there too, as it takes the job over, and a third
    one finishes)."""
    kern = tmp / "kern.log"
    kern.write_text("")
    state = tmp / "state.db"
    ckpt = tmp / "ckpt"
    job = [
        sys.executable,
        str(JOB),
        "--steps",
        # The restarted attempt must still be running when the first run dies after
        # verifying it: a job that completed meanwhile is closed as completed, and the
        # next run starts the command as a new job (a loaded machine finishes 16 steps
        # first). With a take-over to kill too, it must outlive that one as well.
        "40" if then is not None else "30",
        "--interval",
        "0.05",
        "--fail-attempts",
        "0",
        "--fail-at",
        "6",
        "--xid-log",
        str(kern),
        "--ckpt",
        str(ckpt),
    ]
    command = [sys.executable, "-m", "trainguard.cli", "run", "--state", str(state),
               "--checkpoint-dir", str(ckpt), "--kernel-log", str(kern), "--devices", "3",
               "--need", "2", "--grace", "1", "--verify-window", "0.5", "--hang-timeout", "20",
               "--startup-timeout", "30", "--backoff", "0.1", "--", *job]  # fmt: skip

    def run(crash: str | None) -> subprocess.CompletedProcess[str]:
        env = _no_crash_env()
        if crash:
            env[CRASH_ENV] = crash
        return subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp,
                              timeout=90)  # fmt: skip

    first = run(point)
    assert first.returncode == -signal.SIGKILL, (
        f"trainguard run did not reach {point}: rc={first.returncode}\n{first.stderr[-2000:]}"
    )
    with Store.open(state) as store:
        [rec] = store.jobs.list_jobs()
        bad = store.jobs.list_attempts(rec.id)[0].device_uuids[1]
    # No process of the job outlives its supervisor (the watchdog, decision 0113).
    _wait(lambda: job_processes(rec.id) == [], 10, "the job's processes to end")
    if then is not None:
        again = run(then)
        assert again.returncode == -signal.SIGKILL, (
            f"the second run did not reach {then}: rc={again.returncode}\n{again.stderr[-2000:]}"
        )
        _wait(lambda: job_processes(rec.id) == [], 10, "the job's processes to end")
    second = run(None)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming its recovery" in second.stderr, second.stderr[-3000:]
    with Store.open(state) as store:
        [again] = store.jobs.list_jobs()
        assert again.id == rec.id and again.state.value == "completed", again
        return _crash_world(store, rec.id, bad)


def crash_serve_mode(store_target: str, tmp: Path, point: str) -> CrashWorld:
    """The cluster reconciler (a real controller process over procs) SIGKILLed at
    ``point``; another controller (another identity: it waits for the dead one's lease
    to expire) finishes the recovery and runs until the job has ended."""
    fleet = Fleet(store_target, tmp)
    try:
        fj = fleet.submit(
            "--fail-attempts", "0", "--fail-at", "12", "--interval", "0.04", "--steps", "24"
        )
        bad = fleet.xid(fj, device_index=1)

        def controller(identity: str, crash: str | None) -> subprocess.CompletedProcess[str]:
            env = _no_crash_env()
            if crash:
                env[CRASH_ENV] = crash
            return subprocess.run(
                [sys.executable, str(CONTROLLER_PROC), store_target, str(tmp / "cluster"),
                 "--identity", identity, "--until-recovered", "1", "--until-jobs-done",
                 "--seconds", "55", "--ttl", "1.0"],
                capture_output=True, text=True, env=env, timeout=60,
            )  # fmt: skip

        first = controller("controller-a", point)
        assert first.returncode == -signal.SIGKILL, (
            f"the controller did not reach {point}: rc={first.returncode}\n"
            f"{first.stdout}\n{first.stderr[-2000:]}"
        )
        second = controller("controller-b", None)
        assert second.returncode == 0, f"{second.stdout}\n{second.stderr[-3000:]}"
        store = fleet.store
        world = _crash_world(store, fj.job_id, bad)
        [inc] = store.incidents.list_incidents(job_id=fj.job_id)
        world.action_keys = [a.key for a in fleet.cp.actions(inc.id)]
        assert all(a.state.value == "done" for a in fleet.cp.actions(inc.id))
        world.starts = [s["attempt"] for s in fleet.cluster.starts()]
        obs = fleet.cluster.observe()
        node = obs.nodes[bad.split("-")[1]]
        world.held_by_scheduler = bad not in node.quarantined_devices
        lease = fleet.cp.leader()
        world.lease = None if lease is None else (lease.holder, lease.token)
        return world
    finally:
        fleet.close()


# --- the procs cluster's cards, for run ------------------------------------------------------


def procs_inventory(nodes: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """The cards of serve's stand-in cluster (``Fleet``'s default nodes) as a ``run``
    inventory: the same hosts, uuids and PCI bus ids, so a plan that isolates a host
    names the same cards in both modes. Indices are unique across hosts, as run's are."""
    from trainguard.schedulers.procs import simulated_devices

    out: list[dict[str, Any]] = []
    for k, (node, count) in enumerate((nodes or {"n1": 2, "n2": 2}).items()):
        for d in simulated_devices(node, k, count):
            out.append(
                {"index": len(out), "uuid": d.uuid, "pci_bus_id": d.pci_bus_id, "host": d.host}
            )
    return out
