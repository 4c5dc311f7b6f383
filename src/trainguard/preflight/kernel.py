"""Recent kernel events for the devices under test: XIDs, GPUs lost, PCIe AER errors.

Where the lines come from (:func:`read_kernel_log`): the file given with
``--kernel-log FILE`` (a kern.log/syslog, a dmesg capture, a test's file), else
``journalctl -k --since @EPOCH``, else the kernel ring buffer ``/dev/kmsg`` (read
without blocking; its boot-relative stamps are turned into wall-clock times).
Only lines at or after ``since`` count; a line whose time cannot be read (a dmesg
``[  123.4]`` stamp in a file) counts too — a pre-flight check errs on the side of
looking at an event.

Every line goes through the diagnosis classifier
(:class:`trainguard.diagnose.signatures.Classifier`); an event belongs to a
device when its PCI bus id is the device's or a bridge above it (read from sysfs
when present, so an AER error reported on the root port counts for the GPU behind
it). What fails a device (:func:`evaluate`):

* an XID that quarantines on first sight (hardware XIDs: 48, 63, 64, 74, 79, 92, 95,
  119, 120, ..., XID 154 asking for a reset or reboot — the catalog in
  :mod:`trainguard.diagnose.xid`);
* a GPU that fell off the bus;
* an uncorrected PCIe AER error or another error-severity hardware event.

Application XIDs (13, 31, 43, ...) and corrected AER errors are listed in the
result's details but do not fail the device (``aer_corrected_max`` sets a limit).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from trainguard.diagnose.signatures import Classifier
from trainguard.model.devices import Device, normalize_pci_bus_id
from trainguard.model.findings import Severity
from trainguard.model.signature import LineMatch
from trainguard.preflight.results import CheckResult, CheckStatus, judge
from trainguard.preflight.specs import Thresholds

CHECK = "kernel_log"
MAX_FILE_BYTES = 16 << 20  # the tail of a huge syslog is what "recent" means
JOURNAL_TIMEOUT = 30.0
KINDS = frozenset({"xid", "gpu_lost", "pcie_error", "ecc_error"})

_ISO_START = re.compile(
    r"^\s*(?P<ts>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)"
)
_SYSLOG_START = re.compile(
    r"^\s*(?P<ts>(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +\d+ \d\d:\d\d:\d\d)"
)


@dataclass(frozen=True)
class KernelLog:
    """Kernel log text and how it was read; ``text`` is ``None`` when nothing was readable."""

    text: str | None
    method: str
    problem: str = ""
    # Seconds since the epoch per line, or None; filled for /dev/kmsg records.
    times: tuple[float | None, ...] | None = None


def line_time(text: str, now: float) -> float | None:
    """Wall-clock time of a log line from its leading ISO 8601 or syslog stamp; else None.

    A syslog stamp has no year or zone: local time, this year (last year when that
    would lie more than a day in the future).
    """
    m = _ISO_START.match(text)
    if m:
        ts = m.group("ts").replace(",", ".").replace(" ", "T", 1)
        if re.search(r"[+-]\d{4}$", ts):
            ts = ts[:-2] + ":" + ts[-2:]
        try:
            dt = datetime.fromisoformat(ts.replace("Z", "+00:00"))
        except ValueError:
            return None
        return dt.timestamp()  # naive = local time, like syslog
    m = _SYSLOG_START.match(text)
    if m:
        year = time.localtime(now).tm_year
        for y in (year, year - 1):
            try:
                t = time.mktime(time.strptime(f"{y} {m.group('ts')}", "%Y %b %d %H:%M:%S"))
            except (ValueError, OverflowError):
                return None
            if t <= now + 86400:
                return t
    return None


def _read_file(path: str) -> KernelLog:
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            if size > MAX_FILE_BYTES:
                fh.seek(size - MAX_FILE_BYTES)
                fh.readline()  # drop the partial first line
            data = fh.read()
    except OSError as exc:
        return KernelLog(None, f"file {path}", f"cannot read {path}: {exc}")
    return KernelLog(data.decode("utf-8", errors="replace"), f"file {path}")


def _read_journal(since: float) -> KernelLog | None:
    exe = shutil.which("journalctl")
    if exe is None:
        return None
    cmd = [exe, "-k", "--since", f"@{int(since)}", "-o", "short-iso", "--no-pager", "-q"]
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=JOURNAL_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0 or not proc.stdout.strip():
        return None  # no journal here (containers): try the ring buffer
    return KernelLog(proc.stdout, f"journalctl -k --since @{int(since)}")


def _read_kmsg(path: str = "/dev/kmsg") -> KernelLog | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    boot = time.time() - time.monotonic()  # kmsg stamps are CLOCK_MONOTONIC microseconds
    lines: list[str] = []
    times: list[float | None] = []
    try:
        while True:
            try:
                record = os.read(fd, 16384)
            except BlockingIOError:
                break  # the end of the buffer
            except OSError as exc:
                if exc.errno == 32:  # EPIPE: overwritten while reading; keep going
                    continue
                break
            if not record:
                break
            head, _, message = record.decode("utf-8", errors="replace").partition(";")
            fields = head.split(",")
            try:
                usec = int(fields[2])
            except (IndexError, ValueError):
                continue
            first = message.split("\n", 1)[0]  # continuation lines are key=value metadata
            lines.append(first)
            times.append(boot + usec / 1e6)
    finally:
        os.close(fd)
    return KernelLog("\n".join(lines) + "\n", f"{path} (kernel ring buffer)", times=tuple(times))


def read_kernel_log(path: str | None, since: float) -> KernelLog:
    """The kernel log since ``since``: ``path``, else the journal, else ``/dev/kmsg``."""
    if path:
        return _read_file(path)
    journal = _read_journal(since)
    if journal is not None:
        return journal
    kmsg = _read_kmsg()
    if kmsg is not None:
        return kmsg
    return KernelLog(
        None,
        "",
        "no kernel log readable (journalctl -k: nothing; /dev/kmsg: not readable); "
        "give --kernel-log FILE",
    )


def pci_path(pci_bus_id: str, sysfs: str = "/sys/bus/pci/devices") -> frozenset[str]:
    """The device's bus id and those of the bridges above it (from sysfs when present)."""
    ids = {pci_bus_id}
    try:
        real = os.path.realpath(os.path.join(sysfs, pci_bus_id))
    except OSError:
        return frozenset(ids)
    for part in real.split("/"):
        try:
            ids.add(normalize_pci_bus_id(part))
        except ValueError:
            continue
    return frozenset(ids)


def _is_bad(m: LineMatch) -> bool:
    if m.kind == "xid":
        return m.details.get("quarantine") == "first"
    if m.kind == "gpu_lost":
        return True
    return m.severity in (Severity.ERROR, Severity.FATAL)


def classify(log: KernelLog, since: float, now: float) -> list[tuple[float | None, LineMatch]]:
    """Hardware events in the log at or after ``since`` (or of unknown time)."""
    if log.text is None:
        return []
    clf = Classifier()
    matches = clf.feed(log.text) + clf.finish()
    lines = log.text.split("\n") if log.times is None else None
    out: list[tuple[float | None, LineMatch]] = []
    for m in matches:
        if m.kind not in KINDS or not m.pci_bus_id or m.lineno is None:
            continue
        if log.times is not None:
            at = log.times[m.lineno - 1] if m.lineno - 1 < len(log.times) else None
        else:
            assert lines is not None
            at = line_time(lines[m.lineno - 1], now) if m.lineno - 1 < len(lines) else None
        if at is not None and at < since:
            continue
        out.append((at, m))
    return out


def evaluate(
    log: KernelLog,
    devices: Sequence[Device],
    since: float,
    now: float,
    th: Thresholds,
    *,
    paths: dict[str, frozenset[str]] | None = None,
    duration_s: float = 0.0,
) -> list[CheckResult]:
    """One ``kernel_log/events`` result per device."""
    window = datetime.fromtimestamp(since).isoformat(timespec="seconds")
    method = f"{log.method}, lines since {window} (local time) or of unknown time"
    if log.text is None:
        status = CheckStatus.FAIL if log.method else CheckStatus.NOT_APPLICABLE
        return [
            CheckResult(
                CHECK,
                "events",
                status,
                d.uuid,
                method=log.method,
                reason=log.problem,
                duration_s=duration_s,
            )
            for d in devices
        ]
    events = classify(log, since, now)
    out = []
    for d in devices:
        ids = (paths or {}).get(d.uuid) or frozenset({d.pci_bus_id})
        mine = [(at, m) for at, m in events if m.pci_bus_id in ids]
        bad = [(at, m) for at, m in mine if _is_bad(m)]
        corrected = [(at, m) for at, m in mine if m.kind == "pcie_error" and not _is_bad(m)]
        other = [(at, m) for at, m in mine if not _is_bad(m) and m.kind != "pcie_error"]
        details = {
            "failing": [_event(at, m) for at, m in bad[:20]],
            "corrected_aer": len(corrected),
            "not_failing": [_event(at, m) for at, m in other[:20]],
            "pci_ids": sorted(ids),
        }
        if bad:
            _at, first = bad[0]
            what = f"XID {first.xid}" if first.xid is not None else first.kind
            reason = (
                f"{len(bad)} hardware event(s) for {d.pci_bus_id}; first: {what}: "
                + (first.text.strip()[:200])
            )
            out.append(
                CheckResult(
                    CHECK,
                    "events",
                    CheckStatus.FAIL,
                    d.uuid,
                    len(bad),
                    0,
                    "<=",
                    "events",
                    method,
                    reason,
                    duration_s,
                    details,
                )
            )
            continue
        status = judge(len(corrected), th.aer_corrected_max, "<=")
        reason = f"no hardware events for {d.pci_bus_id}"
        if corrected:
            reason += f"; {len(corrected)} corrected PCIe error(s)"
        if other:
            reason += f"; {len(other)} application-level XID(s) (not a hardware fault)"
        if status is CheckStatus.FAIL:
            reason = f"{len(corrected)} corrected PCIe errors, more than {th.aer_corrected_max:g}"
        out.append(
            CheckResult(
                CHECK,
                "events",
                status,
                d.uuid,
                0,
                0,
                "<=",
                "events",
                method,
                reason,
                duration_s,
                details,
            )
        )
    return out


def _event(at: float | None, m: LineMatch) -> dict[str, object]:
    return {
        "at": None if at is None else datetime.fromtimestamp(at).isoformat(timespec="seconds"),
        "kind": m.kind,
        "xid": m.xid,
        "action": m.action,
        "text": m.text.strip()[:300],
    }
