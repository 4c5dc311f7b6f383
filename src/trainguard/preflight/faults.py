"""Fault injection for pre-flight tests: a documented switch, not a mock of the checks.

``TRAINGUARD_PREFLIGHT_FAULTS`` (or ``--inject-fault`` on the command line) holds
comma-separated items ``KIND[=VALUE][@DEVICE]``; ``DEVICE`` is a device index or
UUID, and without it the fault hits every device:

* ``matmul`` — the device returns a wrong product now and then: from the third
  product on, every third one has one element changed (intermittent silent data
  corruption). The redundancy check catches it.
* ``matmul_all`` — every product is wrong, the first one too (the reference check
  against float64 catches it).
* ``memory`` — one bit of the device's memory is stuck: after every pattern write,
  one byte in the middle of the first buffer has a bit flipped.
* ``allreduce_slow=SECONDS`` — the rank of this device sleeps SECONDS (default 0.25)
  inside every timed all-reduce: a slow link, measured for real.

The two other faults the tests use need no switch because they are real inputs: an
XID line in the kernel log file (``--kernel-log``) and an ``nvidia-smi -q`` capture
(``--nvidia-smi-q FILE``, or an ``nvidia-smi`` script first on ``PATH``).

Injected faults can only make checks fail; every report lists the faults that were
active (``injected_faults``) so that an injected failure is never mistaken for a
real one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trainguard.model.devices import Device

FAULTS_ENV = "TRAINGUARD_PREFLIGHT_FAULTS"
KINDS = ("matmul", "matmul_all", "memory", "allreduce_slow")
DEFAULT_VALUES = {"allreduce_slow": 0.25}


@dataclass(frozen=True)
class Fault:
    kind: str
    value: float | None = None
    device: str | None = None  # index or UUID; None: every device

    def applies_to(self, device: Device) -> bool:
        return self.device is None or self.device in (str(device.index), device.uuid)

    def spec(self) -> str:
        text = self.kind
        if self.value is not None:
            text += f"={self.value:g}"
        if self.device is not None:
            text += f"@{self.device}"
        return text


def parse_faults(text: str | Iterable[str] | None) -> tuple[Fault, ...]:
    """Parse ``"matmul@1,allreduce_slow=0.5"`` (or a list of items); bad items raise."""
    if text is None:
        return ()
    items = text.split(",") if isinstance(text, str) else [i for t in text for i in t.split(",")]
    out = []
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        head, _, device = item.partition("@")
        kind, sep, value_text = head.partition("=")
        kind = kind.strip()
        if kind not in KINDS:
            raise ValueError(f"unknown fault {kind!r} in {item!r}; known: {', '.join(KINDS)}")
        value = DEFAULT_VALUES.get(kind)
        if sep:
            try:
                value = float(value_text)
            except ValueError as exc:
                raise ValueError(f"fault {item!r}: value is not a number") from exc
        out.append(Fault(kind, value, device.strip() or None))
    return tuple(out)


def faults_for(faults: Iterable[Fault], device: Device, kind: str) -> Fault | None:
    for f in faults:
        if f.kind == kind and f.applies_to(device):
            return f
    return None
