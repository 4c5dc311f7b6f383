"""Evidence: the attempt's output (progress lines, the tail), agents' findings, and
the attribution of a failure; the device statuses ``decide()`` sees, including the
cards that evidence names (decisions 0211, 0430).

Scheduler-specific evidence comes in as stored findings (Slurm's node events and
kernel logs) or through the traits the scheduler declares (its own requeue, one
shared output file: ``attempt_nodes``, ``seed_output``); no driver subclasses this.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from trainguard.controller.engine.config import (
    FINDING_BATCH,
    FINDING_BATCHES_PER_PASS,
    IDLE_EVIDENCE_MAX_AGE_S,
    _OutputState,
)
from trainguard.controller.engine.core import EngineCore, Part
from trainguard.diagnose.attribution import attribute, with_health_event, with_link_evidence
from trainguard.diagnose.detectors import (
    ProcessExit,
    ProgressLineParser,
    crash_finding,
    line_finding,
    rank_prefix,
)
from trainguard.diagnose.device_map import (
    merge_views,
    rank_views,
    reported_views,
    torchrun_world_size,
)
from trainguard.diagnose.signatures import Classifier
from trainguard.diagnose.training_health import (
    HealthEvent,
    LineHealth,
    health_finding,
    replica_event,
)
from trainguard.model.devices import normalize_pci_bus_id
from trainguard.model.files import open_regular
from trainguard.model.findings import Attribution, Culprit, Domain, Finding, Severity
from trainguard.model.health import HealthState
from trainguard.model.plan import DeviceStatus
from trainguard.model.records import AttemptRecord, JobRecord
from trainguard.model.replica import read_replica_line
from trainguard.policy.decide import evidence_resources
from trainguard.policy.evidence import Route, route_finding
from trainguard.policy.verify import (
    NO_STEP_SIGNAL_WARNING,
    no_step_signal_warning,
    no_step_signal_withdrawal,
    rank_limit,
)
from trainguard.schedulers.base import JobPhase, NodePhase, Observation, ObservedJob, ObservedNode
from trainguard.signals.output import is_annotation, is_train_message, split_lines

# How much of a shared output file identifies it (traits.shared_output).
HEAD_BYTES = 256
# An attempt's output is read to its end each time, in chunks, at most this much at once.
OUTPUT_CHUNK = 4 * 1024 * 1024
OUTPUT_CHUNKS_PER_READ = 16


def _started_after(observed: ObservedJob, att: AttemptRecord) -> bool:
    """Whether the scheduler's current attempt has started since ``att`` did."""
    return (
        observed.phase is not JobPhase.PENDING
        and observed.started_at is not None
        and observed.started_at > att.started_at
    )


def _down_not_drained(node: ObservedNode) -> bool:
    return node.phase is NodePhase.DOWN and "DRAIN" not in getattr(node, "flags", ())


class EvidenceFollower(Part):
    """Output following and failure evidence, with the caches that only save work."""

    def __init__(self, core: EngineCore) -> None:
        super().__init__(core)
        self.outputs: dict[tuple[str, int], _OutputState] = {}
        self._warned_no_step: set[str] = set()  # jobs told they have no progress signal
        self._no_step_withdrawn: set[str] = set()  # ... and shown wrong by a step since
        # Findings up to this id were read by an earlier pass (None: none yet); each pass
        # reads what is new once (PassContext.findings) for running attempts and idle cards.
        self._finding_cursor: int | None = None
        # Attempts whose whole evidence history was read once; later passes read the new.
        self.evidence_read: set[tuple[str, int]] = set()
        self._progress = ProgressLineParser(self.config.progress_pattern)
        # traits.requeues_by_itself: the nodes each attempt started on (attempt sync
        # records them).
        self.attempt_nodes: dict[tuple[str, int], tuple[str, ...]] = {}
        # traits.shared_output: what the file began with when an attempt's output was
        # seeded (a truncation on requeue changes it).
        self._heads: dict[tuple[str, int], bytes] = {}
        # Training health read from each attempt's output (a loss, a gradient norm, a
        # replica checksum line): its first event becomes its finding (0520, 0522).
        self._health: dict[tuple[str, int], LineHealth] = {}

    def follow_output(self, job_id: str, att: AttemptRecord, oj: ObservedJob, now: float) -> None:
        """Progress lines (``step=N``) in the attempt's output become attempt progress."""
        path = oj.output_path
        if not path or oj.attempt != att.number:
            return
        if self.traits.shared_output and not self._shared_output_start((job_id, att.number), path):
            return
        self._read_progress(job_id, att, path, now)

    def progress_up_to_now(
        self, job_id: str, att: AttemptRecord, observed: ObservedJob, now: float
    ) -> AttemptRecord:
        """The attempt as its output shows it now, read before its failure is judged.

        Level-based (issue 13): an incident's ``failed_step`` is the last step the job
        printed before the fault, so the output is read to its end first, not taken
        from the store as an earlier pass left it. ``observed`` is the scheduler's own
        view of the job: when it already moved past this attempt by itself (Slurm's
        requeue on NODE_FAIL) the one output file still ends with this attempt's lines
        only until the new attempt starts (it truncates or appends then), so only
        then is it read.
        """
        if observed.attempt == att.number:
            self.follow_output(job_id, att, observed, now)
        elif (
            observed.attempt > att.number
            and not _started_after(observed, att)
            and att.log_path
            and (job_id, att.number) in self.outputs  # where its output was read up to
        ):
            self._read_progress(job_id, att, att.log_path, now)
        return self.store.jobs.get_attempt(job_id, att.number)

    def _read_progress(self, job_id: str, att: AttemptRecord, path: str, now: float) -> None:
        """Read ``path`` from where this attempt's output was read up to, to its end
        (what it read is stamped ``now``: when the pass read it)."""
        state = self.outputs.setdefault((job_id, att.number), _OutputState())
        chunks: list[bytes] = []
        try:
            with open_regular(path) as f:
                if os.fstat(f.fileno()).st_size < state.offset:
                    return  # truncated since: what follows is not this attempt's
                f.seek(state.offset)
                # To the end (bounded): a chatty job must not leave its last steps for
                # a later pass, or a failure would be judged on old progress.
                for _ in range(OUTPUT_CHUNKS_PER_READ):
                    chunk = f.read(OUTPUT_CHUNK)
                    if not chunk:
                        break
                    chunks.append(chunk)
        except OSError:
            return
        chunk = b"".join(chunks)
        if not chunk:
            return
        state.offset += len(chunk)
        data = state.partial + chunk
        # Progress bars redraw with \r: split there too, or a bar's steps wait for its \n.
        lines, state.partial = split_lines(data)
        steps: list[int] = []
        timed: list[tuple[int, float, int]] = []  # (step, the job's time, rank)
        ranks: set[int] = set()  # ranks that named themselves on a step, as run counts them
        # A job that reports its steps itself: its output's "step 8" is a message's
        # ("injecting hang at step 8"), not a step it made (0397). Asked of the store
        # after the read: the report may have been taken by another process (serve's API),
        # and a report made before these lines were written is seen.
        reported = self.store.jobs.is_self_reported(job_id, att.number)
        job_lines = 0
        alive_lines = 0  # liveness readings (a bar, a logged loss): run's count (0393)
        health = self._health.setdefault((job_id, att.number), LineHealth())
        for raw in lines:
            text = raw.decode("utf-8", "replace")
            if health.event is None:
                replica = read_replica_line(text)
                if replica is not None:
                    self._health_event(job_id, att, health, replica_event(replica), now)
            if is_annotation(text) or is_train_message(text):
                continue
            job_lines += bool(text.strip())  # a blank line says nothing (run's rule)
            if reported:
                continue
            reading = self._progress.read(text)
            if reading is not None and health.event is None and reading.has_health:
                # A loss logged without a step (Trainer's dict) is the latest step's.
                step = (
                    reading.step if reading.step is not None else max(steps or [att.last_step or 0])
                )
                rank = reading.rank if reading.rank is not None else rank_prefix(text)
                event = health.observe(rank or 0, step, reading.loss, reading.grad_norm)
                if event is not None:
                    self._health_event(job_id, att, health, event, now)
            if reading is not None and reading.is_liveness:
                alive_lines += 1
            if reading is None or not reading.is_step or reading.step is None:
                continue
            steps.append(reading.step)
            rank = reading.rank if reading.rank is not None else rank_prefix(text)
            if rank is not None:
                ranks.add(rank)
            if reading.at is not None:
                timed.append((reading.step, reading.at, rank or 0))
        if ranks - {r.rank for r in att.rank_reports}:
            # Verification expects every rank that reported before to report again (0350);
            # only ranks of the job's world are kept (0405): a line's "[rank123456]:" is not.
            limit = rank_limit(
                torchrun_world_size(self.store.jobs.get_job(job_id).command), self.config.max_ranks
            )
            self.store.jobs.note_ranks_reported(job_id, att.number, {r for r in ranks if r < limit})
        if job_lines and state.first_at is None:
            state.first_at = now
        if alive_lines and state.alive_at is None:
            state.alive_at = now
        if alive_lines:
            # Liveness of a job with no step signal is what the progress reader calls
            # a sign of life, not any line: a framework's start-up banner is not a
            # running job (run's rule), or a restart that starts over would be verified
            # before its first checkpoint showed where it resumed.
            state.lines += alive_lines
            state.last_at = now
        if job_id in self._warned_no_step:
            seen = steps[0] if steps else self.store.jobs.get_attempt(job_id, att.number).first_step
            if seen is not None:
                self._withdraw_no_step_signal(job_id, seen, att.number, now)
        if not steps:
            if job_lines and att.first_step is None:
                self._warn_no_step_signal(job_id, att, state, now)
            return
        if att.first_step is None:
            self.store.jobs.update_attempt_progress(job_id, att.number, steps[0], at=now)
        last = max(steps)
        if att.last_step is None or last > att.last_step or len(steps) > 1:
            self.store.jobs.update_attempt_progress(job_id, att.number, last, at=now)
        # Steps the job stamped itself: the rate verification may compare (0320). This
        # pass read them all at ``now``; their own times say when they were made.
        # The store keeps a rank's first and highest: per rank, those two are enough.
        ends: dict[int, list[tuple[int, float]]] = {}
        for step, at, rank in timed:
            first_last = ends.setdefault(rank, [(step, at), (step, at)])
            if step > first_last[1][0]:
                first_last[1] = (step, at)
        for rank, first_last in ends.items():
            for step, at in dict.fromkeys(first_last):
                self.store.jobs.record_job_step_time(job_id, att.number, step, time=at, rank=rank)

    def _health_event(
        self, job_id: str, att: AttemptRecord, health: LineHealth, event: HealthEvent, now: float
    ) -> None:
        """An attempt's first health event in its output, kept as its finding: the next
        pass reads it and fails the attempt (policy.evidence, 0520)."""
        health.event = event
        f = health_finding(event, now, source="output")
        self.fleet.findings.add_finding(
            f.to_dict(), received_at=now, host=None, job_id=job_id, attempt=att.number
        )

    def _warn_no_step_signal(
        self, job_id: str, att: AttemptRecord, state: _OutputState, now: float
    ) -> None:
        """The first attempt has shown liveness for a verification window and not one
        step, well after its output began (policy.verify.no_step_signal_warning, the rule
        run uses): said once per job, as a note in the job's audit that its incidents
        carry as a warning, until a step withdraws it."""
        if job_id in self._warned_no_step or job_id in self._no_step_withdrawn:
            return
        fj = self.core.fleet_job_or_none(job_id)
        if fj is None:
            return
        text = no_step_signal_warning(
            attempt=att.number,
            step_signal=False,
            first_output_at=state.first_at,
            first_alive_at=state.alive_at,
            start_window_seconds=self.config.no_step_start_window,
            now=now,
            window_seconds=self.core.policy(
                fj, self.store.jobs.get_job(job_id)
            ).verify_window_seconds,
        )
        if text is None:
            return
        self._warned_no_step.add(job_id)
        self.core.warn_job(job_id, text, now)

    def note_warned_no_step(self, job_id: str) -> None:
        """The job was told it shows no step (a restart verified by liveness): a step
        seen from now on withdraws it, as it withdraws the follower's own warning."""
        self._warned_no_step.add(job_id)
        self._no_step_withdrawn.discard(job_id)

    def _withdraw_no_step_signal(self, job_id: str, step: int, attempt: int, now: float) -> None:
        """A step was seen: the warning that the job shows none is withdrawn (0534)."""
        self._warned_no_step.discard(job_id)
        self._no_step_withdrawn.add(job_id)
        self.core.withdraw_job_warning(
            job_id, NO_STEP_SIGNAL_WARNING, no_step_signal_withdrawal(step, attempt), now
        )

    def output_tail(self, path: str | None) -> list[str]:
        """The last lines of a job's output (its own header left out)."""
        return self._tail(path)

    def _tail(self, path: str | None) -> list[str]:
        if not path:
            return []
        try:
            with open_regular(path) as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - 256 * 1024))
                data = f.read()
        except OSError:
            return []
        lines = data.decode("utf-8", "replace").splitlines()
        # The log's header names the command: its arguments are not the job's output.
        return [line for line in lines if not is_annotation(line)][-self.config.tail_lines :]

    def _hosts(self, job_id: str, att: AttemptRecord) -> set[str]:
        """The hosts whose fatal node findings fail the attempt (with the nodes it started
        on, where the scheduler moves jobs by itself)."""
        return {d.host for d in att.devices} | set(self.attempt_nodes.get((job_id, att.number), ()))

    def _node_list(self, job_id: str, att: AttemptRecord, oj: ObservedJob) -> list[str]:
        # The nodes the attempt started on when known (a requeue moves the job).
        return list(self.attempt_nodes.get((job_id, att.number)) or oj.nodes)

    def seed_output(self, job_id: str, oj: ObservedJob) -> None:
        """traits.shared_output, before a new attempt writes: remember where its output will
        begin (the end of the file in append mode) and what the file begins with
        (truncation changes it)."""
        key = (job_id, oj.attempt)
        path = oj.output_path
        if key in self.outputs or not path or oj.attempt == 0:
            return
        if oj.phase is not JobPhase.PENDING:
            prev = self.outputs.get((job_id, oj.attempt - 1))
            if prev is None:
                return
            offset = prev.offset
        else:
            try:
                offset = os.stat(path).st_size
            except OSError:
                return
        if offset <= 0:
            return
        try:
            with open_regular(path) as f:
                head = f.read(min(HEAD_BYTES, offset))
        except OSError:
            return
        self.outputs[key] = _OutputState(offset=offset)
        self._heads[key] = head

    def _shared_output_start(self, key: tuple[str, int], path: str) -> bool:
        """Where a seeded attempt's output starts in a shared file: at 0 when the file was
        truncated for it, after the earlier attempts' when appended. False: unreadable."""
        head = self._heads.get(key)
        state = self.outputs.get(key)
        if head is None or state is None:
            return True
        try:
            size = os.stat(path).st_size
            with open_regular(path) as f:
                now_head = f.read(len(head))
        except OSError:
            return False
        if size < state.offset or now_head != head:
            # Truncated for this attempt: its output starts at 0.
            state.offset, state.partial = 0, b""
            del self._heads[key]
        elif size > state.offset:
            del self._heads[key]  # appending: the new attempt's output follows
        return True

    def read_new_findings(self, now: float) -> list[dict[str, Any]]:
        """The findings stored since the last pass (by id: a late delivery counts too)."""
        if self._finding_cursor is None:
            # First pass (or a restart): what can still matter; each attempt's own
            # history is read in full once by _new_fatal_evidence.
            rows = self.fleet.findings.findings_between(now - IDLE_EVIDENCE_MAX_AGE_S, now + 1.0)
            self._finding_cursor = max((int(r["id"]) for r in rows), default=0)
            return rows
        out: list[dict[str, Any]] = []
        for _ in range(FINDING_BATCHES_PER_PASS):
            rows = self.fleet.findings.findings_after(self._finding_cursor, FINDING_BATCH)
            if rows:
                self._finding_cursor = max(int(r["id"]) for r in rows)
            out += rows
            if len(rows) < FINDING_BATCH:
                break
        return out

    def new_fatal_evidence(
        self, job_id: str, att: AttemptRecord, now: float, new: Sequence[Mapping[str, Any]]
    ) -> list[Finding]:
        """:meth:`fatal_evidence` over this pass's new findings; over the attempt's whole
        history the first time this controller sees the attempt. ``new``: the pass's new
        findings (``PassContext.findings``)."""
        key = (job_id, att.number)
        if key not in self.evidence_read:
            self.evidence_read.add(key)
            return self.fatal_evidence(job_id, att, now)
        return self.fatal_evidence(job_id, att, now, rows=new)

    def fatal_evidence(
        self,
        job_id: str,
        att: AttemptRecord,
        until: float,
        rows: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[Finding]:
        """Findings since the attempt started that fail it now (``Route.RECOVER``):
        fatal hardware faults on its GPUs, fatal node faults on its hosts, its own
        training-health events; oldest first.
        ``rows``: judge these stored findings instead of reading the attempt's."""
        uuids = {d.uuid for d in att.devices}
        host_of = {d.uuid: d.host for d in att.devices}
        # A finding ingested before the inventory knew the card names it by PCI bus id
        # on its host: resolve it against the attempt's own devices.
        by_pci: dict[tuple[str | None, str], str] = {
            (d.host, d.pci_bus_id): d.uuid for d in att.devices
        }
        hosts = self._hosts(job_id, att)
        out: list[Finding] = []
        if rows is None:
            rows = self.fleet.findings.findings_between(att.started_at, until + 1.0)
        for row in rows:
            try:
                f = Finding.from_dict(row["finding"])
            except (KeyError, TypeError, ValueError):
                continue
            if f.at < att.started_at:
                continue
            host = row.get("host") or f.culprit.host
            uuid = row.get("device_uuid") or f.culprit.device_uuid
            if uuid is not None and host is not None and host_of.get(uuid, host) != host:
                # One host's word about a card of another host (a uuid it named before
                # that host's inventory listed it): never this attempt's evidence (0402).
                continue
            if uuid is None and f.culprit.pci_bus_id:
                try:
                    uuid = by_pci.get((host, normalize_pci_bus_id(f.culprit.pci_bus_id)))
                except ValueError:
                    uuid = None
            route = route_finding(
                f,
                attempt_devices=uuids,
                attempt_hosts=hosts,
                device_uuid=uuid,
                host=host,
                own=row.get("job_id") == job_id and row.get("attempt") == att.number,
            )
            if route is Route.RECOVER:
                out.append(f)
        return sorted(out, key=lambda f: f.at)

    def failed_view(
        self, oj: ObservedJob, att: AttemptRecord, job_id: str, evidence: list[Finding]
    ) -> ObservedJob:
        """The observation as it will be once the attempt is over: failed at the first
        evidence, the node the evidence names first (it is the attribution's culprit)."""
        first = evidence[0]
        bad = first.culprit.host
        hosts = self._node_list(job_id, att, oj)
        if bad and bad in hosts:
            hosts = [bad] + [h for h in hosts if h != bad]
        where = f" on {bad}" if bad else ""
        return dataclasses.replace(
            oj,
            phase=JobPhase.FAILED,
            attempt=att.number,
            nodes=tuple(hosts),
            ended_at=first.at,
            exit_code=None,
            signal=None,
            reason=f"{first.kind}{where}: {first.message}"[:300],
            output_path=att.log_path or oj.output_path,
        )

    def stored_hang(self, job_id: str, att: AttemptRecord, now: float) -> Finding | None:
        """The hang that ended ``att``, as its detector worded it (kept by
        ``_attempt_failed``); ``None`` when it did not hang."""
        until = (att.ended_at if att.ended_at is not None else now) + 1.0
        for row in self.fleet.findings.findings_between(att.started_at, until, job_id=job_id):
            if row.get("attempt") == att.number and row.get("kind") == "hang":
                return Finding.from_dict(row["finding"])
        return None

    def failure_attribution(
        self,
        job: JobRecord,
        att: AttemptRecord,
        oj: ObservedJob | None,
        now: float,
        *,
        hang: Finding | None = None,
    ) -> Attribution:
        """Everything known about why one attempt failed, attributed (diagnose.attribution).
        ``hang``: the hang detector's finding (the same words as run's, 0376), when a
        hang ended it; then the job's exit status is not asked for. ``now``: the pass's
        time (when no exit time is known, the failure is dated then)."""
        devices = att.devices
        findings: list[Finding] = []
        failed_at = now
        tail = self._tail(att.log_path or (oj.output_path if oj else None))
        if hang is not None:
            findings.append(hang)
        elif oj is not None:
            failed_at = oj.ended_at or now
            # A scheduler that watches ranks names the one whose death failed the
            # attempt: the crash's culprit and its card, as run attributes it.
            ranked = oj.failed_rank is not None or oj.failed_local_rank is not None
            exit_finding = crash_finding(
                ProcessExit(
                    at=failed_at,
                    source="rank" if ranked else "launcher",
                    rank=oj.failed_rank,
                    local_rank=oj.failed_local_rank,
                    pid=oj.failed_pid,
                    exit_code=oj.exit_code,
                    signal=oj.signal,
                    tail=tuple(tail[-20:]),
                ),
                devices,
            )
            if exit_finding is None and oj.phase is JobPhase.FAILED:
                exit_finding = Finding(
                    kind="crash",
                    domain=Domain.NODE
                    if oj.reason and "node" in oj.reason.lower()
                    else Domain.UNKNOWN,
                    at=failed_at,
                    source="scheduler",
                    message=oj.reason or "the scheduler reports the job failed",
                    severity=Severity.FATAL,
                    culprit=Culprit(host=oj.nodes[0] if oj.nodes else None),
                    signature=f"scheduler:{oj.reason or 'failed'}",
                )
            if exit_finding is not None:
                findings.append(exit_finding)
        # The attempt's hosts only: an output line's PCI bus id names a card of the host
        # that printed it (bus ids repeat across hosts), and it is not a fleet-wide read.
        hosts = {d.host for d in devices} | set(oj.nodes if oj is not None else ())
        inventory = [
            r.device for h in sorted(hosts) for r in self.store.devices.list_devices(host=h)
        ]
        if tail:
            # The streaming classifier: it sees whole tracebacks, not just single lines.
            for match in Classifier().feed("\n".join(tail) + "\n"):
                line = match.text or ""
                if match.lineno is not None and 0 < match.lineno <= len(tail):
                    line = tail[match.lineno - 1]
                findings.append(line_finding(match, line, failed_at, "output", devices, inventory))
        hosts = {d.host for d in devices}
        uuids = {d.uuid for d in devices}
        window = self.config.correlation_window
        for row in self.fleet.findings.findings_between(
            att.started_at - window, failed_at + window
        ):
            if not (
                row["job_id"] == job.id
                or row["device_uuid"] in uuids
                or (row["host"] in hosts and row["device_uuid"] is None)
            ):
                continue
            if row["job_id"] == job.id and row.get("attempt") not in (None, att.number):
                continue  # reported for another attempt of the job: not this failure's
            try:
                findings.append(Finding.from_dict(row["finding"]))
            except (KeyError, TypeError, ValueError):
                continue
        # The job's device map: a device's culprit rank is the rank that had it (issue 13).
        # The ranks' own reports first (any launcher, 0322), then the command line's.
        views = merge_views(
            reported_views(att.rank_reports, devices),
            rank_views(devices, torchrun_world_size(job.command)),
        )
        attribution = with_health_event(
            attribute(findings, devices, failed_at, window, views), findings, devices, views
        )
        # Link/NIC evidence isolates its host whatever won the attribution, as in run (0353).
        return with_link_evidence(attribution, findings, failed_at, window)

    def device_statuses(self, obs: Observation, job_ref: str) -> tuple[DeviceStatus, ...]:
        """The devices this job could get: all but those other live jobs hold.

        traits.down_nodes_return: a node that is DOWN but not drained is not out of
        service yet (it may come back by itself): the evidence against it must still
        be able to quarantine it, so the policy sees its devices with their stored
        health.
        """
        busy = {
            d.uuid
            for ref, oj in obs.jobs.items()
            if ref != job_ref and oj.phase in (JobPhase.RUNNING, JobPhase.PENDING)
            for d in oj.devices
        }
        drained = {
            n.name
            for n in obs.nodes.values()
            if n.phase is not NodePhase.UP
            and not (self.traits.down_nodes_return and _down_not_drained(n))
        }
        # The stored node health too: a node quarantined in this pass is drained after
        # the pass observed the cluster, and a re-plan in the same pass (waiting for
        # capacity) must not hand its cards back to the job (the store is written first).
        drained |= set(self.fleet.nodes.unschedulable_nodes())
        out = []
        for rec in self.store.devices.list_devices():
            if rec.uuid in busy:
                continue
            state = rec.state
            if rec.device.host in drained and state.schedulable:
                state = HealthState.QUARANTINED  # the node is out: so are its devices
            out.append(DeviceStatus(rec.device, state, rec.reason))
        return tuple(out)

    def held_evidence(
        self,
        obs: Observation,
        job_ref: str,
        attribution: Attribution,
        failed: AttemptRecord | None,
        listed: tuple[DeviceStatus, ...],
        isolated: tuple[str, ...],
    ) -> tuple[DeviceStatus, ...]:
        """Devices the failure's evidence names that another job holds by now (0120).

        :meth:`_device_statuses` leaves out what other live jobs hold: those are not
        this job's to get. But once a job dies its cards are free, and the scheduler
        may hand the bad one to another job (a restart, a queued job) before the
        incident is planned; decide() resolves evidence only against the devices it
        is given, so it would not isolate the card at all. Such devices are added
        with their health: hardware evidence on a card of the failed attempt, and the
        devices of a host named by node evidence or by network evidence that names a
        link or NIC. decide() excludes whatever it isolates from the restart, so they
        never count as capacity — except what this incident already isolated (it is
        skipped there without being excluded), which is therefore not added.
        """
        # decide()'s own rule for what the evidence isolates (one definition, 0130).
        named_uuids, named_hosts = evidence_resources(attribution, failed.devices if failed else ())
        uuids, hosts = set(named_uuids), set(named_hosts)
        out = set(isolated)
        uuids -= out
        hosts -= out
        present = {s.device.uuid for s in listed}
        if not (uuids - present) and not hosts:
            return ()
        everyone = self.device_statuses(Observation(at=obs.at, jobs={}, nodes=obs.nodes), job_ref)
        return tuple(
            s
            for s in everyone
            if s.device.uuid not in present and (s.device.uuid in uuids or s.device.host in hosts)
        )
