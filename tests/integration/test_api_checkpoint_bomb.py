"""Issue 25 item 3 against a real ``trainguard serve``: a 9-byte memo bomb in a managed
job's checkpoint directory (as a DCP ``.metadata``, a plain pickle and a zip's
``data.pkl``) keeps every serve process small on unauthenticated ``/metrics``
scrapes and on ``GET /v1/jobs``; the job shows no valid checkpoint.

Before: the API process peaked at 2.17 GB on every such request.
"""

from __future__ import annotations

import io
import os
import time
import zipfile
from pathlib import Path

import httpx
from _api_procs import Server, free_port, wait_for, write_tokens

MEMO_BOMB = b"\x80\x02Nr\x00\x00\x00\x08."
MIB = 1 << 20


def _peak_rss(pid: int) -> int:
    """VmHWM (peak resident set) of ``pid`` in bytes, 0 when it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _session(pid: int) -> list[int]:
    """``pid`` and every process of its session (serve and its loop process)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == pid:  # the session id
            out.append(int(entry))
    return out


def _bomb_dir(root: Path) -> Path:
    ck = root / "ckpt"
    (ck / "step_5").mkdir(parents=True)
    (ck / "step_5" / ".metadata").write_bytes(MEMO_BOMB)
    (ck / "step_5" / "__0_0.distcp").write_bytes(b"x")
    (ck / "model_step_6.pt").write_bytes(MEMO_BOMB)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("archive/data.pkl", MEMO_BOMB)
    (ck / "model_step_7.pt").write_bytes(buf.getvalue())
    return ck


def test_memo_bomb_in_a_jobs_checkpoint_dir_keeps_serve_small(tmp_path: Path) -> None:
    write_tokens(tmp_path)
    ck = _bomb_dir(tmp_path)
    server = Server(tmp_path, free_port())
    try:
        with server.client() as op:
            r = op.post(
                "/v1/jobs",
                json={
                    "scheduler_ref": "ext-bomb",
                    "name": "bomb",
                    "command": ["python", "train.py"],
                    "need": 1,
                    "checkpoint_dir": str(ck),
                    "job_id": "j-bomb",
                },
            )
            assert r.status_code == 201, r.text
            for _ in range(10):  # anonymous scrapes: no token
                t0 = time.monotonic()
                r = httpx.get(server.url + "/metrics", timeout=30)
                assert r.status_code == 200
                assert time.monotonic() - t0 < 10
            wait_for(
                lambda: (
                    'trainguard_job_checkpoint_missing{job_id="j-bomb"} 1.0'
                    in httpx.get(server.url + "/metrics", timeout=30).text
                ),
                30,
                "the bomb job's checkpoint_missing metric",
            )
            for _ in range(5):
                jobs = op.get("/v1/jobs").json()
                (job,) = [j for j in jobs if j["id"] == "j-bomb"]
                protection = job["checkpoint_protection"]
                assert protection is not None and protection["newest_step"] is None, protection
            pids = _session(server.p.pid)
            assert server.p.pid in pids
            peaks = {pid: _peak_rss(pid) for pid in pids}
            assert max(peaks.values()) < 400 * MIB, peaks  # was 2.17 GB per request
        assert server.p.poll() is None, server.output()
    finally:
        server.stop()
