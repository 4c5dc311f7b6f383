"""One-pass resume (issue 16, issue 14 item 5, decision 0162): what is hashed is what is loaded.

Each file a rank restores is opened once, hashed, and ``torch.load``ed from the same
bytes; a supervisor's manifest digest is checked instead of a second verification.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from trainguard.checkpoints import validate  # noqa: E402
from trainguard.controller.checkpoint_care import select_checkpoints  # noqa: E402
from trainguard.model.checkpoint import MANIFEST_NAME, RESUME_DIGEST_ENV  # noqa: E402
from trainguard.train import CheckpointManager, ResumeError, resume  # noqa: E402
from trainguard.train import manager as manager_mod  # noqa: E402

# --- watching every open of the checkpoint's files -----------------------------------

_OPENS: list[str] = []
_ON_OPEN: list[Callable[[str], None]] = []


def _audit(event: str, args: tuple[object, ...]) -> None:
    if event == "open" and _ON_OPEN and isinstance(args[0], str | bytes | os.PathLike):
        path = os.fsdecode(args[0])  # type: ignore[arg-type]
        if "/step_" in path and not path.endswith(MANIFEST_NAME):
            _OPENS.append(path)
            for hook in _ON_OPEN:
                hook(path)


sys.addaudithook(_audit)


@pytest.fixture
def watch() -> object:
    _OPENS.clear()
    _ON_OPEN.append(lambda _p: None)
    yield _OPENS
    _ON_OPEN.clear()
    _OPENS.clear()


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(
        torch.equal(x, y)
        for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


def _saved(tmp_path: Path, step: int = 4) -> tuple[Path, torch.nn.Module]:
    model = _model(1)
    ckpt = CheckpointManager(tmp_path, keep=5)
    ckpt.save(step, {"model": model})
    return tmp_path / f"step_{step:08d}", model


def test_each_file_is_opened_once_and_what_was_hashed_is_loaded(
    tmp_path: Path, watch: list[str]
) -> None:
    path, saved = _saved(tmp_path)
    target = str(path / "state.pt")
    # Replace the file with a same-size damaged copy the moment it is opened a second
    # time: a verify pass followed by a load pass (today's main) loads the damage.
    good = Path(target).read_bytes()
    damaged = bytearray(good)
    damaged[len(good) // 2] ^= 0xFF

    def swap(p: str) -> None:
        if p == target and watch.count(target) == 2:
            Path(target).write_bytes(bytes(damaged))

    _ON_OPEN.append(swap)
    watch.clear()  # the save's and this test's own opens
    fresh = _model(2)
    result = resume(tmp_path, {"model": fresh})
    assert result.step == 4 and _same(fresh, saved)
    assert watch.count(target) == 1
    assert result.hashed_bytes == len(good) + (path / "rank_00000.pt").stat().st_size


def test_a_file_changed_after_verification_is_refused_and_nothing_restored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _saved_model = _saved(tmp_path)
    info = validate(path)  # the supervisor's full verification
    assert info.valid and info.manifest_sha256
    assert info.manifest_sha256 == hashlib.sha256((path / MANIFEST_NAME).read_bytes()).hexdigest()
    _flip(path / "state.pt")  # after the supervisor looked
    monkeypatch.setenv("TRAINGUARD_RESUME_FROM", str(path))
    monkeypatch.setenv(RESUME_DIGEST_ENV, info.manifest_sha256)
    fresh = _model(2)
    before = _model(2)
    with pytest.raises(ResumeError, match=r"state\.pt: sha256 mismatch"):
        resume(tmp_path, {"model": fresh})
    assert _same(fresh, before)


def test_a_matching_digest_means_no_pass_before_the_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, watch: list[str]
) -> None:
    path, saved = _saved(tmp_path)
    digest = hashlib.sha256((path / MANIFEST_NAME).read_bytes()).hexdigest()
    monkeypatch.setenv("TRAINGUARD_RESUME_FROM", str(path))
    monkeypatch.setenv(RESUME_DIGEST_ENV, digest)

    def no_validate(*_a: object, **_k: object) -> None:
        raise AssertionError("re-verified a checkpoint the supervisor verified")

    monkeypatch.setattr("trainguard.train.restore.validate", no_validate)
    watch.clear()
    fresh = _model(2)
    result = resume(tmp_path, {"model": fresh})
    assert result.digest_matched and result.manifest_sha256 == digest
    assert _same(fresh, saved)
    assert sorted(Path(p).name for p in watch) == ["rank_00000.pt", "state.pt"]


def test_a_different_manifest_than_the_supervisor_verified_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = _saved(tmp_path)
    monkeypatch.setenv("TRAINGUARD_RESUME_FROM", str(path))
    monkeypatch.setenv(RESUME_DIGEST_ENV, "0" * 64)
    fresh = _model(2)
    with pytest.raises(ResumeError, match="manifest changed since the supervisor verified it"):
        resume(tmp_path, {"model": fresh})
    assert _same(fresh, _model(2))


def test_a_link_swapped_in_after_the_catalog_looked_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = _saved(tmp_path)
    digest = hashlib.sha256((path / MANIFEST_NAME).read_bytes()).hexdigest()
    outside = tmp_path.parent / f"{tmp_path.name}-outside.pt"
    os.replace(path / "state.pt", outside)
    (path / "state.pt").symlink_to(outside)  # same bytes, now from outside
    monkeypatch.setenv("TRAINGUARD_RESUME_FROM", str(path))
    monkeypatch.setenv(RESUME_DIGEST_ENV, digest)
    with pytest.raises(ResumeError, match=r"state\.pt: symlink points outside the checkpoint"):
        resume(tmp_path, {"model": _model(2)})


def test_parts_load_in_parallel_and_a_damaged_part_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manager_mod, "PART_BYTES", 1 << 20)
    big = {"w": torch.nn.Linear(1024, 1024), "v": torch.nn.Linear(1024, 1024)}
    ckpt = CheckpointManager(tmp_path, keep=5, writers=4)
    ckpt.save(1, big)
    first = {k: m.weight.detach().clone() for k, m in big.items()}
    with torch.no_grad():
        big["w"].weight.add_(1.0)
    ckpt.save(2, big)
    newest = tmp_path / "step_00000002"
    parts = sorted(p.name for p in newest.iterdir() if ".part" in p.name)
    assert len(parts) >= 2
    fresh = {"w": torch.nn.Linear(1024, 1024), "v": torch.nn.Linear(1024, 1024)}
    result = resume(tmp_path, fresh)
    assert result.step == 2 and torch.equal(fresh["w"].weight, big["w"].weight)
    on_disk = sum((newest / n).stat().st_size for n in [*parts, "state.pt", "rank_00000.pt"])
    assert result.hashed_bytes == on_disk
    _flip(newest / parts[-1])
    fresh = {"w": torch.nn.Linear(1024, 1024), "v": torch.nn.Linear(1024, 1024)}
    result = resume(tmp_path, fresh)
    assert result.step == 1 and torch.equal(fresh["w"].weight, first["w"])
    assert any(parts[-1] in s and "sha256 mismatch" in s for s in result.skipped)


def test_supervisor_passes_the_digest_it_verified_to_the_next_attempt(tmp_path: Path) -> None:
    """`trainguard run`: attempt 0 saves and crashes; attempt 1 gets the digest of the
    manifest the supervisor verified, and resume() checks it instead of re-verifying."""
    ck = tmp_path / "ck"
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, os, sys
            import torch
            from trainguard.train import CheckpointManager, resume
            model = torch.nn.Linear(8, 8)
            ckpt = CheckpointManager({str(ck)!r})
            r = resume(ckpt, {{"model": model}})
            print("RESUMED", json.dumps({{"step": r.step, "matched": r.digest_matched,
                  "env": os.environ.get("{RESUME_DIGEST_ENV}"), "sha": r.manifest_sha256}}),
                  flush=True)
            for step in range(r.step + 1, r.step + 3):
                print(f"step={{step}}", flush=True)
                ckpt.save(step, {{"model": model}})
            if os.environ["TRAINGUARD_ATTEMPT"] == "0":
                sys.exit(3)
            """
        )
    )
    res = subprocess.run(
        [
            sys.executable, "-m", "trainguard.cli", "run", "--state", str(tmp_path / "s.db"),
            "--kernel-log", str(tmp_path / "kern.log"), "--startup-timeout", "60",
            "--devices", "1", "--need", "1", "--verify-window", "0.1",
            "--checkpoint-dir", str(ck), "--", sys.executable, str(script),
        ],
        capture_output=True, text=True, timeout=240, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [json.loads(x.split(" ", 1)[1]) for x in res.stdout.splitlines() if "RESUMED" in x]
    assert [x["step"] for x in lines] == [0, 2]
    second = lines[1]
    manifest = (ck / "step_00000002" / MANIFEST_NAME).read_bytes()
    assert second["env"] == second["sha"] == hashlib.sha256(manifest).hexdigest()
    assert second["matched"] is True
    assert lines[0]["env"] is None  # a fresh start gets no digest
    assert validate(ck / "step_00000002").manifest_sha256 == second["sha"]
    assert select_checkpoints(str(ck))[0].manifest_sha256 is not None  # newest, in full


@pytest.mark.parametrize("sealed", [True, False], ids=["memfd", "bytearray"])
@pytest.mark.parametrize("weights_only", [True, False])
def test_both_copy_paths_verify_and_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sealed: bool, weights_only: bool
) -> None:
    # Without memfd (not Linux) the copy is a bytearray loaded through BytesIO.
    from trainguard.train import _oneload

    monkeypatch.setattr(_oneload, "_CAN_SEAL", sealed and _oneload._CAN_SEAL)
    path, saved = _saved(tmp_path)
    fresh = _model(2)
    result = resume(tmp_path, {"model": fresh}, weights_only=weights_only)
    assert result.step == 4 and _same(fresh, saved) and result.hashed_bytes > 0
    _flip(path / "rank_00000.pt")
    monkeypatch.setenv("TRAINGUARD_RESUME_FROM", str(path))
    fresh = _model(2)
    with pytest.raises(ResumeError, match=r"rank_00000\.pt: sha256 mismatch"):
        resume(tmp_path, {"model": fresh}, weights_only=weights_only)
    assert _same(fresh, _model(2))
