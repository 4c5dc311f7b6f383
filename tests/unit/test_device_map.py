"""The job's device map (diagnose/device_map.py): which rank had a device when
ranks != devices, and the attribution that names it (issue 13)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trainguard.diagnose.attribution import attribute
from trainguard.diagnose.detectors import rank_using
from trainguard.diagnose.device_map import (
    merge_views,
    rank_views,
    reported_views,
    torchrun_world_size,
)
from trainguard.model import Culprit, Device, Domain, Finding, Severity
from trainguard.model.records import RankReport

T0 = 1_700_000_000.0
# Two nodes with two GPUs each, in launch order (TRAINGUARD_DEVICES, node by node).
TWO_BY_TWO = tuple(
    Device(index=i % 2, uuid=f"GPU-{i}", pci_bus_id=f"0000:1{i % 2}:00.0", host=f"n{i // 2 + 1}")
    for i in range(4)
)


def xid_on(dev: Device) -> Finding:
    return Finding(
        kind="xid",
        domain=Domain.HARDWARE,
        at=T0,
        source="kernel_log",
        message=f"NVRM: Xid (PCI:{dev.pci_bus_id[:-2]}): 79, pid=1, GPU has fallen off the bus.",
        culprit=Culprit(device_uuid=dev.uuid, pci_bus_id=dev.pci_bus_id, host=dev.host),
        signature="xid:79",
        xid=79,
        severity=Severity.FATAL,
    )


def test_a_two_rank_job_on_two_two_gpu_nodes_names_rank_one_not_rank_three() -> None:
    command = ("torchrun", "--nnodes", "2", "--nproc-per-node", "1", "train.py")
    views = rank_views(TWO_BY_TWO, torchrun_world_size(command))
    assert [v.rank for v in views] == [0, 1]
    a = attribute([xid_on(TWO_BY_TWO[3])], TWO_BY_TWO, failed_at=T0, views=views)
    assert a.culprit.device_uuid == "GPU-3" and a.culprit.rank == 1
    assert "rank 3" not in a.summary
    # Without the map the position names a rank that does not exist: the old answer.
    assert attribute([xid_on(TWO_BY_TWO[3])], TWO_BY_TWO, failed_at=T0).culprit.rank == 3


def test_one_rank_per_device_keeps_the_position() -> None:
    views = rank_views(TWO_BY_TWO, 4)
    assert [v.visible for v in views] == [("GPU-0",), ("GPU-1",), ("GPU-2",), ("GPU-3",)]
    a = attribute([xid_on(TWO_BY_TWO[2])], TWO_BY_TWO, failed_at=T0, views=views)
    assert a.culprit.rank == 2


def test_an_unknown_or_uneven_world_size_gives_no_map() -> None:
    assert rank_views(TWO_BY_TWO, None) == ()
    assert rank_views(TWO_BY_TWO, 3) == ()
    assert torchrun_world_size(("python", "train.py")) is None


@given(nodes=st.integers(1, 4), gpus=st.integers(1, 4), per=st.integers(1, 4))
def test_every_device_maps_to_an_existing_rank_on_its_own_node(
    nodes: int, gpus: int, per: int
) -> None:
    devices = tuple(
        Device(index=g, uuid=f"GPU-{n}-{g}", pci_bus_id=f"0000:{g:02x}:00.0", host=f"n{n}")
        for n in range(nodes)
        for g in range(gpus)
    )
    views = rank_views(devices, nodes * per)
    assert len(views) == nodes * per
    for d in devices:
        known, rank = rank_using(views, d)
        assert known
        if rank is not None:
            # Never a rank outside the world, and always one on the device's node.
            assert 0 <= rank < nodes * per and rank // per == int(d.host[1:])


def test_the_ranks_own_reports_map_devices_for_a_launcher_without_a_command_line() -> None:
    # mp.spawn / srun: no torchrun world size, so no derived map. The ranks reported
    # their node, LOCAL_RANK and CUDA_VISIBLE_DEVICES (0322): 2 ranks, one per node,
    # each seeing both of its node's cards and using the first (index 0 on n1, the
    # second card of n2 by UUID).
    reports = (
        RankReport(rank=0, host="n1", local_rank=0, visible=("0", "1")),
        RankReport(rank=1, host="n2", local_rank=0, visible=("GPU-3", "GPU-2")),
    )
    views = merge_views(reported_views(reports, TWO_BY_TWO), rank_views(TWO_BY_TWO, None))
    assert [v.visible for v in views] == [("GPU-0", "GPU-1"), ("GPU-3", "GPU-2")]
    a = attribute([xid_on(TWO_BY_TWO[3])], TWO_BY_TWO, failed_at=T0, views=views)
    assert a.culprit.device_uuid == "GPU-3" and a.culprit.rank == 1
    # GPU-0 is rank 0's; n2's first card by index is no rank's own (not "rank 2").
    assert rank_using(views, TWO_BY_TWO[0]) == (True, 0)
    assert rank_using(views, TWO_BY_TWO[2])[1] in (None, 1)


def test_an_index_resolves_only_on_the_ranks_own_node() -> None:
    # Index 1 is a card on both nodes: a rank whose node is unknown names neither.
    lost = reported_views((RankReport(1, "elsewhere", 0, ("1",)),), TWO_BY_TWO)
    assert rank_using(lost, TWO_BY_TWO[1]) == (True, None)
    assert rank_using(lost, TWO_BY_TWO[3]) == (True, None)
    # One node: its name need not match the host name the rank reported.
    one = TWO_BY_TWO[:2]
    (v,) = reported_views((RankReport(0, "a-hostname", None, ("1",)),), one)
    assert v.visible == ("GPU-1",) and rank_using((v,), one[1]) == (True, 0)


def test_reports_come_first_and_unreported_ranks_keep_the_launch_view() -> None:
    derived = rank_views(TWO_BY_TWO, 4)
    reported = reported_views((RankReport(2, "n2", 0, ("1",)),), TWO_BY_TWO)
    merged = merge_views(reported, derived)
    assert sorted(v.rank or 0 for v in merged) == [0, 1, 2, 3]
    assert next(v for v in merged if v.rank == 2).visible == ("GPU-3",)


def test_a_rank_that_reported_progress_only_keeps_the_launchs_view() -> None:
    # A rank-prefixed step line says the rank reports (0350), not which card it has.
    bare = (RankReport(1, None, None, ()),)
    assert reported_views(bare, TWO_BY_TWO) == ()
    views = merge_views(reported_views(bare, TWO_BY_TWO), rank_views(TWO_BY_TWO, None))
    assert views == rank_views(TWO_BY_TWO, None)
