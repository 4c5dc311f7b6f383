"""Slurm's output -> records, validation of names, opt-in comments (pure; recorded output).

The fixtures in ``tests/slurm/fixtures`` are real output of Debian's Slurm 22.05 from the
local test cluster (``scripts/slurm-local.sh``): a running 2-node job holding GPUs 0-1 on
each node (name with a space, opted in through its comment), a job requeued twice and
cancelled, a failed job, a requeued job with trainguard's capacity note; node n3 drained
with a trainguard reason and n4 not responding.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainguard.schedulers.slurm import names
from trainguard.schedulers.slurm.optin import parse_opt_in
from trainguard.schedulers.slurm.parse import (
    ParseError,
    expand_output_path,
    parse_gres_indices,
    parse_kv_line,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    parse_sinfo_json,
    parse_squeue_json,
    split_status,
)

FIX = Path(__file__).resolve().parents[1] / "slurm" / "fixtures"


def _by_id(jobs: list) -> dict:  # type: ignore[type-arg]
    return {j.job_id: j for j in jobs}


def test_squeue_json_jobs() -> None:
    jobs = _by_id(parse_squeue_json((FIX / "squeue.json").read_text()))
    run = jobs["12"]
    assert (run.state, run.restarts, run.name) == ("RUNNING", 0, "two words")
    assert run.nodes == ("n1", "n2") and run.gpus == {"n1": (0, 1), "n2": (0, 1)}
    assert run.gpus_per_node == 2 and run.node_count == 2 and run.attempt_started
    assert expand_output_path(run.stdout, run) == "/tmp/sx/f-two words-12.out"
    opt = parse_opt_in(run.comment)
    assert opt is not None and opt.policy == "fast" and opt.checkpoint_dir == "/ck/run"
    requeued = jobs["1"]
    assert (requeued.state, requeued.restarts, requeued.excluded) == ("CANCELLED", 2, ("n2",))
    failed = jobs["9"]
    assert failed.state == "FAILED" and split_status(failed.exit_status) == (1, None)
    waiting = jobs["11"]
    assert waiting.admin_comment.startswith("trainguard: waiting for capacity")
    assert waiting.nodes == ("n1", "n3")


def test_scontrol_fallback_agrees_with_the_json() -> None:
    from_json = _by_id(parse_squeue_json((FIX / "squeue.json").read_text()))
    from_kv = _by_id(parse_scontrol_jobs((FIX / "scontrol_job.txt").read_text()))
    assert set(from_kv) == set(from_json)
    for jid, a in from_json.items():
        b = from_kv[jid]
        assert (a.state, a.restarts, a.nodes, a.excluded, a.node_count, a.partition) == (
            b.state,
            b.restarts,
            b.nodes,
            b.excluded,
            b.node_count,
            b.partition,
        ), jid
        assert a.comment == b.comment and a.admin_comment == b.admin_comment, jid
        assert split_status(a.exit_status) == split_status(b.exit_status), jid
        assert a.gpus_per_node == b.gpus_per_node, jid
    assert from_kv["12"].gpus == {"n1": (0, 1), "n2": (0, 1)}


def test_nodes_from_json_and_scontrol() -> None:
    nodes = {n.name: n for n in parse_sinfo_json((FIX / "sinfo.json").read_text())}
    kv = {n.name: n for n in parse_scontrol_nodes((FIX / "scontrol_node.txt").read_text())}
    for source in (nodes, kv):
        assert source["n3"].drained and not source["n3"].down
        assert source["n3"].reason == "trainguard incident 3: XID 79 on n3"
        assert source["n4"].not_responding and source["n4"].down
        assert not source["n1"].drained and not source["n1"].down
        assert source["n1"].gpu_count == 4
    assert kv["n3"].reason_by == "root"


def test_down_drain_by_trainguard_with_slurmd_answering_is_held_not_lost() -> None:
    """After a power cycle Slurm keeps the node DOWN+DRAIN (trainguard's reason replaced its
    "Not responding"; seen on Slurm 22.05, FIELD-NOTES 2026-12-04): its slurmd answers, so
    it is held (drained), not lost, and resumed after validation (decision 0415)."""
    line = (
        "NodeName=n4 Arch=x86_64 CPUTot=4 State={state} Partitions=gpu "
        "Reason={reason} [root@2026-12-04T17:27:18]"
    )
    held = parse_scontrol_nodes(
        line.format(state="DOWN+DRAIN", reason="trainguard: node recovery: hung")
    )[0]
    assert held.held_down_by_trainguard and held.drained and not held.down
    lost = parse_scontrol_nodes(
        line.format(state="DOWN*+DRAIN", reason="trainguard: node recovery: hung")
    )[0]
    assert lost.down and not lost.held_down_by_trainguard  # slurmd still silent
    theirs = parse_scontrol_nodes(line.format(state="DOWN+DRAIN", reason="bad DIMM"))[0]
    assert theirs.down and not theirs.held_down_by_trainguard  # an operator's: left alone


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu:1(IDX:0)", (0,)),
        ("gpu:4(IDX:0-3)", (0, 1, 2, 3)),
        ("gpu:a100:2(IDX:1,3)", (1, 3)),
        ("gpu:h100:3(IDX:0,2-3)", (0, 2, 3)),
        ("gpu:0(IDX:N/A)", ()),
        ("", ()),
        ("garbage(IDX:x-y)", ()),
    ],
)
def test_gres_indices(text: str, expected: tuple[int, ...]) -> None:
    assert parse_gres_indices(text) == expected


def test_statuses() -> None:
    assert split_status(0) == (0, None)
    assert split_status(768) == (3, None)
    assert split_status(15) == (None, 15)
    assert split_status(None) == (None, None)


def test_kv_lines_keep_spaces_in_values() -> None:
    pairs = parse_kv_line("JobId=3 Comment=two words here Reason=None StdOut=/a b/c")
    assert pairs == [
        ("JobId", "3"),
        ("Comment", "two words here"),
        ("Reason", "None"),
        ("StdOut", "/a b/c"),
    ]


@pytest.mark.parametrize("garbage", ["", "not json", "[]", '{"jobs": 3}', '{"nodes": null}'])
def test_garbage_output_is_a_clear_error(garbage: str) -> None:
    with pytest.raises(ParseError):
        parse_squeue_json(garbage)
    with pytest.raises(ParseError):
        parse_sinfo_json(garbage)
    assert parse_scontrol_jobs(garbage) == []


def test_hostlists() -> None:
    assert names.expand_hostlist("n[1-3,7]") == ["n1", "n2", "n3", "n7"]
    assert names.expand_hostlist("gpu[01-03]x,login") == ["gpu01x", "gpu02x", "gpu03x", "login"]
    assert names.expand_hostlist("(null)") == [] and names.expand_hostlist(None) == []
    assert names.hostlist(["n3", "n1", "n3"]) == "n1,n3"
    for bad in ("n[3-1]", "n[a-b]", "n[1-2"):
        with pytest.raises(names.InvalidName):
            names.expand_hostlist(bad)


@pytest.mark.parametrize(
    "bad", ["", "--all", "-n1", "n1 n2", "n1;reboot", "n[1-2]", "n1\n", "a" * 80, "n1,n2"]
)
def test_node_names_are_validated(bad: str) -> None:
    with pytest.raises(names.InvalidName):
        names.node(bad)


@pytest.mark.parametrize("bad", ["", "12a", "-1", "1 2", "1;2", "1_", "_1", "123+0"])
def test_job_ids_are_validated(bad: str) -> None:
    with pytest.raises(names.InvalidName):
        names.job_id(bad)


def test_reason_text_is_cleaned() -> None:
    assert names.text("a\nb\tc  d\x00e") == "a b c d e"
    assert len(names.text("x" * 1000)) == names.MAX_REASON
    with pytest.raises(names.InvalidName):
        names.text(" \n ")
    assert names.job_id(" 12_3 ") == "12_3"


@pytest.mark.parametrize(
    ("comment", "policy", "ckpt", "mode"),
    [
        ("trainguard", None, None, None),
        ("trainguard:policy=big", "big", None, None),
        ("run 7; trainguard:policy=big,ckpt=/ck/x", "big", "/ck/x", None),
        ("trainguard:mode=observe", None, None, "observe"),
    ],
)
def test_opt_in(comment: str, policy: str | None, ckpt: str | None, mode: str | None) -> None:
    opt = parse_opt_in(comment)
    assert opt is not None
    assert (opt.policy, opt.checkpoint_dir, opt.mode) == (policy, ckpt, mode)


@pytest.mark.parametrize(
    "comment", [None, "", "nightly run", "trainguardx", "no-trainguard", "trainguard:off"]
)
def test_no_opt_in(comment: str | None) -> None:
    assert parse_opt_in(comment) is None


def test_unknown_opt_in_keys_are_kept_not_fatal() -> None:
    opt = parse_opt_in("trainguard:polcy=x,mode=sometimes")
    assert opt is not None and opt.policy is None and opt.mode is None
    assert opt.unknown == {"polcy": "x", "mode": "sometimes"}


def test_json_fixture_is_real_slurm_output() -> None:
    meta = json.loads((FIX / "squeue.json").read_text())["meta"]
    assert meta["Slurm"]["release"].startswith("22.05")
