"""Checkpoint protection (decision 0251): the age of a job's newest valid checkpoint, its
last save, the policy limit, and the node-local storage flag from /proc/mounts — in the
pure helpers, on real checkpoint directories, in the API and in /metrics."""

from __future__ import annotations

import os
import pickle
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from fastapi.testclient import TestClient

from trainguard.api.app import create_app
from trainguard.api.auth import TokenTable
from trainguard.api.context import build_context
from trainguard.checkpoints.protection import (
    checkpoint_protection,
    is_shared_fstype,
    mount_of,
    parse_mounts,
    read_mounts,
)
from trainguard.controller.policies import PolicyError, parse_policy
from trainguard.controller.service import ControlPlane
from trainguard.store import Store

T0 = 1_764_400_000.0
OP = "operator-token-0123456789"

MOUNTS = """\
overlay / overlay rw,relatime 0 0
/dev/nvme0n1p1 /scratch ext4 rw,relatime 0 0
fs1:/export /shared nfs4 rw,vers=4.2 0 0
10.0.0.1@tcp:/lustre /lustre lustre rw 0 0
/dev/nvme1n1 /shared/local\\040disk xfs rw 0 0
s3fs /buckets fuse.s3fs rw 0 0
"""


def test_mounts_are_parsed_with_their_octal_escapes() -> None:
    mounts = parse_mounts(MOUNTS + "garbage\n")
    assert [m.point for m in mounts] == [
        "/",
        "/scratch",
        "/shared",
        "/lustre",
        "/shared/local disk",
        "/buckets",
    ]
    assert mounts[2].fstype == "nfs4" and mounts[2].source == "fs1:/export"


@pytest.mark.parametrize(
    ("path", "fstype", "shared"),
    [
        ("/scratch/run1/ckpt", "ext4", False),
        ("/scratchy/ckpt", "overlay", False),  # a prefix of the name is not a parent
        ("/shared/run1", "nfs4", True),
        ("/shared", "nfs4", True),
        ("/shared/local disk/run1", "xfs", False),  # a local disk mounted inside NFS
        ("/lustre/proj/ckpt", "lustre", True),
        ("/buckets/ckpt", "fuse.s3fs", True),
        ("/home/u/ckpt", "overlay", False),
    ],
)
def test_the_longest_mount_point_decides_the_failure_domain(
    path: str, fstype: str, shared: bool
) -> None:
    m = mount_of(path, parse_mounts(MOUNTS))
    assert m is not None and m.fstype == fstype
    assert is_shared_fstype(m.fstype) is shared


def test_this_machines_mounts_are_read() -> None:
    mounts = read_mounts()
    assert any(m.point == "/" for m in mounts)
    assert read_mounts("/nonexistent/mounts") == []


def write_checkpoint(root: Path, step: int, written_at: float) -> Path:
    ck = root / f"iter_{step:07d}"
    ck.mkdir(parents=True)
    (ck / "model.pt").write_bytes(pickle.dumps({"step": step}))
    for p in (ck / "model.pt", ck):
        os.utime(p, (written_at, written_at))
    return ck


def test_age_and_limit_of_the_newest_valid_checkpoint(tmp_path: Path) -> None:
    mounts = parse_mounts(f"fs1:/x {tmp_path} nfs4 rw 0 0\n")
    write_checkpoint(tmp_path, 100, T0 - 900)
    newest = write_checkpoint(tmp_path, 200, T0 - 300)
    broken = tmp_path / "iter_0000300"  # newer but not valid: does not count
    broken.mkdir()
    (broken / "model.pt").write_bytes(b"not a pickle")
    p = checkpoint_protection(str(tmp_path), now=T0, max_age_seconds=600, mounts=mounts)
    assert (p.newest_step, p.newest_path, p.newest_at) == (200, str(newest), T0 - 300)
    assert p.age_seconds == pytest.approx(300.0)
    assert (p.fstype, p.mount_point, p.unprotected, p.overdue) == (
        "nfs4",
        str(tmp_path),
        False,
        False,
    )
    later = checkpoint_protection(str(tmp_path), now=T0 + 301, max_age_seconds=600, mounts=mounts)
    assert later.age_seconds == pytest.approx(601.0) and later.overdue
    unlimited = checkpoint_protection(str(tmp_path), now=T0 + 10_000, mounts=mounts)
    assert unlimited.max_age_seconds is None and not unlimited.overdue


def test_no_valid_checkpoint_is_overdue_only_under_a_limit(tmp_path: Path) -> None:
    mounts = parse_mounts(f"/dev/sda1 {tmp_path} ext4 rw 0 0\n")
    p = checkpoint_protection(str(tmp_path), now=T0, max_age_seconds=60, mounts=mounts)
    assert (p.newest_step, p.age_seconds, p.overdue, p.unprotected) == (None, None, True, True)
    gone = checkpoint_protection(str(tmp_path / "missing"), now=T0, mounts=mounts)
    assert gone.error is not None and gone.error.startswith("FileNotFoundError")
    assert not gone.overdue


def test_the_save_duration_comes_from_a_trainguard_manifest(tmp_path: Path) -> None:
    from trainguard.train.manager import CheckpointManager

    mgr = CheckpointManager(tmp_path, rank=0, world_size=1)
    try:
        mgr.save(5, {"model": {"w": [1.0, 2.0]}})
    finally:
        mgr.close()
    p = checkpoint_protection(str(tmp_path), now=T0 * 2, mounts=[])
    assert p.newest_step == 5
    assert p.last_save_seconds is not None and 0 <= p.last_save_seconds < 60
    assert p.fstype is None and not p.unprotected  # unknown filesystem: not flagged


def test_the_policy_field_is_validated() -> None:
    assert parse_policy({"name": "p", "max_checkpoint_age_seconds": 1800}).to_json() == {
        "name": "p",
        "max_checkpoint_age_seconds": 1800,
    }
    with pytest.raises(PolicyError, match="max_checkpoint_age_seconds"):
        parse_policy({"name": "p", "max_checkpoint_age_seconds": -5})


@pytest.fixture()
def client(tmp_path: Path) -> Iterator[TestClient]:
    store = Store.open(tmp_path / "state.db", at=T0)
    control = ControlPlane(store, None, lambda: T0, identity="test")
    tokens = TokenTable.from_mapping({OP: {"role": "operator", "name": "alice"}})
    ctx = build_context(store, tokens, control=control, clock=lambda: T0)
    ctx.start()
    with TestClient(create_app(ctx), headers={"Authorization": f"Bearer {OP}"}) as c:
        yield c
    ctx.stop()
    store.close()


def test_api_and_metrics_show_a_jobs_checkpoint_protection(
    client: TestClient, tmp_path: Path
) -> None:
    ckdir = tmp_path / "ckpt"
    write_checkpoint(ckdir, 40, T0 - 1000)
    r = client.put("/v1/policies/default", json={"policy": {"max_checkpoint_age_seconds": 900}})
    assert r.status_code == 200, r.text
    for job_id, directory in (("j1", str(ckdir)), ("j2", None)):
        r = client.post(
            "/v1/jobs",
            json={
                "scheduler_ref": f"ext-{job_id}",
                "name": job_id,
                "command": ["python", "train.py"],
                "need": 1,
                "checkpoint_dir": directory,
                "job_id": job_id,
            },
        )
        assert r.status_code == 201, r.text
    j1 = client.get("/v1/jobs/j1").json()["checkpoint_protection"]
    assert j1["newest_step"] == 40 and j1["age_seconds"] == 1000.0
    assert j1["max_age_seconds"] == 900.0 and j1["overdue"] is True
    mount = mount_of(str(ckdir), read_mounts())
    assert mount is not None and j1["fstype"] == mount.fstype
    assert j1["unprotected"] is (not is_shared_fstype(mount.fstype))
    assert client.get("/v1/jobs/j2").json()["checkpoint_protection"] is None
    text = client.get("/metrics").text
    assert 'trainguard_job_checkpoint_age_seconds{job_id="j1"} 1000.0' in text
    assert 'trainguard_job_checkpoint_max_age_seconds{job_id="j1"} 900.0' in text
    saved = re.search(r'last_save_timestamp_seconds\{job_id="j1"\} (\S+)', text)
    assert saved is not None and float(saved.group(1)) == T0 - 1000
    assert 'trainguard_job_checkpoint_missing{job_id="j1"} 0.0' in text
    assert 'job_id="j2"' not in text
