"""A job swaps the manifest of a checkpoint trainguard already judged valid for a FIFO,
against a real ``trainguard serve --mode act --scheduler procs`` (decision 0423).

The job owns its checkpoint directory: the manifest is a link to a file of a
subdirectory; once the watch has read the checkpoint, the job puts a FIFO where that file
was and keeps the directory's total size and newest mtime as they were (the verdict
cache's key), so the cached verdict stays "valid". The fleet report then reads the
manifest's save time in the request: before, ``read_text`` on the FIFO blocked the
request's worker thread for good (a few such requests and the API stops answering);
now the read refuses anything but a regular file, and the report answers.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import time
from pathlib import Path

import httpx
import pytest
from _api_procs import OP, Server, kill_cluster_jobs, wait_for

from trainguard.checkpoints._fs import tree_size_and_mtime
from trainguard.model.checkpoint import MANIFEST_NAME, Manifest, ManifestFile


@pytest.mark.slow
def test_a_manifest_swapped_for_a_fifo_does_not_hang_the_fleet_report(tmp_path: Path) -> None:
    (tmp_path / "tokens.yaml").write_text(f'"{OP}": {{role: operator, name: alice}}\n')
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    cluster = tmp_path / "cluster"
    server = Server.procs(tmp_path, "node1=1", 0.5)
    fifo_path = ckpts / "step_00000010" / "sub" / "manifest.json"
    try:
        with server.client(OP) as c:
            r = c.post(
                "/v1/jobs/submit",
                json={
                    "name": "swapper",
                    "command": [sys.executable, "-c", "import time; time.sleep(300)"],
                    "devices_per_node": 1,
                    "job_id": "job-swapper",
                    "checkpoint_dir": str(ckpts),
                },
            )
            assert r.status_code == 201, r.text
            # A valid trainguard checkpoint whose manifest is a link to a file below it.
            step = ckpts / "step_00000010"
            (step / "sub").mkdir(parents=True)
            data = b"w" * 4096
            (step / "model.pt").write_bytes(data)
            manifest = Manifest(
                step=10,
                world_size=1,
                created_at=time.time(),
                trainguard_version="test",
                files=(ManifestFile("model.pt", len(data), hashlib.sha256(data).hexdigest()),),
                save_seconds=2.5,
            ).to_json()
            fifo_path.write_text(manifest)
            (step / MANIFEST_NAME).symlink_to("sub/manifest.json")
            wait_for(
                lambda: sum(
                    b["count"] for b in c.get("/v1/fleet/report").json()["checkpoint_write"]
                ),
                60,
                "the report to count the checkpoint's save",
            )
            # The swap, keeping the cache's key (the entry's own mtime, its files' total
            # size and newest mtime): the swap is in the subdirectory, the FIFO is not
            # counted, the data file grows by what the manifest weighed, its mtime is
            # put back.
            size_then, newest = tree_size_and_mtime(step)
            fifo_path.unlink()
            os.mkfifo(fifo_path)
            with open(step / "model.pt", "ab") as fh:
                fh.write(b"w" * (size_then - tree_size_and_mtime(step)[0]))
            os.utime(step / "model.pt", (newest, newest))
            assert tree_size_and_mtime(step) == (size_then, newest)  # the same key
            for _ in range(3):
                r = c.get("/v1/fleet/report", timeout=20)
                assert r.status_code == 200, r.text
            assert c.get("/v1/status", timeout=20).status_code == 200
    finally:
        with contextlib.suppress(OSError):  # let a reader blocked on the FIFO go
            os.close(os.open(fifo_path, os.O_WRONLY | os.O_NONBLOCK))
        with contextlib.suppress(httpx.HTTPError):
            server.stop()
        kill_cluster_jobs(cluster)
