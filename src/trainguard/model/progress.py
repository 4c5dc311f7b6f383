"""Progress events sent by a training job to whoever supervises it.

Wire format (one JSON object per message, UTF-8)::

    {"v": 1, "event": "progress", "step": 120, "rank": 0, "attempt": 1,
     "time": 1764400000.1, "pid": 4242, "loss": 2.31, "metrics": {...}}

``event`` is ``progress`` (a step completed), ``resumed`` (state restored from
``checkpoint`` at ``step``; ``step`` 0 and no checkpoint for a fresh start) or
``checkpoint_saved`` (a checkpoint at ``step`` became valid; ``save_seconds``
and ``stall_seconds`` in ``metrics``).

Optional, present when the sender knows them (decision 0322): ``local_rank``
(``LOCAL_RANK``), ``visible_devices`` (``CUDA_VISIBLE_DEVICES`` as given) and ``host``
(``SLURMD_NODENAME``, else the host name): the rank's own view of its devices, the
job's device map for any launcher. Readers that predate them ignore them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

PROGRESS_WIRE_VERSION = 1
EVENTS = frozenset({"progress", "resumed", "checkpoint_saved"})


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    return value[:1024]


@dataclass(frozen=True)
class ProgressEvent:
    event: str
    step: int
    time: float
    rank: int = 0
    attempt: int | None = None
    pid: int | None = None
    loss: float | None = None
    checkpoint: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    local_rank: int | None = None
    visible_devices: str | None = None
    host: str | None = None

    def to_json(self) -> str:
        loss = self.loss
        if loss is not None and not math.isfinite(loss):
            # JSON has no NaN; the string keeps the information for NaN-loss detection.
            loss_out: Any = str(loss)
        else:
            loss_out = loss
        doc: dict[str, Any] = {
            "v": PROGRESS_WIRE_VERSION,
            "event": self.event,
            "step": self.step,
            "time": self.time,
            "rank": self.rank,
            "attempt": self.attempt,
            "pid": self.pid,
            "loss": loss_out,
            "checkpoint": self.checkpoint,
            "metrics": self.metrics,
        }
        for key in ("local_rank", "visible_devices", "host"):
            if getattr(self, key) is not None:
                doc[key] = getattr(self, key)
        return json.dumps(doc, separators=(",", ":"), default=str)

    @classmethod
    def from_json(cls, text: str | bytes) -> ProgressEvent:
        """Parse one message; raises ``ValueError`` for anything malformed."""
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"progress message is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError("progress message is not a JSON object")
        event = data.get("event", "progress")
        if event not in EVENTS:
            raise ValueError(f"unknown progress event {event!r}")
        try:
            loss_raw = data.get("loss")
            return cls(
                event=event,
                step=int(data["step"]),
                time=float(data["time"]),
                rank=int(data.get("rank") or 0),
                attempt=None if data.get("attempt") is None else int(data["attempt"]),
                pid=None if data.get("pid") is None else int(data["pid"]),
                loss=None if loss_raw is None else float(loss_raw),
                checkpoint=data.get("checkpoint"),
                metrics=dict(data.get("metrics") or {}),
                local_rank=None if data.get("local_rank") is None else int(data["local_rank"]),
                visible_devices=_text(data.get("visible_devices")),
                host=_text(data.get("host")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"progress message has a malformed field: {exc}") from exc
