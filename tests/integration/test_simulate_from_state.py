"""``trainguard advise-interval --from-state DB``: advice from measurements in a real store.

A real SQLite state database (the store's own API) holds one 8-GPU job with three
attempts and two incidents; its checkpoint directory holds real trainguard
checkpoints whose manifests record the save time. The command must derive the
per-GPU MTBF, restart and save times from them and report the expected ETTR,
simulated and analytic.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from trainguard.cli import main
from trainguard.model.checkpoint import MANIFEST_NAME, Manifest, ManifestFile
from trainguard.model.devices import Device
from trainguard.model.findings import Attribution, Culprit, Domain, IncidentKind
from trainguard.model.records import AttemptState
from trainguard.store import Store

H = 3600.0


def write_checkpoint(root: Path, step: int, save_seconds: float) -> None:
    d = root / f"step_{step:08d}"
    d.mkdir(parents=True)
    payload = f"state at step {step}".encode()
    (d / "model.pt").write_bytes(payload)
    manifest = Manifest(
        step=step,
        world_size=8,
        created_at=1000.0 + step,
        trainguard_version="0.1.0",
        files=(ManifestFile("model.pt", len(payload), hashlib.sha256(payload).hexdigest()),),
        save_seconds=save_seconds,
    )
    (d / MANIFEST_NAME).write_text(manifest.to_json())


def make_state(tmp_path: Path) -> Path:
    ckpt = tmp_path / "ckpt"
    for step, save in ((100, 4.0), (200, 6.0), (300, 5.0)):
        write_checkpoint(ckpt, step, save)
    (ckpt / ".tmp-step_00000400-abc").mkdir()  # an interrupted write: no manifest, ignored
    db = tmp_path / "state.db"
    devices = [
        Device(index=i, uuid=f"GPU-{i}", pci_bus_id=f"0000:{0x10 + i:02x}:00.0") for i in range(8)
    ]
    hw = Attribution(
        kind=IncidentKind.XID,
        domain=Domain.HARDWARE,
        culprit=Culprit(device_uuid="GPU-3"),
        confidence=0.95,
        summary="XID 79",
    )
    with Store.open(db) as store:
        job = store.jobs.create_job(
            name="pretrain",
            command=["train.py"],
            need=8,
            at=0.0,
            checkpoint_dir=str(ckpt),
            job_id="job-1",
        )
        # Attempt 0: 10 h, then an XID; attempt 1: 20 h, then another; attempt 2: 10 h.
        spans = [(0.0, 10 * H), (10 * H + 600, 30 * H + 600), (30 * H + 1200, 40 * H + 1200)]
        for n, (start, end) in enumerate(spans):
            store.jobs.start_attempt(job.id, n, devices, at=start)
            state = AttemptState.FAILED if n < 2 else AttemptState.COMPLETED
            store.jobs.finish_attempt(job.id, n, state, at=end)
            if n < 2:
                inc = store.incidents.open_incident(
                    job.id, n, hw, detected_at=end + 5, fault_at=end
                )
                store.incidents.update_incident(
                    inc.id, at=end + 600, recovered_at=end + 600 + 60 * n
                )
    return db


@pytest.mark.slow
def test_advice_from_measured_state(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = make_state(tmp_path)
    assert main(["advise-interval", "--from-state", str(db), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    m = data["measured"]
    assert m["gpus"] == 8 and m["failures"] == 2
    assert m["gpu_hours"] == pytest.approx(40 * 8)  # 10 + 20 + 10 h on 8 GPUs
    assert m["per_gpu_mtbf_seconds"] == pytest.approx(40 * 8 * H / 2)
    assert m["save_seconds"] == 5.0 and m["save_samples"] == 3  # median of 4, 6, 5 s
    assert m["restart_seconds"] == pytest.approx(630.0)  # median of 600 s and 660 s
    # The advice uses them: job MTBF = per-GPU MTBF / 8 GPUs = 20 h.
    assert data["mtbf_seconds"] == pytest.approx(20 * H)
    assert data["save_seconds"] == 5.0 and data["restart_seconds"] == pytest.approx(630.0)
    rec = data["expected_ettr"]["recommended"]
    assert rec["interval_seconds"] == pytest.approx(data["daly_seconds"])
    assert rec["simulated"] == pytest.approx(rec["exact"], abs=0.01)
    assert 0.9 < rec["first_order"] <= rec["exact"] < 1.0


def test_explicit_values_win_and_text_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = make_state(tmp_path)
    code = main(
        [
            "advise-interval",
            "--from-state",
            str(db),
            "--job",
            "job-1",
            "--save-seconds",
            "30",
            "--current-interval-seconds",
            "3600",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "blocking save δ = 30 s" in out
    assert "measured in" in out and "2 failure(s) in 320.0 GPU-hours" in out
    assert "expected ETTR" in out and "current" in out and "recommended" in out


def test_unusable_state_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise-interval", "--from-state", str(tmp_path / "none.db")]) == 2
    assert "no state database" in capsys.readouterr().err
    db = make_state(tmp_path)
    assert main(["advise-interval", "--from-state", str(db), "--job", "nope"]) == 2
    assert "no job 'nope'" in capsys.readouterr().err
    with Store.open(tmp_path / "empty.db") as store:
        store.jobs.create_job(name="x", command=["x"], need=1, at=0.0, job_id="j")
    assert main(["advise-interval", "--from-state", str(tmp_path / "empty.db")]) == 2
    assert "no attempt has run yet" in capsys.readouterr().err
    assert main(["advise-interval", "--save-seconds", "5"]) == 2
    assert "--from-state" in capsys.readouterr().err
