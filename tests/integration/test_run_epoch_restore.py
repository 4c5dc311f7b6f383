"""``trainguard run`` with a job whose checkpoints count epochs (the DDP tutorial's
``snapshot.pt``/``epoch_N.pt`` with ``EPOCHS_RUN``, real ``torch.save``): one restore,
said one way by the plan, the restart's record, the incident and ``report`` (decision
0531), never "from the beginning" nor "step None"."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

JOB = """
import os, sys, time
from pathlib import Path
import torch
root = Path(sys.argv[1])
attempt = int(os.environ["TRAINGUARD_ATTEMPT"])
start = 0
resume = os.environ.get("TRAINGUARD_RESUME_FROM")
if resume:
    start = torch.load(resume)["EPOCHS_RUN"]
    print(f"Resuming training from snapshot at Epoch {start}", flush=True)
for epoch in range(start, 12):
    print(f"Epoch {epoch} | Batchsize: 32 | Steps: 8", flush=True)
    time.sleep(0.15)
    torch.save({"MODEL_STATE": {}, "EPOCHS_RUN": epoch + 1}, root / f"epoch_{epoch}.pt")
    if epoch == 4 and attempt == 0:
        sys.exit(3)
"""


def _cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainguard.cli", *args],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def test_an_epoch_checkpoint_restart_is_recorded_as_one(tmp_path: Path) -> None:
    script, ckpt, state = tmp_path / "job.py", tmp_path / "ckpt", tmp_path / "state.db"
    script.write_text(textwrap.dedent(JOB))
    ckpt.mkdir()
    res = _cli(
        "run", "--state", str(state), "--kernel-log", str(tmp_path / "kern.log"),
        "--startup-timeout", "60", "--devices", "2", "--need", "1",
        "--checkpoint-dir", str(ckpt), "--backoff", "0.1", "--verify-window", "0.5",
        "--", sys.executable, str(script), str(ckpt),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    [inc] = json.loads(_cli("incidents", "--state", str(state), "--json").stdout)
    assert inc["outcome"] == "recovered"
    # The newest epoch file the catalog found valid: epoch_4.pt, 5 epochs run.
    assert inc["checkpoint_path"] == str(ckpt / "epoch_4.pt"), inc
    assert inc["checkpoint_step"] is None  # an epoch count is no step
    [restart] = [a for a in inc["actions"] if a["type"] == "restart"]
    assert restart["checkpoint_epoch"] == 5
    assert restart["summary"].endswith("from epoch_4.pt (epoch 5)"), restart
    assert any("(epoch 5)" in r for r in inc["plan"]["reasons"]), inc["plan"]
    report = json.loads(_cli("report", str(inc["id"]), "--state", str(state), "--json").stdout)
    assert report["checkpoint"] == {
        "path": str(ckpt / "epoch_4.pt"), "step": None, "epoch": 5,
        "said": "from epoch_4.pt (epoch 5)",
    }  # fmt: skip
    assert report["verification"]["verdict"] == "liveness_only"
    assert report["verification"]["rate_checked"] is False
    assert "Resuming training from snapshot at Epoch 5" in res.stdout
    text = _cli("report", str(inc["id"]), "--state", str(state)).stdout
    for wrong in ("from the beginning", "step None", "restart job " + inc["job_id"] + " from step"):
        assert wrong not in text and wrong not in res.stderr, wrong
    assert "  restored: from epoch_4.pt (epoch 5)" in text
