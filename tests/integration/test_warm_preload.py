"""The zygote imports what the job's script imports (decision 0498): a restarted warm
worker finds its framework already loaded, and a module that would make forking unsafe
sends the workers cold, said in the attempt log.

Real processes: a parked standby, its zygote, the torchrun agent and forked workers.
The "framework" is a package on ``PYTHONPATH`` that records which process imported it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

from trainguard.schedulers.local import LaunchSpec, LocalScheduler, job_processes

FRAMEWORK = """
import os
with open(os.environ["TG_IMPORT_LOG"], "a") as fh:
    fh.write(f"import {os.getpid()}\\n")

def __getattr__(name):
    if name == "Trainer":  # a lazy framework: the name pulls in the heavy part
        with open(os.environ["TG_IMPORT_LOG"], "a") as fh:
            fh.write(f"lazy {os.getpid()}\\n")
        return type("Trainer", (), {})
    raise AttributeError(name)
"""
THREADED = """
import threading, time
threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
"""
# The script's own helper module imports the framework; the helper itself runs job code
# and must not be preloaded.
HELPER = "import os\nfrom tgframework import Trainer\nLOADED_IN = os.getpid()\n"
JOB = """
import os, sys
line = (f"attempt {os.environ['TRAINGUARD_ATTEMPT']} preloaded {'tgframework' in sys.modules} "
        f"helper {'tghelper' in sys.modules}\\n")
os.write(1, line.encode())  # one write: the two ranks' lines never interleave
import tghelper
"""


def _wait(what: Any, timeout: float, why: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(why)


def _zygotes(job_id: str, not_: tuple[int, ...]) -> list[int]:
    found = []
    for p in job_processes(job_id):
        with contextlib.suppress(OSError):
            if p not in not_ and Path(f"/proc/{p}/comm").read_bytes().strip() == b"tg-zygote":
                found.append(p)
    return found


def _zygote(job_id: str, not_: tuple[int, ...] = ()) -> int:
    # One zygote: a child it has just forked bears its name until it renames itself.
    def single() -> list[int] | None:
        found = _zygotes(job_id, not_)
        return found if len(found) == 1 else None

    [pid] = _wait(single, 90, "no single zygote was forked by the standby")
    return int(pid)


def _scheduler(tmp_path: Path, extra_module: str = "") -> tuple[LocalScheduler, tuple[str, ...]]:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "tgframework.py").write_text(FRAMEWORK)
    (lib / "tgthreaded.py").write_text(THREADED)
    work = tmp_path / "job"
    work.mkdir()
    (work / "tghelper.py").write_text(HELPER)
    (work / "train.py").write_text(extra_module + JOB)
    sched = LocalScheduler(lambda ev: None, stdout=sys.stdout.buffer, stderr=sys.stderr.buffer,
                           warm_standby=True, warm_workers=True)  # fmt: skip
    path = [str(lib), *filter(None, [sched.base_env.get("PYTHONPATH", "")])]
    sched.base_env["PYTHONPATH"] = os.pathsep.join(path)
    sched.base_env["TG_IMPORT_LOG"] = str(tmp_path / "imports.log")
    cmd = (sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "2", str(work / "train.py"))  # fmt: skip
    return sched, cmd


def _run(sched: LocalScheduler, cmd: tuple[str, ...], attempt: int, log: Path) -> str:
    att = sched.launch(LaunchSpec(cmd, attempt, (), None, str(log), job_id="pre"))
    assert att.proc.wait(180) == 0, log.read_text()
    att.wait_closed(5.0)
    return att.start_note or ""


def test_a_restarted_worker_finds_its_scripts_imports_done_by_the_zygote(
    tmp_path: Path,
) -> None:
    sched, cmd = _scheduler(tmp_path)
    logs = [tmp_path / f"attempt-{i}.log" for i in range(2)]
    try:
        _run(sched, cmd, 0, logs[0])
        assert logs[0].read_text().count("attempt 0 preloaded False helper False") == 2
        zygote = _zygote("pre")
        imports = tmp_path / "imports.log"
        _wait(lambda: f"lazy {zygote}" in imports.read_text(), 60, "the zygote did not preload")
        note = _run(sched, cmd, 1, logs[1])
        assert "warm workers: zygote pid" in note and "preloading tgframework" in note, note
        # Both ranks: the framework (and the lazily loaded name) came from the zygote; the
        # script's own helper module ran in the worker, once, after the script started.
        assert logs[1].read_text().count("attempt 1 preloaded True helper False") == 2
        lines = imports.read_text().split()
        assert lines.count(str(zygote)) == 2  # "import" and "lazy", in the zygote alone
    finally:
        sched.close()


def test_a_module_that_starts_a_thread_sends_the_workers_cold_and_the_log_says_why(
    tmp_path: Path,
) -> None:
    sched, cmd = _scheduler(tmp_path, extra_module="import tgthreaded\n")
    logs = [tmp_path / f"attempt-{i}.log" for i in range(2)]
    try:
        _run(sched, cmd, 0, logs[0])
        _zygote("pre")
        note = _run(sched, cmd, 1, logs[1])
        assert note.startswith("warm start: "), note
        text = logs[1].read_text()
        why = "preloading tgthreaded started a thread, so the zygote may not fork"
        assert f"# trainguard: cold workers: {why}\n" in text, text
        assert text.count("attempt 1 preloaded False helper False") == 2  # cold, and done
    finally:
        sched.close()
