"""Read GPU health metrics: a DCGM exporter (or any Prometheus text) URL or file, and
``nvidia-smi -q``.

The I/O half of :mod:`trainguard.diagnose.metrics`: this module fetches text
and stamps it with the caller's clock; parsing and rules are pure and live in
``diagnose``. :class:`MetricsWatch` keeps a bounded time series per source and
evaluates the rules on it.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from trainguard.diagnose.metrics import (
    GpuSample,
    MetricRules,
    evaluate,
    parse_nvidia_smi_q,
    parse_prometheus,
)
from trainguard.model.findings import Finding

MAX_BYTES = 16 << 20  # an exporter page is tens of KiB; refuse to buffer garbage forever


class MetricsError(RuntimeError):
    """The source could not be read or did not hold metrics; the message says why."""


def fetch_text(source: str, timeout: float = 5.0) -> str:
    """The text at ``source``: an ``http(s)://`` URL or a file path."""
    try:
        if source.startswith(("http://", "https://")):
            with urllib.request.urlopen(source, timeout=timeout) as resp:
                data = resp.read(MAX_BYTES + 1)
        else:
            with open(source, "rb") as fh:
                data = fh.read(MAX_BYTES + 1)
    except (OSError, ValueError) as exc:
        raise MetricsError(f"cannot read metrics from {source}: {exc}") from exc
    if len(data) > MAX_BYTES:
        raise MetricsError(f"{source}: more than {MAX_BYTES} bytes; not a metrics page")
    return data.decode("utf-8", "replace")


def read_prometheus(
    source: str, at: float, host: str | None = None, timeout: float = 5.0
) -> list[GpuSample]:
    """Fetch and parse DCGM exporter metrics; raises :class:`MetricsError`."""
    text = fetch_text(source, timeout)
    try:
        return parse_prometheus(text, at=at, host=host)
    except ValueError as exc:
        raise MetricsError(f"{source}: not Prometheus text exposition: {exc}") from exc


def query_nvidia_smi(timeout: float = 20.0, binary: str = "nvidia-smi") -> str:
    """``nvidia-smi -q`` output; raises :class:`MetricsError` when it is missing or fails."""
    path = shutil.which(binary)
    if path is None:
        raise MetricsError(f"{binary} not found")
    try:
        proc = subprocess.run(
            [path, "-q"], capture_output=True, timeout=timeout, check=False, text=True
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MetricsError(f"{binary} -q failed: {exc}") from exc
    if proc.returncode != 0:
        raise MetricsError(f"{binary} -q exited {proc.returncode}: {proc.stderr.strip()[:300]}")
    return proc.stdout


def read_nvidia_smi(
    at: float, host: str | None = None, source: str | None = None
) -> list[GpuSample]:
    """Samples from ``nvidia-smi -q``, or from a saved copy of its output at ``source``."""
    text = fetch_text(source) if source else query_nvidia_smi()
    return parse_nvidia_smi_q(text, at=at, host=host)


@dataclass
class MetricsWatch:
    """Poll one source, keep the recent samples, evaluate the rules.

    ``clock`` is injected (``time.time`` by default) so tests drive time.
    """

    source: str  # URL or file of Prometheus text, or "nvidia-smi" / "nvidia-smi:<file>"
    host: str | None = None
    rules: MetricRules = field(default_factory=MetricRules)
    clock: Callable[[], float] = time.time
    keep: int = 720  # samples per GPU (an hour at 5 s)
    _series: deque[GpuSample] = field(default_factory=deque, init=False, repr=False)

    def poll(self) -> list[Finding]:
        """Take one sample now and return the findings the rules give on the series."""
        now = self.clock()
        if self.source == "nvidia-smi" or self.source.startswith("nvidia-smi:"):
            _, _, path = self.source.partition(":")
            samples = read_nvidia_smi(now, self.host, path or None)
        else:
            samples = read_prometheus(self.source, now, self.host)
        self._series.extend(samples)
        limit = self.keep * max(1, len(samples))
        while len(self._series) > limit:
            self._series.popleft()
        return evaluate(self._series, now, self.rules)

    @property
    def samples(self) -> list[GpuSample]:
        return list(self._series)
