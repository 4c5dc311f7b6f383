"""DCGM diagnostics: run ``dcgmi diag -r LEVEL`` when DCGM is installed and read its verdict.

:func:`parse_dcgmi_diag` is pure and reads the table ``dcgmi diag`` prints, in
both layouts seen in NVIDIA's documentation:

* DCGM 3: one row per test, ``Pass``, ``Fail``, ``Skip`` or ``Warn``, optionally
  ``- All`` or ``- GPU: 0, 3``; ``Warning``/``Error``/``Info`` rows (wrapped over
  several lines) explain the test above them;
* DCGM 4: a row per test with its overall result, then ``GPU0: Pass`` rows per GPU.

Metadata rows (``DCGM Version``, ``Driver Version Detected``, ...) are kept apart.
A failed test fails the GPUs it names (DCGM GPU ids are NVML indices), or every
device when it names none. ``Skip`` and ``Warn`` do not fail.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from trainguard.model.devices import Device
from trainguard.preflight.results import CheckResult, CheckStatus

CHECK = "dcgm"
TIMEOUTS = {1: 300.0, 2: 900.0, 3: 3600.0, 4: 14400.0}
METADATA = frozenset({"DCGM Version", "Driver Version Detected", "GPU Device IDs Detected"})
MESSAGE_ROWS = frozenset({"Warning", "Error", "Info"})

_ROW_RE = re.compile(r"^\s*\|(?P<name>[^|]*)\|(?P<value>.*)\|\s*$")
_RESULT_RE = re.compile(r"^(?P<res>Pass|Fail|Skip|Warn)\b(?:\s*-\s*(?P<scope>.*))?$", re.I)
_GPU_RESULT_RE = re.compile(r"^GPU\s*(?P<id>\d+)\s*:\s*(?P<res>Pass|Fail|Skip|Warn)\b", re.I)


@dataclass
class DcgmTest:
    name: str
    category: str
    result: str  # pass, fail, skip, warn
    gpus: list[int] | None = None  # the GPUs a failure names; None: all / not said
    per_gpu: dict[int, str] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)

    def failed_gpus(self) -> list[int] | None:
        """GPU ids this test failed on; ``None`` means every GPU (none named)."""
        named = [g for g, r in self.per_gpu.items() if r == "fail"]
        if named:
            return sorted(named)
        return self.gpus


@dataclass
class DcgmDiag:
    tests: list[DcgmTest]
    metadata: dict[str, str]

    @property
    def failed(self) -> list[DcgmTest]:
        return [t for t in self.tests if t.result == "fail"]


def parse_dcgmi_diag(text: str) -> DcgmDiag:
    """Read the result table of ``dcgmi diag``; raises ``ValueError`` when there is none."""
    tests: list[DcgmTest] = []
    metadata: dict[str, str] = {}
    category = ""
    in_message = False
    last_full = False
    for raw in text.splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if stripped.startswith(("+-----", "|-----")):
            m = re.search(r"-{3,}\s+(\w[\w ]*?)\s+-{3,}", stripped)
            if m:
                category = m.group(1)
            in_message = False
            continue
        m = _ROW_RE.match(line)
        if not m:
            continue
        name = m.group("name").strip()
        cell = m.group("value")
        # The cell is padded with one space; a wrapped message keeps its own spaces.
        wrapped = (cell[1:] if cell.startswith(" ") else cell).rstrip()
        value = wrapped.strip()
        if name == "Diagnostic" and value == "Result":
            continue
        if name in METADATA:
            metadata[name] = value
            continue
        if name in MESSAGE_ROWS:
            if tests:
                tests[-1].messages.append(f"{name}: {value}")
            in_message = True
            last_full = len(wrapped) >= len(cell) - 3
            continue
        if not name:
            g = _GPU_RESULT_RE.match(value)
            if g and tests:
                tests[-1].per_gpu[int(g.group("id"))] = g.group("res").lower()
                in_message = False
            elif in_message and tests and tests[-1].messages:
                # DCGM 3 cuts messages into fixed-width pieces, mid-word: a piece that
                # filled its cell continues without a space; a shorter one ended in spaces.
                glue = "" if last_full else " "
                tests[-1].messages[-1] += glue + value
                last_full = len(wrapped) >= len(cell) - 3
            elif tests and value:
                tests[-1].messages.append(value)
            continue
        r = _RESULT_RE.match(value)
        if not r:
            continue
        in_message = False
        gpus = None
        scope = (r.group("scope") or "").strip()
        if scope and scope.lower() != "all":
            ids = [int(x) for x in re.findall(r"\d+", scope)]
            gpus = ids or None
        tests.append(DcgmTest(name, category, r.group("res").lower(), gpus))
    if not tests:
        raise ValueError("no test results found in the dcgmi diag output")
    return DcgmDiag(tests, metadata)


def evaluate(
    diag: DcgmDiag, devices: Sequence[Device], method: str, duration_s: float = 0.0
) -> list[CheckResult]:
    """A ``dcgm/diag`` result per device."""
    out = []
    for d in devices:
        fails = []
        for t in diag.failed:
            gpus = t.failed_gpus()
            if gpus is None or d.index in gpus:
                fails.append(t)
        ran = len(diag.tests)
        details = {
            "metadata": diag.metadata,
            "tests": [
                {
                    "name": t.name,
                    "category": t.category,
                    "result": t.result,
                    "per_gpu": t.per_gpu.get(d.index),
                    "messages": t.messages[:5],
                }
                for t in diag.tests
            ],
        }
        if fails:
            first = fails[0]
            msg = f": {first.messages[0][:200]}" if first.messages else ""
            reason = f"DCGM {first.category} test {first.name!r} failed{msg}"
            if len(fails) > 1:
                reason += f" (+{len(fails) - 1} more failed test(s))"
            out.append(
                CheckResult(
                    CHECK,
                    "diag",
                    CheckStatus.FAIL,
                    d.uuid,
                    len(fails),
                    0,
                    "<=",
                    "tests",
                    method,
                    reason,
                    duration_s,
                    details,
                )
            )
        else:
            skipped = sum(1 for t in diag.tests if t.result == "skip")
            out.append(
                CheckResult(
                    CHECK,
                    "diag",
                    CheckStatus.PASS,
                    d.uuid,
                    0,
                    0,
                    "<=",
                    "tests",
                    method,
                    f"{ran} DCGM tests, none failed ({skipped} skipped)",
                    duration_s,
                    details,
                )
            )
    return out


def run_dcgm(devices: Sequence[Device], level: int, dcgmi: str = "dcgmi") -> list[CheckResult]:
    """Run ``dcgmi diag -r LEVEL`` on the devices, or say it is not applicable."""
    exe = shutil.which(dcgmi)
    if exe is None:
        return [
            CheckResult(
                CHECK,
                "diag",
                CheckStatus.NOT_APPLICABLE,
                d.uuid,
                reason=f"DCGM not installed ({dcgmi} not on PATH)",
            )
            for d in devices
        ]
    ids = ",".join(str(d.index) for d in devices)
    cmd = [exe, "diag", "-r", str(level), "-i", ids]
    method = " ".join(cmd)
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=TIMEOUTS.get(level, 3600.0),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return _all_fail(devices, method, f"dcgmi diag did not complete: {exc}", started)
    duration = time.perf_counter() - started
    try:
        diag = parse_dcgmi_diag(proc.stdout)
    except ValueError as exc:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
        return _all_fail(
            devices, method, f"{exc} (exit {proc.returncode}: {tail[0][:200]})", started
        )
    return evaluate(diag, devices, method, duration)


def _all_fail(
    devices: Sequence[Device], method: str, reason: str, started: float
) -> list[CheckResult]:
    duration = time.perf_counter() - started
    return [
        CheckResult(
            CHECK,
            "diag",
            CheckStatus.FAIL,
            d.uuid,
            method=method,
            reason=reason,
            duration_s=duration,
        )
        for d in devices
    ]
