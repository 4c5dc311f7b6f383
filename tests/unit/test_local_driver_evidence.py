"""What the engine driver hands the engine (controller/local_driver.py, decision 0389):
a kernel-log finding names this machine's host, and a progress datagram's rank and
the job's own time reach the attempt's record."""

from __future__ import annotations

from pathlib import Path

from trainguard.controller.local_driver import rank_view
from trainguard.controller.service import ControlPlane
from trainguard.diagnose.kernel_finding import own_host as this_host
from trainguard.model.devices import Device
from trainguard.model.findings import Culprit, Domain, Finding, Severity
from trainguard.model.progress import ProgressEvent
from trainguard.model.records import RankReport
from trainguard.store import Store


def _device(i: int, host: str) -> Device:
    return Device(index=i, uuid=f"GPU-{host}{i}", pci_bus_id=f"0000:{0x10 + i:02x}:00.0", host=host)


def _finding(domain: Domain, host: str | None = None) -> Finding:
    return Finding(
        kind="network_error" if domain is Domain.NETWORK else "oom_killer",
        domain=domain,
        at=1.0,
        source="kernel_log",
        message="mlx5_core 0000:c1:00.0: Port module event: Link down",
        severity=Severity.ERROR,
        culprit=Culprit(host=host),
    )


def test_a_nic_event_of_this_machine_names_its_one_host() -> None:
    one = [_device(0, "hosta"), _device(1, "hosta")]
    f, host = this_host(_finding(Domain.NETWORK), one)
    assert host == "hosta" and f.culprit.host == "hosta"
    # Host-level evidence is stored as this host's, its culprit left as it was.
    g, host = this_host(_finding(Domain.NODE), one)
    assert host == "hosta" and g.culprit.host is None


def test_two_hosts_on_one_machine_name_none_and_a_named_host_is_kept() -> None:
    two = [_device(0, "hosta"), _device(1, "hostb")]
    f, host = this_host(_finding(Domain.NETWORK), two)
    assert host is None and f.culprit.host is None
    f, host = this_host(_finding(Domain.NETWORK, host="hostb"), [_device(0, "hosta")])
    assert host == "hostb" and f.culprit.host == "hostb"


def test_progress_keeps_the_rank_that_reported_and_the_jobs_time(tmp_path: Path) -> None:
    with Store.open(tmp_path / "state.db", at=0.0) as store:
        plane = ControlPlane(store, None, clock=lambda: 10.0)
        job = store.jobs.create_job(name="j", command=("true",), need=1, at=0.0)
        store.jobs.start_attempt(job.id, 0, [_device(0, "hosta")], at=0.0)
        plane.ingest_progress(job.id, 0, 3, at=5.0, rank=1, job_time=4.5)
        plane.ingest_progress(job.id, 0, 4, at=6.0, rank=1, job_time=5.5)
        att = store.jobs.get_attempt(job.id, 0)
    assert [r.rank for r in att.rank_reports] == [1]
    assert att.job_first_step == 3


def test_a_progress_event_carries_its_ranks_view_of_its_devices(tmp_path: Path) -> None:
    e = ProgressEvent("progress", 3, 4.5, rank=1, local_rank=1, visible_devices="2, 3", host="h")
    view = rank_view(e)
    assert view == RankReport(rank=1, host="h", local_rank=1, visible=("2", "3"))
    assert rank_view(ProgressEvent("progress", 3, 4.5, rank=1)) is None
    with Store.open(tmp_path / "state.db", at=0.0) as store:
        job = store.jobs.create_job(name="j", command=("true",), need=1, at=0.0)
        store.jobs.start_attempt(job.id, 0, [_device(0, "hosta")], at=0.0)
        ControlPlane(store, None).ingest_progress(job.id, 0, 3, rank=1, view=view)
        assert store.jobs.get_attempt(job.id, 0).rank_reports == (view,)
