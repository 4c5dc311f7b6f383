"""The resume request: which checkpoint a requeued job should restore (decision 0103).

A scheduler that cannot change a job's environment between attempts (Slurm
requeues the same batch script with the same environment) tells the job through
a small file next to its checkpoints, ``<checkpoint root>/.trainguard-resume.json``,
written atomically *before* the requeue:

    {"format": "trainguard-resume", "version": 1, "checkpoint": "/ck/step_00000040",
     "step": 40, "job": "1234", "attempt": 2, "written_at": 1712345678.9,
     "incident": 7, "env": {}}

``trainguard.train.resume`` reads it when ``TRAINGUARD_RESUME_FROM`` is unset and
honours it only for the attempt it names (``attempt`` equals the job's
``TRAINGUARD_ATTEMPT``, else ``SLURM_RESTART_COUNT``) and, when both are known, the
same job id (``SLURM_JOB_ID``): a stale request left over from an earlier
recovery never sends a later attempt back to an old checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

RESUME_REQUEST_NAME = ".trainguard-resume.json"
RESUME_REQUEST_FORMAT = "trainguard-resume"
RESUME_REQUEST_VERSION = 1


@dataclass(frozen=True)
class ResumeRequest:
    checkpoint: str  # absolute path of the checkpoint directory to restore
    attempt: int  # the attempt (Slurm: restart count) this request is for
    job: str | None = None  # the scheduler's job id, when known
    step: int | None = None
    written_at: float | None = None
    incident: int | None = None
    env: dict[str, str] = field(default_factory=dict)  # extra environment the plan wanted

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": RESUME_REQUEST_FORMAT,
                "version": RESUME_REQUEST_VERSION,
                "checkpoint": self.checkpoint,
                "step": self.step,
                "job": self.job,
                "attempt": self.attempt,
                "written_at": self.written_at,
                "incident": self.incident,
                "env": dict(self.env),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> ResumeRequest:
        """Raises ``ValueError`` for anything but a well-formed request."""
        try:
            data: Any = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON: {exc}") from exc
        if not isinstance(data, dict) or data.get("format") != RESUME_REQUEST_FORMAT:
            raise ValueError("not a trainguard resume request")
        if data.get("version") != RESUME_REQUEST_VERSION:
            raise ValueError(f"unsupported resume request version {data.get('version')!r}")
        checkpoint, attempt = data.get("checkpoint"), data.get("attempt")
        if not isinstance(checkpoint, str) or not checkpoint:
            raise ValueError("resume request without a checkpoint")
        if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 0:
            raise ValueError("resume request without a valid attempt")
        step = data.get("step")
        job = data.get("job")
        env = data.get("env") or {}
        return cls(
            checkpoint=checkpoint,
            attempt=attempt,
            job=None if job is None else str(job),
            step=int(step) if isinstance(step, int) and not isinstance(step, bool) else None,
            written_at=float(data["written_at"])
            if isinstance(data.get("written_at"), int | float)
            else None,
            incident=int(data["incident"]) if isinstance(data.get("incident"), int) else None,
            env={str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {},
        )

    def applies_to(self, attempt: int | None, job: str | None) -> bool:
        """Whether this request is for the attempt (and job) asking."""
        if attempt is None or attempt != self.attempt:
            return False
        return not (self.job is not None and job is not None and self.job != job)


__all__ = [
    "RESUME_REQUEST_FORMAT",
    "RESUME_REQUEST_NAME",
    "RESUME_REQUEST_VERSION",
    "ResumeRequest",
]
