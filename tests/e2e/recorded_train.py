"""tests/jobs/tiny_train.py, recording what each rank was given before it trains.

Each process writes ``$TG_TEST_RECORD_DIR/attempt<A>-rank<R>.json`` with its pid,
rank, attempt and the trainguard environment contract (``CUDA_VISIBLE_DEVICES``,
``TRAINGUARD_DEVICES``, ``TRAINGUARD_RESUME_FROM``, ``PYTORCH_CUDA_ALLOC_CONF``),
then runs tiny_train in the same process (same pid, so a test can kill it).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

TINY_TRAIN = Path(__file__).resolve().parents[1] / "jobs" / "tiny_train.py"
KEYS = (
    "CUDA_VISIBLE_DEVICES",
    "TRAINGUARD_DEVICES",
    "TRAINGUARD_RESUME_FROM",
    "TRAINGUARD_ATTEMPT",
    "TRAINGUARD_PROGRESS",
    "PYTORCH_CUDA_ALLOC_CONF",
)


def main() -> None:
    out = os.environ.get("TG_TEST_RECORD_DIR")
    if out:
        rank = int(os.environ.get("RANK", "0"))
        attempt = os.environ.get("TRAINGUARD_ATTEMPT", "x")
        record = {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "rank": rank,
            "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
            "env": {k: os.environ.get(k) for k in KEYS},
        }
        path = Path(out) / f"attempt{attempt}-rank{rank}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.rename(path)
    sys.argv = [str(TINY_TRAIN), *sys.argv[1:]]
    runpy.run_path(str(TINY_TRAIN), run_name="__main__")


if __name__ == "__main__":
    main()
