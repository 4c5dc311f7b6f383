"""XID 74 register decoding into the failing link, and the SXid (NVSwitch) catalog."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trainguard.diagnose.correlate import is_sympathetic_xid
from trainguard.diagnose.nvlink import decode_xid74, sxid_info
from trainguard.diagnose.signatures import classify_line, to_finding

LINE = (
    "[449410.332316] NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, "
    "NVLink: fatal error detected on link {link}({regs})"
)


def _line(link: int, regs: list[int]) -> str:
    return LINE.format(link=link, regs=", ".join(f"0x{r:x}" for r in regs))


def test_reg2_bit16_names_the_link_and_asks_for_field_diags_on_repeat() -> None:
    m = classify_line(_line(14, [0, 0, 0x10000, 0, 0, 0, 0]))
    assert m is not None and m.xid == 74 and m.pci_bus_id == "0003:00:00.0"
    assert m.details["nvlink_link"] == 14
    assert m.details["nvlink_bits"] == ["reg2.bit16:field_diag_if_repeated"]
    assert m.details["quarantine"] == "repeat"


def test_mechanical_bits_quarantine_at_once_and_ecc_parity_on_repeat() -> None:
    mech = classify_line(_line(6, [0x10000, 0, 0, 0, 0, 0, 0]))  # reg0 bit 16
    assert mech is not None
    assert mech.details["nvlink_verdict"] == "mechanical"
    assert mech.severity.value == "fatal" and mech.details["quarantine"] == "first"
    ecc = classify_line(_line(2, [0, 0, 0, 0, 1 << 18, 0, 0]))  # reg4 bit 18
    assert ecc is not None and ecc.details["nvlink_verdict"] == "ecc_parity"
    assert ecc.details["quarantine"] == "repeat"


def test_threshold_only_is_a_warning_and_sympathetic_only_a_symptom() -> None:
    thr = classify_line(_line(3, [0, 0, 0, 0, 1 << 20, 0, 0]))
    assert thr is not None and thr.severity.value == "warning" and thr.action == "ignore"
    sym = classify_line(_line(3, [1 << 1, 0, 0, 1 << 16, 0, 0, 0]))
    assert sym is not None and sym.details["nvlink_verdict"] == "sympathetic"
    assert is_sympathetic_xid(to_finding(sym, at=0.0, source="kern.log"))


def test_stronger_bits_win_over_sympathetic_ones() -> None:
    both = decode_xid74(_line(1, [(1 << 1) | (1 << 21), 0, 0, 0, 0, 0, 0]))
    assert both is not None and both.verdict == "signal_integrity"


@given(st.integers(0, 17), st.lists(st.integers(0, 2**32 - 1), min_size=7, max_size=7))
def test_any_register_values_decode_without_error(link: int, regs: list[int]) -> None:
    d = decode_xid74(_line(link, regs))
    assert d is not None and d.link == link and list(d.registers) == regs
    assert (d.verdict is None) == (d.bits == ())


def test_a_74_without_registers_keeps_the_catalog_action() -> None:
    m = classify_line("NVRM: Xid (PCI:0000:65:00): 74, pid=<n/a>, name=<unknown>, NVLink: fatal")
    assert m is not None and m.action == "drain_and_reset" and "nvlink_bits" not in m.details


def test_sxid_catalog_categories_and_actions() -> None:
    always = classify_line(
        "nvidia-nvswitch3: SXid (PCI:0000:8a:00.0): 22003, Fatal, Link 12 Minion Halt"
    )
    assert always is not None and always.action == "reboot_node"
    assert always.details["sxid_category"] == "always_fatal" and always.details["nvlink_link"] == 12
    potential = classify_line("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 8")
    assert potential is not None and potential.severity.value == "fatal"
    assert potential.action == "drain_node"
    sbe = sxid_info(19049)
    assert sbe is not None and sbe.severity.value == "warning" and sbe.action.value == "ignore"
    assert sxid_info(1) is None
