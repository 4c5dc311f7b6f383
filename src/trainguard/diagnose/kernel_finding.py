"""A kernel-log line as a finding: the one rule every reader of a kernel log uses.

``trainguard run`` (this machine's log), the node agent (its node's log) and ``slurm
watch`` (one log per node) all turn a line into a finding here, so a line means the
same thing whichever mode reads it (decision 0450). Pure: no I/O, no clock.

The host rule:

* the finding is recorded as the host whose log it is: the ``node`` the source names
  (an agent's host, a Slurm node), else the inventory's one host (``run``: the
  machine's cards all name it), else none (two hosts on one machine: unknown);
* its culprit names a card the line's PCI bus id resolves to (with that card's host);
  a line that names no host gets the recorded host when it is a network event (a NIC
  or link: it isolates the host, decision 0110), and otherwise only when the source
  named the node (it speaks for that node alone, decision 0402); a host inferred from
  the inventory stays the record's, its culprit left as the line gave it;
* a card resolved by uuid keeps its PCI bus id in ``details``, not the culprit: every
  node of a cluster has the same PCI topology, and attribution matches uuid *or* bus
  id, so the bus id would name the same slot on the job's other nodes.

:class:`KernelLineReader` is what a follower of one log uses: a line that is benign on
its own (a corrected AER error, an EDAC CE) is counted into the per-device rate rules
of :mod:`trainguard.diagnose.trends` instead of becoming a finding, an ECC XID is both
a finding and a count, and a rule that reaches its threshold adds one ``trend``
finding naming the device (decision 0515).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from trainguard.diagnose.detectors import line_finding
from trainguard.diagnose.signatures import classify_line
from trainguard.diagnose.trends import TrendConfig, TrendCounter, benign_alone, line_events
from trainguard.model.devices import Device
from trainguard.model.findings import Domain, Finding

SOURCE = "kernel_log"


def kernel_finding(
    text: str, at: float, inventory: Sequence[Device] = (), node: str | None = None
) -> tuple[Finding, str | None] | None:
    """The finding one kernel-log line carries and the host it is recorded as, or
    ``None`` (a line no signature knows, or one the classifier cannot read)."""
    try:
        match = classify_line(text)
    except Exception:  # a garbage line never stops whoever reads the log
        return None
    if match is None:
        return None
    f = line_finding(match, match.text, at, SOURCE, (), inventory)
    culprit = f.culprit
    if culprit.device_uuid and culprit.pci_bus_id:
        f = dataclasses.replace(f, details={**f.details, "pci_bus_id": culprit.pci_bus_id})
        f = dataclasses.replace(f, culprit=dataclasses.replace(culprit, pci_bus_id=None))
    return own_host(f, inventory, node)


def own_host(
    f: Finding, inventory: Sequence[Device] = (), node: str | None = None
) -> tuple[Finding, str | None]:
    """The host rule of the module docstring for a finding of one host's kernel log."""
    host = node
    if host is None:
        hosts = {d.host for d in inventory}
        host = next(iter(hosts)) if len(hosts) == 1 else None
    if f.culprit.host is not None:
        # A source that names its node speaks for that node alone: a culprit of another
        # host stays as it is, and the control plane refuses it (0402).
        return f, node or f.culprit.host
    if host is not None and (node is not None or f.domain is Domain.NETWORK):
        f = dataclasses.replace(f, culprit=dataclasses.replace(f.culprit, host=host))
    return f, host


class KernelLineReader:
    """Kernel-log lines of one follower as findings, benign lines counted (module doc)."""

    def __init__(self, config: TrendConfig | None = None) -> None:
        self.trends = TrendCounter(config)

    def read(
        self, text: str, at: float, inventory: Sequence[Device] = (), node: str | None = None
    ) -> list[tuple[Finding, str | None]]:
        """The findings one line yields (its own, unless benign alone; a trend it completes)."""
        found = kernel_finding(text, at, inventory, node)
        if found is None:
            return []
        f, host = found
        out = [] if benign_alone(f) is not None else [found]
        for trend in self.trends.add_all(line_events(f, host)):
            out.append((trend, host))
        return out


__all__ = ["SOURCE", "KernelLineReader", "kernel_finding", "own_host"]
