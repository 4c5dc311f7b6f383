"""DCGM exporter text: parsing, per-GPU figures, and findings for what changed."""

from __future__ import annotations

from trainguard.agent.agent import host_simulated
from trainguard.agent.dcgm import DcgmRules, by_device, gpu_figures, parse_text
from trainguard.model.findings import Domain, Severity

T0 = 1_764_400_000.0
DEVS = host_simulated(2, "n1")
U0, U1 = DEVS[0].uuid, DEVS[1].uuid
MODEL = "NVIDIA H100 80GB HBM3"


def text(t0: float = 40, xid0: int = 0, dbe0: int = 0, remap0: int = 0) -> str:
    return f"""\
# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="{U0}",device="nvidia0",modelName="{MODEL}",Hostname="n1"}} {t0}
DCGM_FI_DEV_GPU_TEMP{{gpu="1",UUID="{U1}",device="nvidia1",modelName="{MODEL}",Hostname="n1"}} 41
DCGM_FI_DEV_POWER_USAGE{{gpu="0",UUID="{U0}"}} 310.5
DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{U0}"}} 98
DCGM_FI_DEV_FB_USED{{gpu="0",UUID="{U0}"}} 70000
DCGM_FI_DEV_XID_ERRORS{{gpu="0",UUID="{U0}",err_code="{xid0}"}} {xid0}
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{gpu="0",UUID="{U0}"}} {dbe0}
DCGM_FI_DEV_ROW_REMAP_FAILURE{{gpu="0",UUID="{U0}"}} {remap0}
DCGM_FI_DEV_SM_CLOCK{{gpu="0",UUID="{U0}"}} 1980
DCGM_FI_DEV_GPU_TEMP{{gpu="7",UUID="GPU-not-ours"}} 99
garbage line without value
DCGM_FI_DEV_GPU_TEMP{{gpu="1"}} notanumber
"""


def test_parse_keeps_wanted_metrics_and_counts_bad_lines() -> None:
    samples, bad = parse_text(text())
    names = {s.name for s in samples}
    assert "DCGM_FI_DEV_SM_CLOCK" not in names and "DCGM_FI_DEV_GPU_TEMP" in names
    assert bad == 2
    values = by_device(samples, DEVS)
    assert set(values) == {U0, U1}  # GPU-not-ours is ignored
    figures = gpu_figures(values)
    assert figures[U0] == {
        "temp_c": 40.0,
        "power_w": 310.5,
        "util_pct": 98.0,
        "mem_used_mb": 70000.0,
    }
    assert figures[U1]["power_w"] is None


def test_devices_are_matched_by_pci_id_or_index_without_a_uuid() -> None:
    samples, _ = parse_text(
        'DCGM_FI_DEV_GPU_TEMP{gpu="1",pci_bus_id="00000000:11:00.0"} 50\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="0"} 7\n'
    )
    values = by_device(samples, DEVS)
    assert values[U1]["DCGM_FI_DEV_GPU_TEMP"] == 50 and values[U0]["DCGM_FI_DEV_GPU_UTIL"] == 7


def evaluate(rules: DcgmRules, t: str, at: float = T0) -> list[tuple[str, object]]:
    samples, _ = parse_text(t)
    return rules.evaluate(by_device(samples, DEVS), DEVS, "n1", at)  # type: ignore[return-value]


def test_first_poll_is_a_baseline_then_changes_become_findings() -> None:
    rules = DcgmRules()
    assert evaluate(rules, text(xid0=13, dbe0=2, remap0=1)) == []  # history, not news
    out = evaluate(rules, text(xid0=79, dbe0=3, remap0=1))
    kinds = {fid: f for fid, f in out}
    assert set(kinds) == {f"n1:dcgm:{U0}:xid:1", f"n1:dcgm:{U0}:dbe:1"}
    xid = kinds[f"n1:dcgm:{U0}:xid:1"]
    assert xid.kind == "xid" and xid.xid == 79 and xid.severity is Severity.FATAL  # type: ignore[attr-defined]
    assert xid.culprit.device_uuid == U0 and xid.culprit.host == "n1"  # type: ignore[attr-defined]
    dbe = kinds[f"n1:dcgm:{U0}:dbe:1"]
    assert dbe.kind == "ecc_error" and dbe.domain is Domain.HARDWARE  # type: ignore[attr-defined]
    assert evaluate(rules, text(xid0=79, dbe0=3, remap0=1)) == []  # unchanged: nothing new


def test_remap_failure_and_thermal_excursions_fire_once_each() -> None:
    rules = DcgmRules(temp_threshold_c=90)
    evaluate(rules, text())
    out = evaluate(rules, text(t0=95, remap0=1))
    assert sorted(fid for fid, _ in out) == [f"n1:dcgm:{U0}:remap:1", f"n1:dcgm:{U0}:thermal:1"]
    assert evaluate(rules, text(t0=96, remap0=1)) == []  # still hot: the same excursion
    assert evaluate(rules, text(t0=80, remap0=1)) == []  # cooled down
    again = evaluate(rules, text(t0=92, remap0=1))
    assert [fid for fid, _ in again] == [f"n1:dcgm:{U0}:thermal:2"]


def test_saved_state_gives_the_same_ids_after_a_crash() -> None:
    rules = DcgmRules()
    evaluate(rules, text())
    saved = rules.to_state()
    first = evaluate(rules, text(xid0=48))
    # The agent crashed before saving: the restored rules see the same change again.
    replay = evaluate(DcgmRules.from_state(saved), text(xid0=48))
    assert [fid for fid, _ in first] == [fid for fid, _ in replay] == [f"n1:dcgm:{U0}:xid:1"]


def test_host_simulated_uuids_are_unique_per_host() -> None:
    a, b = host_simulated(2, "n1"), host_simulated(2, "n2")
    assert {d.uuid for d in a}.isdisjoint({d.uuid for d in b})
    assert (
        [d.pci_bus_id for d in a] == [d.pci_bus_id for d in b] == ["0000:10:00.0", "0000:11:00.0"]
    )
    assert host_simulated(2, "n1") == a


def test_a_climbing_single_bit_ecc_count_is_one_trend_finding(tmp_path) -> None:
    """DCGM's SBE counter rising poll after poll is counted into the node's rate rule
    (decision 0515): one trend finding naming the card, asking for a drain at the job's
    next checkpoint; the agent buffers it with a stable id."""
    from trainguard.agent.agent import Agent, AgentOptions

    metrics = tmp_path / "metrics.prom"
    clock = [T0]
    agent = Agent(
        AgentOptions(
            server="http://127.0.0.1:9",
            token="t",
            host="n1",
            buffer_dir=tmp_path / "agent",
            metrics_file=str(metrics),
            devices=2,
            use_system_kernel_log=False,
            clock=lambda: clock[0],
        )
    )
    u0 = agent.devices[0].uuid
    found = 0
    for i in range(5):  # one more single-bit error every ten minutes
        metrics.write_text(f'DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{gpu="0",UUID="{u0}"}} {i}\n')
        found += agent.poll_metrics()
        clock[0] += 600
    assert found == 1
    (entry,) = agent.buffer.peek()
    f = entry.record["finding"]
    assert f["kind"] == "trend" and f["culprit"]["device_uuid"] == u0
    assert f["details"]["rule"] == "ecc_creeping" and f["details"]["count"] == 3
    assert f["details"]["action"] == "drain_at_checkpoint"
