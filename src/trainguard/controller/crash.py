"""The crash points of a recovery, one vocabulary for every mode (test hooks, 0083, 0325).

``TRAINGUARD_TEST_CRASH_AT=<point>[#N]`` SIGKILLs the process the N-th time (default
the 1st) it reaches ``<point>``; ``TRAINGUARD_TEST_PAUSE_AT`` SIGSTOPs it instead (a
leader frozen mid-action, for the fencing test). ``trainguard serve``'s engine and
``trainguard run`` hit the same names where they mean the same moment of a recovery,
so tests/scenarios/test_crash_points.py kills both at the same points and asserts
one world. The per-action points count actions in plan order: ``#1`` is the plan's
first action (a quarantine), ``#2`` its second (the restart).
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "TRAINGUARD_TEST_CRASH_AT"
PAUSE_ENV = "TRAINGUARD_TEST_PAUSE_AT"
# Every point, in the order a recovery passes them.
CRASH_POINTS = (
    "detect.after_incident_opened",  # the incident row exists, no plan yet
    "plan.after_recorded",  # the plan is durable, nothing done
    "act.after_acting",  # the incident is "acting", no action begun
    "action.after_intent",  # an action's intent is ledgered, the call not made
    "action.after_apply",  # the call (scheduler, device health) is made, its result not recorded
    "action.after_result",  # the action's result is recorded
    "verify.before_recovered",  # the restart verified, the incident not closed yet
    "verify.after_recovered",  # the incident closed recovered
    # A dead run's job taken over by the next run (controller/engine/adoption.py):
    "adopt.after_stop",  # its leftover processes stopped, intent and result recorded
    "adopt.after_replay",  # its lost restart carried out again, the attempt not yet seen
    "adopt.after_resume",  # its attempt that nothing failed started again
)


class CrashPoints:
    """The test hooks of one controller process (see the module docstring).

    ``strict``: an unknown point name is an error (serve's engine). ``trainguard
    run`` is lenient, because the same variable also carries the training library's
    own phases (``after_shard_write@1``) into the job it supervises."""

    def __init__(
        self, spec: str | None = None, pause: str | None = None, *, strict: bool = True
    ) -> None:
        self.strict = strict
        self.kill_at = self._parse(CRASH_ENV, os.environ.get(CRASH_ENV) if spec is None else spec)
        self.pause_at = self._parse(
            PAUSE_ENV, os.environ.get(PAUSE_ENV) if pause is None else pause
        )
        self.seen: dict[str, int] = {}

    def _parse(self, env: str, spec: str | None) -> tuple[str, int] | None:
        if not spec:
            return None
        name, _, nth = spec.partition("#")
        if name not in CRASH_POINTS:
            if not self.strict:
                return None
            raise ValueError(f"{env}: unknown point {name!r} (one of {', '.join(CRASH_POINTS)})")
        return name, int(nth or "1")

    def hit(self, name: str) -> None:
        if self.kill_at is None and self.pause_at is None:
            return
        self.seen[name] = self.seen.get(name, 0) + 1
        if self.kill_at == (name, self.seen[name]):
            os.kill(os.getpid(), signal.SIGKILL)
        if self.pause_at == (name, self.seen[name]):
            os.kill(os.getpid(), signal.SIGSTOP)


__all__ = ["CRASH_ENV", "CRASH_POINTS", "PAUSE_ENV", "CrashPoints"]
