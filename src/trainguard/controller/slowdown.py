"""Slow ranks as an evidence source: the straggler detector and its cost model, fed the
progress datagrams (decisions 0525-0527).

:class:`SlowdownSource` is handed every progress event the listener receives (from
its thread, :meth:`SlowdownSource.push`); at each poll it feeds them to one
:class:`~trainguard.diagnose.slowdown.SlowdownWatch` per attempt and turns what the
watch finds into findings the runtime records through the control plane, like a
kernel-log line:

* a **straggler** whose card is known (the ranks' own device reports, 0322) is
  weighed by :func:`~trainguard.policy.slow_cost.weigh_slowdown`: when running on
  slowly costs more than a restart, the finding is a fatal hardware fault on that
  card, so the engine's one path for a bad card (policy/evidence.py: recover now)
  quarantines it and restarts without it; observe mode, approvals and the breaker
  apply as for any quarantine. Otherwise it is a warning: recorded, alerted on, no
  action. The decision and its numbers are in the finding's details either way;
* a **throughput drop** of the whole job is a warning with its evidence (it names no
  card to take out).

A job that sends no progress datagrams is timed from its output instead (the attempt's
:class:`~trainguard.signals.output.OutputLine` events): each step line (the one reader,
diagnose/progress_lines.py) of a rank (its ``[rankN]:`` prefix, a JSON record's
``rank``; else rank 0) gives that rank's time per step since its previous step line
(``step_samples``). An attempt's own reports outrank its output (0397): once a datagram
arrived, its output is not timed.

Explaining evidence (a card's throttle reasons, temperature, power) is attached where
a metrics reader gives some (``explain``).
"""

from __future__ import annotations

import dataclasses
import queue
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trainguard.controller.sources import Evidence, FindingEvidence
from trainguard.diagnose.detectors import rank_prefix, rank_using
from trainguard.diagnose.device_map import reported_views
from trainguard.diagnose.progress_lines import ProgressLineParser
from trainguard.diagnose.slowdown import (
    SlowdownRules,
    SlowdownWatch,
    StepSample,
    step_samples,
)
from trainguard.diagnose.training import RankPlace
from trainguard.model.devices import Device
from trainguard.model.findings import Domain, Finding, Severity
from trainguard.model.records import RankReport
from trainguard.policy.slow_cost import (
    SlowInputs,
    remaining_seconds,
    restart_cost,
    weigh_slowdown,
)
from trainguard.signals.output import OutputLine


def _number(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if f == f and f not in (float("inf"), float("-inf")) else None


class _Attempt:
    """One attempt's watch and what the cost model needs of it."""

    def __init__(self, rules: SlowdownRules, pattern: str | None) -> None:
        self.watch = SlowdownWatch(rules)
        self.reported = False  # a progress datagram arrived: its output is not timed
        self.parser = ProgressLineParser(pattern)
        self.last_line: dict[int, tuple[int, float]] = {}  # rank -> (step, time) printed
        self.step = 0
        self.total_steps: int | None = None
        self.last_save: float | None = None  # wall time of the newest checkpoint saved
        self.started: float | None = None


class SlowdownSource:
    """See the module docstring. ``job_id()``: the job the events are of;
    ``devices``: the machine's cards; ``reports(attempt)``: the ranks' device
    reports; ``restarts()``: this job's measured restart costs (seconds);
    ``explain(uuid)``: evidence about a card (a throttle reason, a temperature);
    ``until_stop(now)``: seconds to the job's next planned stop (a time limit);
    ``tell``: sees each finding made (the user's line)."""

    name = "slow ranks"

    def __init__(
        self,
        job_id: Callable[[], str],
        devices: Callable[[], Sequence[Device]],
        reports: Callable[[int], Sequence[RankReport]],
        *,
        restarts: Callable[[], Sequence[float]] = lambda: (),
        explain: Callable[[str], Mapping[str, Any]] | None = None,
        rules: SlowdownRules | None = None,
        until_stop: Callable[[float], float | None] = lambda now: None,
        interval: float | None = 1.0,
        tell: Callable[[Finding], None] | None = None,
        progress_pattern: str | None = None,
    ) -> None:
        self.interval = interval
        self.job_id = job_id
        self.devices = devices
        self.reports = reports
        self.restarts = restarts
        self.explain = explain
        self.rules = rules or SlowdownRules()
        self.until_stop = until_stop
        self.tell = tell
        self.progress_pattern = progress_pattern
        self._items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._attempts: dict[int, _Attempt] = {}
        self.findings: list[Finding] = []  # every one made, for the driver to tell
        self.closed = False

    def push(self, item: Any) -> None:
        """A :class:`~trainguard.signals.progress.ProgressReceived` or an
        :class:`~trainguard.signals.output.OutputLine` (any thread)."""
        if not self.closed:
            self._items.put(item)

    def _attempt(self, number: int, at: float) -> _Attempt:
        att = self._attempts.get(number)
        if att is None:
            att = self._attempts[number] = _Attempt(self.rules, self.progress_pattern)
        if att.started is None:
            att.started = at
        return att

    def _feed_line(self, line: OutputLine) -> int | None:
        """A step line of a job that reports nothing itself (module docstring)."""
        att = self._attempt(line.attempt, line.at)
        if att.reported:
            return None
        reading = att.parser.read(line.text)
        if reading is None or not reading.is_step or reading.step is None:
            return None
        rank = reading.rank if reading.rank is not None else rank_prefix(line.text)
        rank = rank or 0
        at = reading.at if reading.at is not None else line.at
        prev = att.last_line.get(rank)
        att.last_line[rank] = (reading.step, at)
        att.step = max(att.step, reading.step)
        if reading.total:
            att.total_steps = reading.total
        if prev is None:
            return None
        for sample in step_samples(rank, [prev, (reading.step, at)]):
            att.watch.add(sample)
        return line.attempt

    def _feed(self, received: Any) -> int | None:
        if isinstance(received, OutputLine):
            return self._feed_line(received)
        ev = received.event
        if ev.attempt is None:
            return None
        att = self._attempt(ev.attempt, received.at)
        if not att.reported:
            # The job's own reports from now on; what its output gave so far goes.
            att.reported = True
            att.watch = SlowdownWatch(self.rules)
        if ev.event == "checkpoint_saved":
            stall = max(
                _number(ev.metrics.get("stall_seconds")) or 0.0,
                _number(ev.metrics.get("save_seconds")) or 0.0,
            )
            att.watch.add_save(ev.time, stall)
            att.last_save = received.at
            return ev.attempt
        if ev.event != "progress":
            return None
        att.step = max(att.step, ev.step)
        total = _number(ev.metrics.get("total_steps"))
        if total is not None and total > 0:
            att.total_steps = int(total)
        seconds = _number(ev.metrics.get("work_seconds"))
        if seconds is None:
            seconds = _number(ev.metrics.get("step_seconds"))
        if seconds is not None:
            att.watch.add(StepSample(ev.rank, ev.step, ev.time, seconds))
        return ev.attempt

    def poll(self, now: float) -> list[Evidence]:
        fed: set[int] = set()
        while True:
            try:
                item = self._items.get_nowait()
            except queue.Empty:
                break
            number = self._feed(item)
            if number is not None:
                fed.add(number)
        out: list[Evidence] = []
        for number in sorted(fed):
            att = self._attempts[number]
            self._place(number, att)
            for f in att.watch.check():
                f = self._act_on(f, att, now)
                self.findings.append(f)
                if self.tell is not None:
                    self.tell(f)
                out.append(FindingEvidence(f, f.culprit.host))
        for number in [n for n in self._attempts if n < max(self._attempts) - 1]:
            del self._attempts[number]  # an attempt two restarts back sends nothing more
        return out

    def _place(self, number: int, att: _Attempt) -> None:
        devices = list(self.devices())
        views = reported_views(list(self.reports(number)), devices)
        for d in devices:
            known, rank = rank_using(views, d)
            if known and rank is not None:
                att.watch.place(rank, RankPlace(d.host, d.pci_bus_id, d.uuid))

    def _act_on(self, f: Finding, att: _Attempt, now: float) -> Finding:
        """The finding as recorded: dated now (the engine's clock), weighed by the cost
        model when it names a rank, with the evidence that explains it."""
        details: dict[str, Any] = {**f.details, "job_id": self.job_id()}
        uuid = f.culprit.device_uuid
        if uuid and self.explain is not None:
            details["explained_by"] = dict(self.explain(uuid))
        if f.kind != "straggler":
            return dataclasses.replace(f, at=now, details=details)
        slowdown = _number(details.get("slowdown")) or 1.0
        pace = _number(details.get("step_seconds"))
        left = remaining_seconds(att.step, att.total_steps, pace, self.until_stop(now))
        verdict = weigh_slowdown(
            SlowInputs(
                slowdown=slowdown,
                remaining_s=left,
                restart_s=restart_cost(list(self.restarts())),
                since_checkpoint_s=now - (att.last_save or att.started or now),
                gpus=max(1, att.watch.ranks),
            )
        )
        details.update(verdict.numbers())
        act = verdict.restart and uuid is not None
        if verdict.restart and uuid is None:
            details["decision"] = "alert"
            details["cost_reason"] = verdict.reason + "; but no card is known for the rank"
        message = f"{f.message} ({slowdown:.2f}× slower); {details['cost_reason']}"
        return dataclasses.replace(
            f,
            at=now,
            message=message,
            evidence=(message,),
            severity=Severity.FATAL if act else Severity.WARNING,
            domain=Domain.HARDWARE if act else f.domain,
            details={**details, "action": "quarantine" if act else "investigate"},
        )

    def close(self) -> None:
        self.closed = True


__all__ = ["SlowdownSource"]
