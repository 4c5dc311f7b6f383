"""One kernel-log line, one finding, one host rule (diagnose/kernel_finding.py, decision
0450): the table every reader of a kernel log (run, the agent, slurm watch) follows."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.diagnose.kernel_finding import kernel_finding
from trainguard.model.devices import Device

HOSTA = (
    Device(index=0, uuid="GPU-a0", pci_bus_id="0000:10:00.0", host="hosta"),
    Device(index=1, uuid="GPU-a1", pci_bus_id="0000:11:00.0", host="hosta"),
)
TWO_HOSTS = (HOSTA[0], Device(index=0, uuid="GPU-b0", pci_bus_id="0000:10:00.0", host="hostb"))

XID_KNOWN = (
    "[ 1283.9] NVRM: Xid (PCI:0000:10:00): 79, pid=77, name=python, GPU has fallen off the bus."
)
XID_UNKNOWN = "NVRM: Xid (PCI:0000:c1:00): 79, GPU has fallen off the bus."
NIC = "mlx5_core 0000:c1:00.0: Port module event: Link down"
HOST_OOM = "Out of memory: Killed process 4242 (python) total-vm:9000000kB"

# (line, inventory, node) -> (kind, culprit uuid, culprit pci, culprit host, recorded host)
TABLE = [
    # A card of the inventory: named by uuid, its host the card's, the bus id in details.
    (XID_KNOWN, HOSTA, None, ("xid", "GPU-a0", None, "hosta", "hosta")),
    (XID_KNOWN, HOSTA, "hosta", ("xid", "GPU-a0", None, "hosta", "hosta")),
    # A bus id no card has: kept; the node a source names is the culprit's host, a host
    # inferred from the inventory only the record's.
    (XID_UNKNOWN, HOSTA, None, ("xid", None, "0000:c1:00.0", None, "hosta")),
    (XID_UNKNOWN, (), "n1", ("xid", None, "0000:c1:00.0", "n1", "n1")),
    # A NIC or link event isolates the host (0110), inferred or named.
    (NIC, HOSTA, None, ("network_error", None, "0000:c1:00.0", "hosta", "hosta")),
    (NIC, (), "n1", ("network_error", None, "0000:c1:00.0", "n1", "n1")),
    # Two hosts on one machine: no host can be inferred.
    (NIC, TWO_HOSTS, None, ("network_error", None, "0000:c1:00.0", None, None)),
    (HOST_OOM, HOSTA, None, ("host_oom", None, None, None, "hosta")),
    (HOST_OOM, HOSTA, "n1", ("host_oom", None, None, "n1", "n1")),
    # A node's log naming a card of another host: recorded as the node's (the plane
    # then refuses it, 0402), never as the other host's.
    (XID_KNOWN, HOSTA, "n1", ("xid", "GPU-a0", None, "hosta", "n1")),
]


@pytest.mark.parametrize(("line", "inventory", "node", "want"), TABLE)
def test_a_kernel_line_becomes_one_finding_by_one_host_rule(
    line: str,
    inventory: tuple[Device, ...],
    node: str | None,
    want: tuple[str, str | None, str | None, str | None, str | None],
) -> None:
    found = kernel_finding(line, 5.0, inventory, node)
    assert found is not None
    f, host = found
    assert (f.kind, f.culprit.device_uuid, f.culprit.pci_bus_id, f.culprit.host, host) == want
    assert f.source == "kernel_log" and f.at == 5.0


def test_a_card_named_by_uuid_keeps_its_bus_id_in_the_details() -> None:
    found = kernel_finding(XID_KNOWN, 1.0, HOSTA, "hosta")
    assert found is not None
    assert found[0].details["pci_bus_id"] == "0000:10:00.0"


GARBAGE = [
    "",
    "\n",
    "\x00\xff\ufffd garbage",
    "x" * 200_000,
    "NVRM: Xid (PCI:zzzz): 79,",
    "NVRM: Xid (PCI:0000:10:00): notanumber, GPU has fallen off the bus.",
    "mlx5_core ::::: Port module event: Link down",
    "\ud800 a lone surrogate",
    "systemd[1]: Started Session 4 of user root.",
]


@pytest.mark.parametrize("line", GARBAGE)
def test_garbage_lines_never_raise(line: str) -> None:
    found = kernel_finding(line, 1.0, HOSTA, "hosta")
    if found is not None:  # whatever it reads, it reads as this host's
        assert found[1] == "hosta"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300), st.sampled_from([None, "n1"]))
def test_no_line_makes_it_raise(line: str, node: str | None) -> None:
    kernel_finding(line, 0.0, HOSTA, node)
