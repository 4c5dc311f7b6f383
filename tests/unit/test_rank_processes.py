"""``trainguard ps``'s reading of a rank's environment (signals.ranks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from trainguard.signals.ranks import driven_device, rank_processes

DEVICES = json.dumps(
    [
        {"index": 0, "uuid": "GPU-aaaa"},
        {"index": 1, "uuid": "GPU-bbbb"},
        {"index": 2, "uuid": "GPU-cccc"},
    ]
)


def test_the_driven_device_is_the_only_visible_one_or_the_local_ranks() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,2", "TRAINGUARD_DEVICES": DEVICES}
    assert driven_device(env, 0) == "GPU-aaaa"
    assert driven_device(env, 1) == "GPU-cccc"
    assert driven_device(env, 5) is None  # more ranks than cards: not guessed
    assert driven_device({"CUDA_VISIBLE_DEVICES": "2", "TRAINGUARD_DEVICES": DEVICES}, 3) == (
        "GPU-cccc"
    )
    assert driven_device({"CUDA_VISIBLE_DEVICES": "GPU-bbbb"}, 0) == "GPU-bbbb"
    assert driven_device({"CUDA_VISIBLE_DEVICES": "1", "TRAINGUARD_DEVICES": "junk"}, 0) == "1"
    assert driven_device({}, 0) is None


def test_a_process_with_a_job_id_and_local_rank_is_listed() -> None:
    env = dict(
        os.environ,
        TRAINGUARD_JOB_ID="job-ps-test",
        LOCAL_RANK="1",
        RANK="3",
        TRAINGUARD_ATTEMPT="2",
        CUDA_VISIBLE_DEVICES="0,1",
        TRAINGUARD_DEVICES=DEVICES,
    )
    agent = dict(os.environ, TRAINGUARD_JOB_ID="job-ps-test")  # no LOCAL_RANK: not a rank
    procs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=e)
        for e in (env, agent)
    ]
    try:
        time.sleep(0.2)
        [r] = rank_processes({"job-ps-test"})
        assert (r.pid, r.rank, r.local_rank, r.attempt, r.device, r.warm) == (
            procs[0].pid,
            3,
            1,
            2,
            "GPU-bbbb",
            False,
        )
        assert r.command[1:] == ("-c", "import time; time.sleep(30)")
        assert rank_processes({"another-job"}) == []
    finally:
        for p in procs:
            p.kill()
            p.wait()
