"""Parse the text of ``nvidia-smi -q`` into :class:`~trainguard.preflight.query.GpuQuery` records.

Pure (no I/O), so captured outputs test it. The layout is NVIDIA's documented
``nvidia-smi -q`` report: a ``GPU <bus id>`` line per GPU, then sections indented
by four spaces, each line either a section title or ``Name : Value``. Field names
changed over driver releases and both spellings are read:

* ECC errors: ``SRAM/DRAM Correctable`` and ``... Uncorrectable`` (R510+, summed per
  kind) or ``Single Bit`` / ``Double Bit`` sub-sections with a ``Total`` (older);
* ``Clocks Event Reasons`` (R535+) or ``Clocks Throttle Reasons`` (older);
* ``GPU Recovery Action`` (R565+) or the ``GPU Reset Status`` flags (earlier;
  "Requested functionality has been deprecated" in R570+ counts as absent);
* ``Remapped Rows`` (Ampere and later) and ``Retired Pages`` (earlier).

``N/A`` and unknown values become ``None``; unknown lines are ignored (the report
grows new fields with every driver). Text without any ``GPU`` section raises
:class:`NvidiaSmiParseError`.
"""

from __future__ import annotations

import re
from typing import Any

from trainguard.model.devices import normalize_pci_bus_id
from trainguard.preflight.query import GpuQuery

_GPU_RE = re.compile(r"^GPU (?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_KV_RE = re.compile(r"^(?P<indent> *)(?P<key>\S.*?)\s+:(?: (?P<value>.*))?$")
_NUM_RE = re.compile(r"-?\d+(?:\.\d+)?")

Tree = dict[str, Any]


class NvidiaSmiParseError(ValueError):
    """The text is not an ``nvidia-smi -q`` report (no GPU section found)."""


def _tree(lines: list[str]) -> Tree:
    """Nest the indented lines of one GPU section (deeper key/value lines flatten)."""
    root: Tree = {}
    stack: list[tuple[int, Tree]] = [(-1, root)]
    for raw in lines:
        line = raw.rstrip()
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        m = _KV_RE.match(line)
        if m:
            parent.setdefault(m.group("key"), (m.group("value") or "").strip())
            continue
        title = line.strip().rstrip(":").strip()
        child: Tree = {}
        if isinstance(parent.get(title), dict):
            child = parent[title]
        else:
            parent[title] = child
        stack.append((indent, child))
    return root


def _get(tree: Any, *path: str) -> Any:
    node: Any = tree
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _first(tree: Tree, *names: str) -> Any:
    for n in names:
        if n in tree:
            return tree[n]
    return None


def _int(text: Any) -> int | None:
    if not isinstance(text, str):
        return None
    m = _NUM_RE.search(text)
    if not m or "n/a" in text.lower():
        return None
    return int(float(m.group()))


def _float(text: Any) -> float | None:
    if not isinstance(text, str) or "n/a" in text.lower():
        return None
    m = _NUM_RE.search(text)
    return float(m.group()) if m else None


def _yes(text: Any) -> bool | None:
    if not isinstance(text, str):
        return None
    t = text.strip().lower()
    if t in ("yes", "true", "enabled", "active"):
        return True
    if t in ("no", "false", "disabled", "not active"):
        return False
    return None


def _ecc_split(section: Any) -> tuple[int | None, int | None]:
    """(corrected, uncorrectable) totals of a ``Volatile`` or ``Aggregate`` section."""
    if not isinstance(section, dict):
        return None, None
    if "Single Bit" in section or "Double Bit" in section:  # pre-R510 layout
        sbe = _int(_get(section, "Single Bit", "Total"))
        dbe = _int(_get(section, "Double Bit", "Total"))
        return sbe, dbe
    sbe_vals: list[int | None] = []
    dbe_vals: list[int | None] = []
    for key, value in section.items():
        if isinstance(value, dict) or "Threshold" in key:
            continue
        k = key.lower()
        if "uncorrectable" in k:
            dbe_vals.append(_int(value))
        elif "correctable" in k:
            sbe_vals.append(_int(value))

    def total(vals: list[int | None]) -> int | None:
        known = [v for v in vals if v is not None]
        return sum(known) if known else None

    return total(sbe_vals), total(dbe_vals)


def _throttle(tree: Tree) -> tuple[str, ...]:
    section = _first(tree, "Clocks Event Reasons", "Clocks Throttle Reasons")
    if not isinstance(section, dict):
        return ()
    return tuple(k for k, v in section.items() if isinstance(v, str) and _yes(v) is True)


def _recovery(tree: Tree) -> str | None:
    value = tree.get("GPU Recovery Action")
    if not isinstance(value, str) or not value.strip() or "n/a" in value.lower():
        return None
    return value.strip()


def _reset_flag(tree: Tree, key: str) -> bool | None:
    return _yes(_get(tree, "GPU Reset Status", key))


def _gpu(bus: str, lines: list[str], source: str) -> GpuQuery:
    t = _tree(lines)
    vol_sbe, vol_dbe = _ecc_split(_get(t, "ECC Errors", "Volatile"))
    agg_sbe, agg_dbe = _ecc_split(_get(t, "ECC Errors", "Aggregate"))
    retired = t.get("Retired Pages")
    remap = t.get("Remapped Rows")
    temp_section = t.get("Temperature")
    temp: Tree = temp_section if isinstance(temp_section, dict) else {}
    pending_page = None
    if isinstance(retired, dict):
        pending_page = _yes(
            _first(retired, "Pending Page Blacklist", "Pending Page Retirement", "Pending")
        )
    uuid = t.get("GPU UUID")
    try:
        pci = normalize_pci_bus_id(bus)
    except ValueError:
        pci = None
    return GpuQuery(
        pci_bus_id=pci,
        uuid=uuid.strip() if isinstance(uuid, str) and uuid.strip() else None,
        name=str(t.get("Product Name", "")).strip(),
        source=source,
        ecc_mode=_get(t, "ECC Mode", "Current"),
        ecc_sbe_volatile=vol_sbe,
        ecc_dbe_volatile=vol_dbe,
        ecc_sbe_aggregate=agg_sbe,
        ecc_dbe_aggregate=agg_dbe,
        sram_threshold_exceeded=_yes(_get(t, "ECC Errors", "Aggregate", "SRAM Threshold Exceeded")),
        retired_pages_sbe=_int(_get(retired, "Single Bit ECC"))
        if isinstance(retired, dict)
        else None,
        retired_pages_dbe=_int(_get(retired, "Double Bit ECC"))
        if isinstance(retired, dict)
        else None,
        retired_pages_pending=pending_page,
        remap_correctable=_int(_get(remap, "Correctable Error")),
        remap_uncorrectable=_int(_get(remap, "Uncorrectable Error")),
        remap_pending=_yes(_get(remap, "Pending")),
        remap_failure=_yes(_get(remap, "Remapping Failure Occurred")),
        temperature_c=_float(temp.get("GPU Current Temp")),
        slowdown_temp_c=_float(temp.get("GPU Slowdown Temp")),
        throttle_reasons=_throttle(t),
        recovery_action=_recovery(t),
        reset_required=_reset_flag(t, "Reset Required"),
        drain_and_reset_recommended=_reset_flag(t, "Drain and Reset Recommended"),
        persistence_mode=_yes(t.get("Persistence Mode")),
        compute_mode=(t.get("Compute Mode") or None),
        pcie_width_current=_int(_get(t, "PCI", "GPU Link Info", "Link Width", "Current")),
        pcie_width_max=_int(_get(t, "PCI", "GPU Link Info", "Link Width", "Max")),
        fabric_state=_get(t, "Fabric", "State"),
        fabric_status=_get(t, "Fabric", "Status"),
        memory_total_mib=_int(_get(t, "FB Memory Usage", "Total")),
    )


def parse_nvidia_smi_q(text: str, source: str = "nvidia-smi -q") -> list[GpuQuery]:
    """Every GPU in an ``nvidia-smi -q`` report, in the report's order."""
    sections: list[tuple[str, list[str]]] = []
    for raw in text.replace("\r\n", "\n").split("\n"):
        m = _GPU_RE.match(raw.rstrip())
        if m:
            sections.append((m.group("bus"), []))
        elif sections and (raw.startswith(" ") or not raw.strip()):
            sections[-1][1].append(raw)
        elif sections:
            # A non-indented line after a GPU section ends it (a footer, another tool).
            sections.append(("", []))
    gpus = [_gpu(bus, lines, source) for bus, lines in sections if bus]
    if not gpus:
        raise NvidiaSmiParseError("no 'GPU <bus id>' section found: not nvidia-smi -q output")
    return gpus
