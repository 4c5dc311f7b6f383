"""Attribution of an attempt's findings to one root cause: evidence beats symptom."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.diagnose.attribution import attribute, with_link_evidence
from trainguard.diagnose.detectors import ProcessExit, crash_finding
from trainguard.model import Culprit, Device, Domain, Finding, IncidentKind, Severity

T0 = 1_700_000_000.0
DEVICES = (
    Device(index=0, uuid="GPU-0", pci_bus_id="0000:10:00.0"),
    Device(index=1, uuid="GPU-1", pci_bus_id="0000:11:00.0"),
)


def crash(
    rank: int,
    at: float,
    sig: int | None = None,
    code: int | None = None,
    devices: tuple[Device, ...] = DEVICES,
) -> Finding:
    f = crash_finding(
        ProcessExit(at=at, source="rank", rank=rank, local_rank=rank, signal=sig, exit_code=code),
        devices,
    )
    assert f is not None
    return f


def line(
    kind: str,
    at: float,
    rank: int | None,
    text: str,
    domain: Domain,
    signature: str | None = None,
    pci: str | None = None,
    uuid: str | None = None,
    xid: int | None = None,
) -> Finding:
    return Finding(
        kind=kind,
        domain=domain,
        at=at,
        source="output" if pci is None else "kernel_log",
        message=text,
        evidence=(text,),
        culprit=Culprit(rank=rank, pci_bus_id=pci, device_uuid=uuid),
        signature=signature or f"{kind}:{text}",
        xid=xid,
        severity=Severity.FATAL,
    )


def xid79(at: float, pci: str = "0000:11:00.0", uuid: str | None = "GPU-1") -> Finding:
    return line(
        "xid",
        at,
        None,
        f"NVRM: Xid (PCI:{pci[:-2]}): 79, pid=1, GPU has fallen off the bus.",
        Domain.HARDWARE,
        signature="xid:79",
        pci=pci,
        uuid=uuid,
        xid=79,
    )


def gloo_reset(rank: int, at: float) -> Finding:
    return line(
        "collective_error",
        at,
        rank,
        f"[rank{rank}]: RuntimeError: Connection closed by peer",
        Domain.NETWORK,
    )


def test_crash_with_an_xid_on_the_ranks_device_is_hardware() -> None:
    findings = [crash(1, T0 + 0.2, sig=9), gloo_reset(0, T0 + 0.3), xid79(T0)]
    a = attribute(findings, DEVICES, failed_at=T0 + 0.2)
    assert a.kind is IncidentKind.XID and a.domain is Domain.HARDWARE
    assert a.culprit.device_uuid == "GPU-1" and a.culprit.rank == 1
    assert a.signature == "xid:79"
    assert any("Xid" in e for e in a.evidence)
    assert any(f.kind == "crash" for f in a.findings)


def test_xid_arriving_after_the_crash_within_the_window_still_wins() -> None:
    findings = [crash(0, T0, sig=9), xid79(T0 + 5)]
    a = attribute(findings, DEVICES, failed_at=T0)
    assert a.domain is Domain.HARDWARE and a.culprit.rank == 1


def test_xid_outside_the_correlation_window_is_not_evidence() -> None:
    findings = [crash(1, T0, sig=9), xid79(T0 - 500)]
    a = attribute(findings, DEVICES, failed_at=T0, window=60)
    assert a.kind is IncidentKind.CRASH and a.domain is Domain.UNKNOWN


def test_xid_on_a_device_the_job_does_not_use_is_not_its_cause() -> None:
    findings = [crash(1, T0, sig=9), xid79(T0, pci="0000:99:00.0", uuid="GPU-9")]
    a = attribute(findings, DEVICES, failed_at=T0)
    assert a.domain is Domain.UNKNOWN and a.kind is IncidentKind.CRASH


def test_killed_rank_with_peers_failing_is_a_crash_of_the_killed_rank() -> None:
    findings = [gloo_reset(0, T0 + 0.05), crash(1, T0, sig=9), crash(0, T0 + 0.2, code=1)]
    a = attribute(findings, DEVICES, failed_at=T0)
    assert a.kind is IncidentKind.CRASH
    assert a.culprit.rank == 1 and a.culprit.device_uuid == "GPU-1"
    assert "SIGKILL" in a.summary and "peers then failed" in a.summary


def test_python_error_of_the_root_rank_is_an_application_error() -> None:
    sig = "app_error:ValueError: injected failure at step N"
    findings = [
        line("app_error", T0, 1, "[rank1]: ValueError: injected", Domain.APPLICATION, sig),
        gloo_reset(0, T0 + 0.01),
        crash(1, T0 + 0.05, code=1),
        crash(0, T0 + 0.2, sig=15),
        line(
            "app_error",
            T0 + 0.3,
            None,
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
            Domain.APPLICATION,
        ),
    ]
    a = attribute(findings, DEVICES, failed_at=T0 + 0.05)
    assert a.kind is IncidentKind.APP_ERROR and a.domain is Domain.APPLICATION
    assert a.culprit.rank == 1 and a.signature == sig


def test_peer_python_error_after_a_kill_is_a_symptom() -> None:
    findings = [
        crash(1, T0, sig=9),
        line("app_error", T0 + 0.1, 0, "[rank0]: RuntimeError: oops", Domain.APPLICATION),
    ]
    a = attribute(findings, DEVICES, failed_at=T0)
    assert a.kind is IncidentKind.CRASH and a.culprit.rank == 1


def test_mp_spawn_summary_of_a_killed_rank_is_no_cause() -> None:
    spawn_summary = (
        "torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with "
        "signal SIGKILL"
    )
    findings = [
        crash(0, T0, sig=9),
        line("app_error", T0 + 0.1, None, spawn_summary, Domain.APPLICATION),
    ]
    a = attribute(findings, DEVICES, failed_at=T0)
    assert a.kind is IncidentKind.CRASH and a.culprit.rank == 0


def test_oom_beats_the_traceback_it_ends_in() -> None:
    findings = [
        line("cuda_oom", T0, 0, "[rank0]: torch.OutOfMemoryError: CUDA out of memory.",
             Domain.APPLICATION, "cuda_oom"),
        line("app_error", T0 + 0.01, 0, "[rank0]: torch.OutOfMemoryError: CUDA out of memory.",
             Domain.APPLICATION),
        crash(0, T0 + 0.1, code=1),
    ]  # fmt: skip
    a = attribute(findings, DEVICES, failed_at=T0 + 0.1)
    assert a.kind is IncidentKind.OOM and a.domain is Domain.APPLICATION
    assert a.culprit.rank == 0 and a.culprit.device_uuid == "GPU-0"


def test_uncorrectable_ecc_in_job_output_is_hardware() -> None:
    findings = [
        line("ecc_error", T0, 1, "[rank1]: CUDA error: uncorrectable ECC error encountered",
             Domain.HARDWARE),
        crash(1, T0 + 0.1, code=1),
    ]  # fmt: skip
    a = attribute(findings, DEVICES, failed_at=T0 + 0.1)
    assert a.domain is Domain.HARDWARE and a.kind is IncidentKind.CUDA_ERROR
    assert a.culprit.device_uuid == "GPU-1"


def test_collective_timeout_without_a_crash_is_network() -> None:
    findings = [
        line("collective_timeout", T0, 0, "[rank0]: Watchdog caught collective operation timeout",
             Domain.NETWORK),
    ]  # fmt: skip
    a = attribute(findings, DEVICES, failed_at=T0)
    assert a.kind is IncidentKind.COLLECTIVE_TIMEOUT and a.domain is Domain.NETWORK


def test_hang_alone_is_a_hang() -> None:
    hang = Finding(
        kind="hang",
        domain=Domain.UNKNOWN,
        at=T0,
        source="detector:hang",
        message="no progress for 5 s",
        culprit=Culprit(rank=1),
        signature="hang",
    )
    a = attribute([hang], DEVICES, failed_at=T0)
    assert a.kind is IncidentKind.HANG and a.culprit.device_uuid == "GPU-1"


def test_hang_with_an_xid_is_hardware() -> None:
    hang = Finding(
        kind="hang", domain=Domain.UNKNOWN, at=T0, source="detector:hang", message="no progress"
    )
    a = attribute([hang, xid79(T0 - 3)], DEVICES, failed_at=T0)
    assert a.domain is Domain.HARDWARE and a.culprit.rank == 1


def test_no_findings_at_all_still_gives_an_attribution() -> None:
    a = attribute([], DEVICES, failed_at=T0)
    assert a.kind is IncidentKind.CRASH and a.domain is Domain.UNKNOWN and a.confidence < 0.5


def test_a_rank_killed_by_the_host_oom_killer_is_the_jobs_memory_use() -> None:
    oom_killer = line(
        "host_oom",
        T0 - 0.01,
        None,
        "Out of memory: Killed process 4242 (python) total-vm:9000000kB",
        Domain.USER_CONFIG,
        signature="host_oom:Out of memory: Killed process <n> (python)",
    )
    a = attribute([crash(1, T0, sig=9), oom_killer], DEVICES, failed_at=T0)
    assert a.kind is IncidentKind.CRASH and a.domain is Domain.USER_CONFIG
    assert a.culprit.rank == 1 and a.signature == oom_killer.signature
    assert "Out of memory" in a.summary


def test_same_pci_slot_on_another_host_is_a_different_device() -> None:
    # Every node of a cluster has the same PCI layout: a bus id names a card only
    # together with its host, and a UUID names it alone.
    two_hosts = (
        Device(index=0, uuid="GPU-n1-0", pci_bus_id="0000:10:00.0", host="n1"),
        Device(index=0, uuid="GPU-n2-0", pci_bus_id="0000:10:00.0", host="n2"),
    )
    by_uuid = xid79(T0, pci="0000:10:00.0", uuid="GPU-n2-0")
    a = attribute([crash(0, T0, sig=9), by_uuid], two_hosts, failed_at=T0)
    assert a.domain is Domain.HARDWARE and a.culprit.device_uuid == "GPU-n2-0"
    assert a.culprit.host == "n2" and a.culprit.rank == 1

    other_host = Finding(
        kind="xid",
        domain=Domain.HARDWARE,
        at=T0,
        source="kernel_log",
        message="NVRM: Xid (PCI:0000:10:00): 79, GPU has fallen off the bus.",
        culprit=Culprit(pci_bus_id="0000:10:00.0", host="n3"),
        xid=79,
        severity=Severity.FATAL,
    )
    a = attribute([crash(0, T0, sig=9), other_host], two_hosts, failed_at=T0)
    assert a.domain is Domain.UNKNOWN and a.kind is IncidentKind.CRASH


IB = "NCCL WARN NET/IB : Got completion from peer 10.0.0.2<42424> with error 12"


def test_link_evidence_is_kept_beside_a_gpu_fault_that_won() -> None:
    # One rule for run and serve (0353): decide() isolates the host it names too.
    ib = line("network_error", T0 + 1, 0, IB, Domain.NETWORK)
    ecc = line("ecc_error", T0 + 2, 0, "CUDA error: uncorrectable ECC error", Domain.HARDWARE)
    findings = [ib, ecc, crash(0, T0 + 3, code=1)]
    a = attribute(findings, DEVICES, T0 + 3)
    assert a.domain is Domain.HARDWARE and ib not in a.findings
    got = with_link_evidence(a, findings, T0 + 3)
    assert got.domain is Domain.HARDWARE and got.culprit == a.culprit
    assert got.findings == (*a.findings, ib) and f"[output] {IB}" in got.evidence
    assert with_link_evidence(got, findings, T0 + 3) == got  # nothing to add twice


def test_a_kernel_link_event_counts_only_with_network_trouble_in_the_job() -> None:
    down = Finding(
        kind="network_error",
        domain=Domain.NETWORK,
        at=T0 + 1,
        source="kernel_log",
        message="mlx5_core 0000:c1:00.0: Port module event: Link down",
        severity=Severity.FATAL,
    )
    alone = [down, crash(0, T0 + 2, code=1)]
    a = attribute(alone, DEVICES, T0 + 2)
    assert with_link_evidence(a, alone, T0 + 2) == a
    # With the job's own network trouble it counts, but only within the window.
    peer = line("collective_error", T0 + 1.5, 0, "Connection closed by peer", Domain.NETWORK)
    near = [down, peer, crash(0, T0 + 2, code=1)]
    assert down in with_link_evidence(attribute(near, DEVICES, T0 + 2), near, T0 + 2).findings
    far = [down, peer, crash(0, T0 + 500, code=1)]
    got = with_link_evidence(attribute(far, DEVICES, T0 + 500), far, T0 + 500, 60.0)
    assert down not in got.findings


# An application error every rank raised alike names no device (decision 0533).

FOUR = tuple(Device(index=i, uuid=f"GPU-{i}", pci_bus_id=f"0000:1{i}:00.0") for i in range(4))


def _exit(rank: int, at: float, code: int | None = None, sig: int | None = None) -> Finding:
    return crash(rank, at, sig=sig, code=code, devices=FOUR)


def test_a_key_error_on_every_rank_names_no_device_nor_rank() -> None:
    sig = "app_error:KeyError: 'labels'"
    findings = [
        *(
            line("app_error", T0 + r * 0.01, r, f"[rank{r}]: KeyError: 'labels'",
                 Domain.APPLICATION, sig)
            for r in range(4)
        ),
        *(_exit(r, T0 + 0.1 + r * 0.01, code=1) for r in (2, 0, 3, 1)),
    ]  # fmt: skip
    a = attribute(findings, FOUR, failed_at=T0 + 0.1)
    assert a.kind is IncidentKind.APP_ERROR and a.domain is Domain.APPLICATION
    assert a.culprit.device_uuid is None and a.culprit.pci_bus_id is None
    assert a.culprit.rank is None and a.signature == sig
    assert "several ranks alike" in a.summary and "GPU-" not in a.summary


def test_unlabelled_tracebacks_of_several_ranks_that_exited_with_errors_name_no_device() -> None:
    # torchrun without --tee: the lines name no rank; two ranks exited with code 1.
    sig = "app_error:RuntimeError: loss is NaN"
    findings = [
        line("app_error", T0, None, "RuntimeError: loss is NaN", Domain.APPLICATION, sig),
        line("app_error", T0 + 0.01, None, "RuntimeError: loss is NaN", Domain.APPLICATION, sig),
        _exit(1, T0 + 0.05, code=1),
        _exit(0, T0 + 0.06, code=1),
    ]
    a = attribute(findings, FOUR, failed_at=T0 + 0.05)
    assert a.kind is IncidentKind.APP_ERROR and a.culprit.device_uuid is None


def test_one_ranks_error_whose_peers_were_stopped_still_names_its_rank_and_device() -> None:
    sig = "app_error:ValueError: bad batch"
    findings = [
        line("app_error", T0, None, "ValueError: bad batch", Domain.APPLICATION, sig),
        _exit(1, T0 + 0.05, code=1),
        _exit(0, T0 + 0.2, sig=15),  # torchrun stopped its peer: it raised nothing
    ]
    a = attribute(findings, FOUR, failed_at=T0 + 0.05)
    assert a.culprit.rank == 1 and a.culprit.device_uuid == "GPU-1"


@settings(max_examples=300, deadline=None)
@given(
    ranks=st.integers(min_value=2, max_value=4),
    labelled=st.booleans(),
    order=st.randoms(use_true_random=False),
    gaps=st.lists(st.floats(min_value=0, max_value=5, allow_nan=False), min_size=8, max_size=8),
    message=st.sampled_from(
        ["KeyError: 'labels'", "RuntimeError: loss is NaN", "ValueError: shape mismatch"]
    ),
)
def test_symmetric_evidence_across_ranks_never_yields_a_device(
    ranks: int, labelled: bool, order: Any, gaps: list[float], message: str
) -> None:
    sig = f"app_error:{message}"
    findings = []
    for r in range(ranks):
        text = f"[rank{r}]: {message}" if labelled else message
        findings.append(
            line("app_error", T0 + gaps[r], r if labelled else None, text, Domain.APPLICATION, sig)
        )
        findings.append(_exit(r, T0 + gaps[r] + gaps[4 + r % 4], code=1))
    order.shuffle(findings)
    first_exit = min(f.at for f in findings if f.kind == "crash")
    a = attribute(findings, FOUR, failed_at=first_exit)
    assert a.kind is IncidentKind.APP_ERROR
    assert a.culprit.device_uuid is None and a.culprit.pci_bus_id is None
    assert a.culprit.rank is None
