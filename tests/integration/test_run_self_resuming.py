"""``trainguard run`` with jobs that resume by themselves, not at all, or print no step
(plain-Python jobs with real checkpoints on disk; the shared rule is policy/verify.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainguard.store import Store

# A torch-free job that saves trainguard-format checkpoints (state file, manifest last,
# renamed into place), so the catalog offers real, valid restore points.
SAVER = """
import os, sys, time, json, hashlib
from pathlib import Path
root = Path(sys.argv[1])
attempt = int(os.environ["TRAINGUARD_ATTEMPT"])

def save(step):
    d = root / f"step_{step:08d}"
    if d.exists():
        return
    tmp = root / f".tmp-step_{step:08d}-x"
    tmp.mkdir(parents=True)
    data = os.urandom(64)
    (tmp / "state.bin").write_bytes(data)
    manifest = {"format": "trainguard", "format_version": 1, "step": step, "world_size": 1,
                "created_at": time.time(),
                "trainguard_version": "test",
                "files": [{"path": "state.bin", "size": 64,
                           "sha256": hashlib.sha256(data).hexdigest()}]}
    (tmp / "trainguard-manifest.json").write_text(json.dumps(manifest))
    tmp.rename(d)
"""


def run(tmp: Path, body: str, *opts: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    script = tmp / "job.py"
    script.write_text(SAVER + textwrap.dedent(body))
    ckpt = tmp / "ckpt"
    ckpt.mkdir(exist_ok=True)
    return subprocess.run(
        [
            sys.executable, "-m", "trainguard.cli", "run", "--state", str(tmp / "state.db"),
            "--kernel-log", str(tmp / "kern.log"), "--startup-timeout", "30",
            "--devices", "2", "--need", "1", "--checkpoint-dir", str(ckpt),
            "--backoff", "0.1", *opts, "--", sys.executable, str(script), str(ckpt),
        ],
        capture_output=True, text=True, timeout=timeout, cwd=tmp, check=False,
    )  # fmt: skip


def incident(tmp: Path) -> dict:  # type: ignore[type-arg]
    with Store.open(tmp / "state.db") as store:
        [inc] = store.incidents.list_incidents()
        return inc.to_json()


def _manifest_ok(tmp: Path) -> None:
    # The saver above writes what the catalog calls a valid trainguard checkpoint.
    from trainguard.checkpoints import latest_valid

    info = latest_valid(str(tmp / "ckpt"))
    assert info is not None and info.valid, info


def test_a_job_that_starts_over_is_resumed_below_not_a_failed_attempt(tmp_path: Path) -> None:
    res = run(
        tmp_path,
        """
        for i in range(1, 41):
            print(f"step={i}", flush=True)
            time.sleep(0.03)
            if i % 5 == 0:
                save(i)
            if i == 22 and attempt == 0:
                sys.exit(3)
        """,
        "--verify-window",
        "0.3",
    )
    assert res.returncode == 0, res.stderr[-2000:]
    _manifest_ok(tmp_path)
    inc = incident(tmp_path)
    assert inc["outcome"] == "recovered" and inc["recovery_attempt"] == 1
    # It ignored step 20 and started over: what really happened is recorded.
    assert inc["resumed_step"] == 1
    assert inc["checkpoint_step"] is None and inc["checkpoint_path"] is None
    assert inc["failed_step"] == 22 and inc["lost_steps"] == 22
    [w] = [w for w in inc["warnings"] if w.startswith("resumed below the offered checkpoint")]
    assert "step 20" in w and "--resume-arg" in w and "resume_path" in w
    assert res.stderr.count("warning: resumed below the offered checkpoint") == 1
    assert "restored step" not in " ".join(t["what"] for t in inc["timeline"])
    # One lost-work statement: the timeline's note says what the report says (0530).
    report = json.loads(
        subprocess.run(
            [sys.executable, "-m", "trainguard.cli", "report", str(inc["id"]), "--json",
             "--state", str(tmp_path / "state.db")],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout
    )  # fmt: skip
    lw = report["lost_work"]
    assert lw["counted_steps"] == 22 and lw["bound"] in ("exact", "estimate")
    [note] = [t["what"] for t in inc["timeline"] if t["what"].startswith("lost work: ")]
    assert note.startswith(f"lost work: {lw['said']} step(s)"), (note, lw)


def test_a_job_that_resumes_by_itself_past_the_checkpoint_within_the_window_verifies(
    tmp_path: Path,
) -> None:
    # Resumes from its own newest checkpoint and logs every 4 steps: first logged step
    # after restoring 20 is 24 (HF's logging_steps pattern), not "wrong".
    res = run(
        tmp_path,
        """
        saved = sorted(root.glob("step_*"))
        start = int(saved[-1].name.split("_")[1]) if saved else 0
        for i in range(start + 1, 61):
            time.sleep(0.02)
            if i % 4 == 0:
                print(f"step={i}", flush=True)
            if i % 10 == 0:
                save(i)
            if i == 26 and attempt == 0:
                sys.exit(3)
        """,
        "--verify-window",
        "0.3",
    )
    assert res.returncode == 0, res.stderr[-2000:]
    inc = incident(tmp_path)
    assert inc["outcome"] == "recovered" and inc["checkpoint_step"] == 20
    assert inc["resumed_step"] == 24 and inc["warnings"] == []
    assert inc["lost_steps"] == 24 - 20  # failed at the last step seen, 24


def test_a_job_with_no_step_signal_is_warned_and_verified_by_liveness_only(
    tmp_path: Path,
) -> None:
    res = run(
        tmp_path,
        """
        for epoch in range(0, 30):
            print(f"Epoch {epoch} | Batchsize: 32 | Steps: 64", flush=True)
            time.sleep(0.1)
            if epoch == 8 and attempt == 0:
                sys.exit(3)
        """,
        "--verify-window",
        "0.5",
    )
    assert res.returncode == 0, res.stderr[-2000:]
    inc = incident(tmp_path)
    assert inc["outcome"] == "recovered" and inc["resumed_step"] is None
    notes = " ".join(t["what"] for t in inc["timeline"])
    assert "verified by liveness only" in notes
    assert any(w.startswith("no progress signal") for w in inc["warnings"])
    assert res.stderr.count("warning: no progress signal") == 1


@pytest.mark.parametrize("keep", [False, True])
def test_resume_arg_and_the_damaged_newest_checkpoint(tmp_path: Path, keep: bool) -> None:
    res = run(
        tmp_path,
        """
        args = sys.argv[2:]
        start = int(Path(args[1]).name.split("_")[1]) if args[:1] == ["--resume"] else 0
        print("ARGS", json.dumps(args), flush=True)
        for i in range(start + 1, 31):
            print(f"step={i}", flush=True)
            time.sleep(0.03)
            if i % 5 == 0:
                save(i)
            if i == 17 and attempt == 0:
                newest = root / "step_00000015" / "state.bin"
                newest.write_bytes(b"x" * 64)  # damaged: the checksum no longer matches
                sys.exit(3)
        """,
        "--verify-window",
        "0.3",
        "--resume-arg",
        "--resume {checkpoint}",
        *(["--keep-rejected-in-place"] if keep else []),
    )
    assert res.returncode == 0, res.stderr[-2000:]
    runs = [json.loads(line[5:]) for line in res.stdout.splitlines() if line.startswith("ARGS ")]
    ckpt = tmp_path / "ckpt"
    assert runs[0] == [] and runs[1] == ["--resume", str(ckpt / "step_00000010")]
    inc = incident(tmp_path)
    assert inc["checkpoint_step"] == 10 and inc["outcome"] == "recovered"
    rejected = ckpt / ".trainguard-rejected" / "step_00000015"
    if keep:
        assert not rejected.exists()
    else:
        assert (rejected / "state.bin").read_bytes() == b"x" * 64
        note = json.loads((ckpt / ".trainguard-rejected" / "step_00000015.trainguard-note.json")
                          .read_text())  # fmt: skip
        assert note["path"] == str(ckpt / "step_00000015") and "sha256" in note["reason"]


@pytest.mark.parametrize(
    "loaded",
    [
        "Loading the checkpoint at step {start}.",  # torchtitan
        " loading checkpoint from {root} at iteration {start}",  # Megatron-LM
        "  Continuing training from global step {start}",  # transformers Trainer
    ],
)
def test_resumed_step_is_the_first_step_trained_after_the_restore(
    tmp_path: Path, loaded: str
) -> None:
    """A job that says which checkpoint step it loaded, then logs every 4 steps: the
    load line is a checkpoint event, not step 20 (0497); the first step it trained and
    printed is 24, whatever the framework's wording."""
    res = run(
        tmp_path,
        f"""
        saved = sorted(root.glob("step_*"))
        start = int(saved[-1].name.split("_")[1]) if saved else 0
        if start:
            print({loaded!r}.format(start=start, root=root), flush=True)
            time.sleep(0.5)
        for i in range(start + 1, 61):
            time.sleep(0.02)
            if i % 4 == 0:
                print(f"step={{i}}", flush=True)
            if i % 10 == 0:
                save(i)
            if i == 26 and attempt == 0:
                sys.exit(3)
        """,
        "--verify-window",
        "0.3",
    )
    assert res.returncode == 0, res.stderr[-2000:]
    inc = incident(tmp_path)
    assert inc["outcome"] == "recovered" and inc["checkpoint_step"] == 20
    assert inc["resumed_step"] == 24 and inc["warnings"] == [], inc
