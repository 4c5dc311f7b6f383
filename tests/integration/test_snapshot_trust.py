"""Memory snapshots are owned by their job (decision 0411, issue 25 item 4).

A second, real Unix user (created here with ``useradd`` when running as root, the test
skipped otherwise) plays the other local user of a shared host: it plants a snapshot
at the job's predictable per-user path (a directory, or a symbolic link to its own),
and tries to read a job's snapshots. The job is a real :class:`CheckpointManager` in
a shared, sticky, world-writable directory like ``/dev/shm``. Without root: a
snapshot of another run of the same job (another secret) is refused by its seal.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from trainguard.train import CheckpointManager, resume
from trainguard.train._private import SEAL_NAME
from trainguard.train.snapshot import job_key

PY = "/usr/bin/python3"  # the stranger cannot reach root's interpreter (under /root)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "TRAINGUARD_RESUME_FROM",
        "TRAINGUARD_PROGRESS",
        "RANK",
        "WORLD_SIZE",
        "TRAINGUARD_SNAPSHOT_DIR",
        "TRAINGUARD_SNAPSHOT_KEY",
        "TRAINGUARD_SNAPSHOT_SECRET",
        "TRAINGUARD_SNAPSHOT_BUDDY",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def stranger() -> Iterator[tuple[int, int]]:
    """A throwaway second Unix user: (uid, gid)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: creates a second Unix user (useradd) and runs as it")
    if not os.path.exists(PY) or shutil.which("useradd") is None:
        pytest.skip(f"needs useradd and {PY}")
    name = f"tgx{secrets.token_hex(4)}"
    made = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if made.returncode != 0:
        pytest.skip(f"useradd {name} failed: {made.stderr.strip()}")
    try:
        entry = pwd.getpwnam(name)
        yield entry.pw_uid, entry.pw_gid
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=60)


@pytest.fixture
def shared_base() -> Iterator[Path]:
    """A sticky world-writable directory like /dev/shm (tmp_path is private to root)."""
    base = Path(tempfile.mkdtemp(prefix="tg-shm-test-", dir="/dev/shm"))
    os.chmod(base, 0o1777)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _as(user: tuple[int, int], code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-c", code, *args],
        user=user[0],
        group=user[1],
        extra_groups=[],
        env={"PATH": "/usr/bin:/bin"},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )


def _state(value: float) -> dict[str, object]:
    return {"w": torch.full((256,), value), "step_note": "x"}


# The other user's side: copy a prepared snapshot tree into the shared base under the
# victim's predictable per-user name, as a directory or as a link to its own directory.
PLANT = r"""
import os, shutil, sys
src, base, victim_uid, how = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
mine = os.path.join(base, "mine")
shutil.copytree(src, mine)
for d, dirs, files in os.walk(mine):
    os.chmod(d, 0o755)
    for f in files:
        os.chmod(os.path.join(d, f), 0o644)
target = os.path.join(base, "trainguard-" + victim_uid)
if how == "symlink":
    os.symlink(mine, target)
else:
    os.rename(mine, target)
print(os.lstat(target).st_uid)
"""


@pytest.mark.parametrize("how", ["dir", "symlink"])
def test_a_snapshot_planted_by_another_user_is_refused_and_the_job_uses_the_disk(
    tmp_path: Path,
    stranger: tuple[int, int],
    shared_base: Path,
    how: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ck = tmp_path / "ck"
    key = job_key(ck.absolute())  # predictable: the hash of the checkpoint directory
    # A genuine-looking snapshot of step 1000000, weights 42.0, for the victim's key
    # (written by trainguard itself, with another secret), staged for the stranger.
    stage = shared_base / "stage"
    os.environ["TRAINGUARD_SNAPSHOT_KEY"] = key
    try:
        evil = CheckpointManager(tmp_path / "evil-ck", memory_snapshots=True, snapshot_dir=stage)
        evil.snapshot(1_000_000, _state(42.0))
        evil.close(keep_snapshots=True)
    finally:
        del os.environ["TRAINGUARD_SNAPSHOT_KEY"]
    for d, _dirs, files in os.walk(stage):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)
    planted = _as(stranger, PLANT, str(stage / "trainguard-0"), str(shared_base), "0", how)
    assert planted.returncode == 0, planted.stderr
    assert int(planted.stdout) == stranger[0]
    assert (shared_base / "trainguard-0" / key / "rank_00000" / "slot0").exists()

    # The victim: a disk checkpoint of step 3 (weights 1.0), then an attempt that resumes.
    disk = CheckpointManager(ck)
    disk.save(3, _state(1.0))
    disk.close()
    caplog.set_level(logging.INFO, logger="trainguard.train")
    ckpt = CheckpointManager(ck, memory_snapshots=True, snapshot_dir=shared_base)
    state = _state(0.0)
    result = resume(ckpt, state)
    assert (result.source, result.step) == ("latest", 3)  # the disk's newest
    assert torch.equal(result.values["w"], torch.full((256,), 1.0))
    said = caplog.text
    assert "restored step 1000000" not in said
    why = "is a symbolic link" if how == "symlink" else f"is owned by uid {stranger[0]}"
    assert why in said and "not restoring from memory" in said, said

    # Training goes on: snapshots are off (said once), nothing is written into the plant.
    before = sorted(str(p) for p in (shared_base / "mine").rglob("*")) if how == "symlink" else []
    ckpt.snapshot(4, state)
    ckpt.save(4, state)
    assert "memory snapshots off, the disk checkpoints only" in caplog.text
    ckpt.close()
    owned = [p for p in (shared_base / "trainguard-0").rglob("*") if p.lstat().st_uid == 0]
    assert owned == [], "the victim wrote into the other user's directory"
    if how == "symlink":
        assert sorted(str(p) for p in (shared_base / "mine").rglob("*")) == before
    again = resume(CheckpointManager(ck), _state(0.0))
    assert (again.source, again.step) == ("latest", 4)


PEEK = r"""
import json, os, sys
top, slot_file, job_dir = sys.argv[1], sys.argv[2], sys.argv[3]
out = {}
for what, act in (
    ("list", lambda: os.listdir(top)),
    ("read", lambda: open(slot_file, "rb").read(1)),
    ("plant", lambda: os.mkdir(os.path.join(job_dir, "rank_00001"))),
):
    try:
        act()
        out[what] = "allowed"
    except PermissionError:
        out[what] = "denied"
print(json.dumps(out))
"""


def test_another_user_can_neither_read_nor_plant_into_a_jobs_snapshots(
    tmp_path: Path, stranger: tuple[int, int], shared_base: Path
) -> None:
    ckpt = CheckpointManager(tmp_path / "ck", memory_snapshots=True, snapshot_dir=shared_base)
    try:
        ckpt.snapshot(2, _state(7.0))
        assert ckpt.snapshots is not None and ckpt.snapshots.wait(60)
        top = shared_base / "trainguard-0"
        (slot,) = ckpt.snapshots.slots()
        for path in [top, *top.rglob("*")]:
            st = path.lstat()
            assert st.st_uid == 0, path
            want = 0o700 if path.is_dir() else 0o600
            assert st.st_mode & 0o777 == want, f"{path}: {st.st_mode & 0o777:o}"
        assert (slot.path / SEAL_NAME).exists()
        peek = _as(
            stranger, PEEK, str(top), str(slot.path / "state.pt"), str(ckpt.snapshots.job_dir)
        )
        assert peek.returncode == 0, peek.stderr
        assert json.loads(peek.stdout) == {"list": "denied", "read": "denied", "plant": "denied"}
    finally:
        ckpt.close()
    assert not list((shared_base / "trainguard-0").rglob("*.pt")), "close() frees them"


def test_a_snapshot_of_another_run_is_refused_by_its_seal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    shm = tmp_path / "shm"
    monkeypatch.setenv("TRAINGUARD_SNAPSHOT_KEY", "run-a")
    monkeypatch.setenv("TRAINGUARD_SNAPSHOT_SECRET", "secret-of-run-a")
    first = CheckpointManager(tmp_path / "ck", memory_snapshots=True, snapshot_dir=shm)
    first.snapshot(7, _state(3.0))
    first.close(keep_snapshots=True)
    caplog.set_level(logging.INFO, logger="trainguard.train")

    # Another run that happens to use the same name (another secret): refused.
    monkeypatch.setenv("TRAINGUARD_SNAPSHOT_SECRET", "secret-of-run-b")
    other = CheckpointManager(tmp_path / "ck", memory_snapshots=True, snapshot_dir=shm)
    assert resume(other, _state(0.0)).source == "fresh"
    other.close(keep_snapshots=True)
    assert "its seal does not match this run" in caplog.text

    # The same run's next attempt restores it.
    monkeypatch.setenv("TRAINGUARD_SNAPSHOT_SECRET", "secret-of-run-a")
    state = _state(0.0)
    same = CheckpointManager(tmp_path / "ck", memory_snapshots=True, snapshot_dir=shm)
    got = resume(same, state)
    assert (got.source, got.step) == ("memory", 7)
    assert torch.equal(got.values["w"], torch.full((256,), 3.0))
    # A slot without its seal (an older trainguard, or copied in) is refused too.
    assert same.snapshots is not None
    (slot,) = same.snapshots.slots()
    (slot.path / SEAL_NAME).unlink()
    same.close(keep_snapshots=True)
    caplog.clear()
    assert resume(CheckpointManager(tmp_path / "ck", memory_snapshots=True, snapshot_dir=shm),
                  _state(0.0)).source == "fresh"  # fmt: skip
    assert f"it has no seal ({SEAL_NAME})" in caplog.text


def test_without_a_supervisor_the_secret_is_a_private_file_beside_the_checkpoints(
    tmp_path: Path,
) -> None:
    ck = tmp_path / "ck"
    ckpt = CheckpointManager(ck, memory_snapshots=True, snapshot_dir=tmp_path / "shm")
    ckpt.snapshot(1, _state(1.0))
    ckpt.close(keep_snapshots=True)
    secret = ck / ".trainguard-snapshot-secret"
    assert secret.stat().st_mode & 0o777 == 0o600 and len(secret.read_bytes()) == 64
    again = CheckpointManager(ck, memory_snapshots=True, snapshot_dir=tmp_path / "shm")
    assert resume(again, _state(0.0)).source == "memory"  # the job's next attempt
    again.close()
    secret.chmod(0o644)  # readable by others: no longer a secret, so not used
    loose = CheckpointManager(ck, memory_snapshots=True, snapshot_dir=tmp_path / "shm")
    assert loose.snapshots is not None and "has mode 0644" in str(loose.snapshots.distrust)
    loose.close()


RUN_JOB = r"""
import os, sys, torch
from trainguard.train import CheckpointManager, resume
ckpt = CheckpointManager(sys.argv[1], memory_snapshots=True)
got = resume(ckpt, {"w": torch.zeros(8)})
# One write (the attempt's output is unbuffered; stderr shares the log): a whole line.
sys.stdout.write(f"attempt {os.environ['TRAINGUARD_ATTEMPT']} source {got.source} step "
                 f"{got.step} key {os.environ.get('TRAINGUARD_SNAPSHOT_KEY')}\n")
sys.stdout.flush()
ckpt.snapshot(5, {"w": torch.full((8,), 5.0)})
ckpt.close(keep_snapshots=True)
sys.exit(3 if os.environ["TRAINGUARD_ATTEMPT"] == "0" else 0)
"""


def test_the_supervisor_gives_the_attempts_of_one_run_its_id_and_secret(tmp_path: Path) -> None:
    from trainguard.schedulers.base import JobSpec
    from trainguard.schedulers.local_cluster import LocalCluster
    from trainguard.schedulers.procs import simulated_devices

    script = tmp_path / "job.py"
    script.write_text(RUN_JOB)
    shm = tmp_path / "shm"
    cluster = LocalCluster(tmp_path / "local", simulated_devices("localhost", 0, 1), grace=1.0)
    spec = JobSpec(
        name="snap",
        command=(sys.executable, str(script), str(tmp_path / "ck")),
        env={"TRAINGUARD_SNAPSHOT_DIR": str(shm), "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
    )

    def ended(ref: str, attempt: int) -> str:
        deadline = time.monotonic() + 120
        while True:
            job = cluster.observe().jobs[ref]
            if job.attempt == attempt and job.phase.terminal:
                return Path(str(job.output_path)).read_text()
            assert time.monotonic() < deadline, f"attempt {attempt} did not end: {job}"
            time.sleep(0.1)

    try:
        ref = str(cluster.submit(spec, key="s1", token=1).detail["ref"])
        first = ended(ref, 0)
        assert "attempt 0 source fresh" in first, first
        key = first.split(" key ")[1].split()[0]
        assert key.startswith("run-") and len(key) == 36  # unpredictable: 128 random bits
        cluster.requeue(ref, key="r1", token=1)
        second = ended(ref, 1)
        # The next attempt of the same run finds and trusts the snapshot.
        assert f"attempt 1 source memory step 5 key {key}" in second, second
        assert "restored step 5 from memory snapshot" in second
        secret = cluster._jobs[ref].snapshot_env["TRAINGUARD_SNAPSHOT_SECRET"]
        assert secret not in first + second and "TRAINGUARD_SNAPSHOT_SECRET" not in spec.env

        # Another run of the same job (same checkpoint directory): another id and secret.
        other = str(cluster.submit(spec, key="s2", token=1).detail["ref"])
        third = ended(other, 0)
        assert "attempt 0 source fresh" in third and key not in third, third
        assert (shm / f"trainguard-{os.getuid()}" / key / "rank_00000").is_dir()
    finally:
        cluster.shutdown()
    assert list((shm / f"trainguard-{os.getuid()}").iterdir()) == [], "shutdown frees them"


def test_a_shared_base_without_the_sticky_bit_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    base = tmp_path / "open"
    base.mkdir()
    base.chmod(0o777)  # anyone could rename our directory away and put theirs there
    ckpt = CheckpointManager(tmp_path / "ck", memory_snapshots=True, snapshot_dir=base)
    ckpt.snapshot(1, _state(1.0))
    ckpt.close()
    assert "is writable by every user and not sticky" in caplog.text
    assert list(base.iterdir()) == []
    base.chmod(0o1777)  # like /dev/shm
    ckpt = CheckpointManager(tmp_path / "ck", memory_snapshots=True, snapshot_dir=base)
    ckpt.snapshot(1, _state(1.0))
    assert ckpt.snapshots is not None and ckpt.snapshots.wait(60)
    assert len(ckpt.snapshots.slots()) == 1
    ckpt.close()


def test_a_squatted_user_directory_does_not_deny_a_supervised_run_its_snapshots(
    tmp_path: Path, stranger: tuple[int, int], shared_base: Path
) -> None:
    from trainguard.schedulers.base import JobSpec
    from trainguard.schedulers.local_cluster import LocalCluster
    from trainguard.schedulers.procs import simulated_devices

    squat = _as(
        stranger, "import os, sys; os.mkdir(sys.argv[1], 0o777)", str(shared_base / "trainguard-0")
    )
    assert squat.returncode == 0, squat.stderr
    script = tmp_path / "job.py"
    script.write_text(RUN_JOB)
    cluster = LocalCluster(tmp_path / "local", simulated_devices("localhost", 0, 1), grace=1.0)
    spec = JobSpec(
        name="snap",
        command=(sys.executable, str(script), str(tmp_path / "ck")),
        env={
            "TRAINGUARD_SNAPSHOT_DIR": str(shared_base),
            "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        },
    )

    def ended(ref: str, attempt: int) -> str:
        deadline = time.monotonic() + 120
        while True:
            job = cluster.observe().jobs[ref]
            if job.attempt == attempt and job.phase.terminal:
                return Path(str(job.output_path)).read_text()
            assert time.monotonic() < deadline, f"attempt {attempt} did not end: {job}"
            time.sleep(0.1)

    try:
        ref = str(cluster.submit(spec, key="s1", token=1).detail["ref"])
        assert "attempt 0 source fresh" in ended(ref, 0)
        cluster.requeue(ref, key="r1", token=1)
        second = ended(ref, 1)
        assert "attempt 1 source memory step 5" in second, second
        [own] = [p for p in shared_base.iterdir() if p.name.startswith("trainguard-0-")]
        assert own.stat().st_uid == 0 and own.stat().st_mode & 0o777 == 0o700
        assert f"restored step 5 from memory snapshot ({own}/trainguard-0/run-" in second
        assert list((shared_base / "trainguard-0").iterdir()) == []  # nothing written there
    finally:
        cluster.shutdown()
    assert not own.exists(), "shutdown removes the run's own base"
