"""Memory snapshots restored by the shard they hold, not the rank number (decision 0505).

Two "nodes" on this host: two real torchrun launchers (``--nnodes 2``, one gloo rank
each, static rendezvous), each with its own snapshot directory (its host's
``/dev/shm``), buddy copies over TCP between them. Restarts renumber the ranks (the
launchers join the other way round, a spare replaces a lost node): the ranks that
moved restore from the copies on their new host or from the other node's copy, and
the training stays bitwise identical to an uninterrupted run. Both nodes lost: the
disk, said so.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

JOB = Path(__file__).resolve().parents[1] / "jobs" / "tiny_train.py"
STEPS = 12


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _job(
    nodes: list[Path | None], args: list[str], attempt: int, log: Path | None = None
) -> tuple[list[int], str]:
    """One job of two launchers; ``nodes[k]`` is the snapshot directory ("host") of the
    launcher that takes node rank k. Returns the exit codes and both stderrs."""
    port = _free_port()
    procs = []
    for node_rank, host in enumerate(nodes):
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
        env.update(
            TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
            OMP_NUM_THREADS="1",
            TRAINGUARD_ATTEMPT=str(attempt),
        )
        if host is not None:
            env["TRAINGUARD_SNAPSHOT_DIR"] = str(host)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2"]
        cmd += ["--nproc-per-node", "1", "--node-rank", str(node_rank)]
        cmd += ["--master-addr", "127.0.0.1", "--master-port", str(port), "--max-restarts", "0"]
        cmd += [str(JOB), "--pg-timeout", "20", *args]
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    codes, errs = [], []
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        codes.append(proc.returncode)
        errs.append(err)
    if log is not None:  # the whole of both, for a failure's post-mortem
        log.write_text("\n".join(errs))
    return codes, "\n".join(errs)


def _losses(prefix: Path) -> dict[int, dict[int, set[str]]]:
    """rank -> step -> every loss (hex) any attempt logged for that step."""
    out: dict[int, dict[int, set[str]]] = {0: defaultdict(set), 1: defaultdict(set)}
    for rank, path in ((0, prefix), (1, Path(f"{prefix}.rank1"))):
        if path.exists():
            for line in path.read_text().splitlines():
                step, value = line.split("\t")
                out[rank][int(step)].add(value)
    return out


def test_renumbered_ranks_restore_from_memory_and_two_nodes_lost_use_the_disk(
    tmp_path: Path,
) -> None:
    ref = tmp_path / "ref.txt"
    codes, err = _job([None, None], ["--steps", str(STEPS), "--losses-out", str(ref)], 0)
    assert codes == [0, 0], err[-3000:]

    ck, losses = tmp_path / "ck", tmp_path / "losses.txt"
    common = ["--steps", str(STEPS), "--ckpt-dir", str(ck), "--losses-out", str(losses)]
    common += ["--save-every", "5", "--memory-snapshots", "--fault-rank", "1"]
    a, b, c = (tmp_path / n for n in ("nodeA", "nodeB", "nodeC"))

    codes, err = _job(
        [a, b], [*common, "--fail-at-step", "8", "--fault-attempt", "0"], 0, tmp_path / "a0.err"
    )
    assert codes != [0, 0] and "injected failure at step 8" in err
    assert list(a.glob("trainguard-*/*/buddy_of_rank_00001/slot*"))

    # The launchers join the other way round: rank 0 is now on B, rank 1 on A. Each
    # finds its shard's step 7 on its own host (B holds rank 1's old slots and rank
    # 0's buddy copy): memory, though no rank finds its own number. The copy of the
    # last step may not have arrived when the failing rank took its holder down with
    # it: then that shard comes from the other node's own slot, or the step before
    # is restored (still newer than the disk's 5).
    codes, err = _job(
        [b, a], [*common, "--fail-at-step", "10", "--fault-attempt", "1"], 1, tmp_path / "a1.err"
    )
    assert codes != [0, 0] and "injected failure at step 10" in err
    assert re.search(r"restored step [67] from memory snapshot", err), err[-4000:]
    # No rank restores from a slot of its own number: each from its shard's copy on its
    # new host, or (when that copy is of an older step) from the other node's.
    said = re.search(r"all 2 rank\(s\) valid; ([^;]*)(; ([^;]*))?; files hashed", err)
    assert said, err[-4000:]
    moved = said.group(0)
    local = re.search(r"rank\(s\) \[([0-9, ]*)\] renumbered: from the copy of their shard", moved)
    sent = re.search(r"rank\(s\) \[([0-9, ]*)\] from their buddy's copy", moved)
    ranks = sorted(int(r) for m in (local, sent) if m for r in m.group(1).split(", "))
    assert ranks == [0, 1], moved

    # Node B is lost; a spare C joins first and becomes rank 0: shard 0's newest copy
    # on A (its buddy copy of step 9; of an older step when the failing rank 1 went
    # down before the last copies reached it, a race of the failure, not the lookup)
    # is sent to C; rank 1 (A) has its own. Memory, newer than the disk's step 5.
    shutil.rmtree(b)
    codes, err = _job(
        [c, a], [*common, "--fail-at-step", "11", "--fault-attempt", "2"], 2, tmp_path / "a2.err"
    )
    assert codes != [0, 0] and "injected failure at step 11" in err
    assert re.search(r"restored step [6-9] from memory snapshot", err), err[-4000:]
    assert "rank(s) [0] from their buddy's copy" in err

    # Both nodes lost together (a shard's owner and its buddy): the disk's step 10.
    shutil.rmtree(a)
    shutil.rmtree(c)
    d, e = tmp_path / "nodeD", tmp_path / "nodeE"
    codes, err = _job([d, e], common, 3, tmp_path / "a3.err")
    assert codes == [0, 0], err[-4000:]
    assert "not restoring from memory: no memory snapshot" in err
    assert "resumed from" in err and "step 10" in err

    ref_losses, got = _losses(ref), _losses(losses)
    for rank in (0, 1):
        for step in range(1, STEPS + 1):
            assert got[rank][step], f"rank {rank} never logged step {step}"
            assert got[rank][step] == ref_losses[rank][step], f"rank {rank} step {step} differs"
    # The job completed: no snapshot of it is left on the nodes it ended on.
    assert not list(d.rglob("*.pt")) and not list(e.rglob("*.pt"))
