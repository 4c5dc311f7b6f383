"""A torchrun command as one node of an allocation attempt runs it
(policy/torchrun_args.py, decision 0510): only the placement's parts change."""

from __future__ import annotations

import pytest

from trainguard.policy.torchrun_args import (
    NotTorchrun,
    min_nodes_of,
    node_command,
    split,
    wanted_nodes,
)

USER = (
    "torchrun", "--nnodes", "2", "--nproc-per-node=4", "--rdzv-backend", "c10d",
    "--rdzv_endpoint", "head:29500", "--rdzv-id", "job7", "--rdzv-conf",
    "join_timeout=60,is_host=1", "train.py", "--lr", "3e-4", "--nnodes", "9",
)  # fmt: skip


def test_the_first_node_hosts_the_moved_rendezvous_and_the_script_is_untouched() -> None:
    cmd = node_command(USER, nodes=3, index=0, first_address="10.0.0.5", attempt=2, job="j")
    assert cmd[0] == "torchrun"
    assert "--nnodes=3" in cmd and "--rdzv-endpoint=10.0.0.5:29500" in cmd
    assert "--rdzv-id=job7-a2" in cmd
    assert "--rdzv-conf=join_timeout=60,is_host=1" in cmd
    assert "--nproc-per-node=4" in cmd and "--rdzv-backend=c10d" in cmd
    assert cmd[-5:] == ("train.py", "--lr", "3e-4", "--nnodes", "9")  # the script's own


def test_other_nodes_do_not_host() -> None:
    cmd = node_command(USER, nodes=2, index=1, first_address="h", attempt=0, job="j")
    assert "--rdzv-conf=join_timeout=60,is_host=0" in cmd


def test_python_m_form_and_default_port_and_job_id() -> None:
    user = ("python3", "-m", "torch.distributed.run", "--nnodes=1:4", "--rdzv-backend=c10d",
            "--rdzv-endpoint=head", "t.py")  # fmt: skip
    cmd = node_command(user, nodes=2, index=0, first_address="fe80::1", attempt=1, job="77")
    assert cmd[:3] == ("python3", "-m", "torch.distributed.run")
    assert "--rdzv-endpoint=[fe80::1]:29400" in cmd and "--rdzv-id=77-a1" in cmd
    assert wanted_nodes(user) == 4 and min_nodes_of(user) == 1


def test_static_backend_gets_master_addr_and_node_rank() -> None:
    user = ("torchrun", "--nnodes", "2", "--master-addr", "old", "--master-port", "1234",
            "--node-rank", "0", "t.py")  # fmt: skip
    cmd = node_command(user, nodes=2, index=1, first_address="new", attempt=0, job="j")
    assert "--master-addr=new" in cmd and "--node-rank=1" in cmd and "--master-port=1234" in cmd
    assert "old" not in cmd


@pytest.mark.parametrize(
    "command",
    [("python", "train.py"), ("torchrun", "--standalone", "t.py"), ("torchrun", "--nnodes")],
)
def test_commands_that_cannot_span_nodes_are_refused(command: tuple[str, ...]) -> None:
    with pytest.raises(NotTorchrun):
        node_command(command, nodes=1, index=0, first_address="h", attempt=0, job="j")


def test_flags_take_no_value() -> None:
    launch = split(("torchrun", "--no-python", "-m", "--nnodes", "2", "mod", "x"))
    assert launch.script == ("mod", "x") and launch.get("--nnodes") == "2"
