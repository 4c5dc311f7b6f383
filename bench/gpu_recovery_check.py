"""The CUDA/NCCL paths of a recovery, checked on a lent GPU machine in one short run.

Run from the repository root with any Python >= 3.11 whose torch has CUDA::

    python3 bench/gpu_recovery_check.py            # about three minutes on one H200
    python3 bench/gpu_recovery_check.py --cpu      # the same script on CPU/gloo (a dry run)

It imports trainguard from ``src/`` (nothing to install) and drives the real
``trainguard run`` over ``torchrun`` with ``tests/jobs/tiny_train.py --device cuda
--backend nccl`` (deterministic CUDA kernels, an NCCL process group even for one
rank, memory snapshots after every step). It checks, on the GPU, what CPU tests can
only reach through the same interfaces:

* **warm restart**: a SIGKILLed rank and a hung rank are restarted through the parked
  standby and its zygote; the forked worker initialises CUDA and NCCL itself (the
  zygote must never have done so) and trains on;
* **snapshot of GPU state**: the restart restores model, optimizer, scaler and the
  CUDA RNG from the memory snapshot, so every step after the restore has the same
  loss, bit for bit, as an uninterrupted run;
* **NCCL abort**: the hung rank holds an NCCL communicator; trainguard's kill must end
  it (no stuck process left holding the GPU) and its successor must build a new one.

It prints one JSON summary and writes it, with every run's output, under ``$OUT``
(``bench/results/`` when ``OUT`` is unset).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "jobs" / "tiny_train.py"
STEPS = 30
FAULT_STEP = 13
DEVICES = ["--need", "1"]  # the machine's real GPU, found through NVML
TRAIN = ["--steps", str(STEPS), "--device", "cuda", "--backend", "nccl", "--pg-timeout", "60"]


def _env(tag: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env["TG_GPU_CHECK"] = tag
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return env


def _torchrun(*args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "1",
        str(JOB),
        *args,
    ]


def _losses(path: Path) -> list[tuple[int, str]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        step, _, value = line.partition("\t")
        if step.isdigit() and value:
            out.append((int(step), value))
    return out


def _rank_pid(tag: str, attempt: str) -> int | None:
    """The rank process of this check's given attempt, found by its environment."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "environ").read_bytes().split(b"\0")
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        env = dict(kv.split(b"=", 1) for kv in raw if b"=" in kv)
        if (
            env.get(b"TG_GPU_CHECK") == tag.encode()
            and env.get(b"TRAINGUARD_ATTEMPT") == attempt.encode()
            and b"LOCAL_RANK" in env
            and b"tiny_train.py" in cmd
        ):
            return int(entry.name)
    return None


def baseline(work: Path, log: list[str]) -> dict[str, Any]:
    losses = work / "baseline.tsv"
    t0 = time.monotonic()
    proc = subprocess.run(
        _torchrun(*TRAIN, "--losses-out", str(losses)),
        env=_env("baseline"),
        capture_output=True,
        text=True,
        timeout=240,
        cwd=work,
    )
    log.append(f"### baseline (rc {proc.returncode})\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return {
        "rc": proc.returncode,
        "seconds": round(time.monotonic() - t0, 2),
        "steps": len(_losses(losses)),
    }


def recovery(work: Path, kind: str, base: dict[int, str], log: list[str]) -> dict[str, Any]:
    """One supervised run with one fault of ``kind`` (crash: SIGKILL; hang) in attempt 0."""
    case = work / kind
    case.mkdir()
    losses = case / "losses.tsv"
    fault = ["--hang-at-step", str(FAULT_STEP), "--fault-attempt", "0"] if kind == "hang" else []
    cmd = [
        sys.executable,
        "-c",
        "import sys; from trainguard.cli import main; sys.exit(main())",
        "run",
        "--state",
        str(case / "state.db"),
        "--checkpoint-dir",
        str(case / "ck"),
        "--log-dir",
        str(case / "logs"),
        "--hang-timeout",
        "8",
        *DEVICES,
        "--",
        *_torchrun(
            *TRAIN,
            "--ckpt-dir",
            str(case / "ck"),
            "--save-every",
            "5",
            "--memory-snapshots",
            "--step-sleep",
            "0.3",
            "--losses-out",
            str(losses),
            *fault,
        ),
    ]
    out = (case / "run.out").open("w")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, env=_env(f"{kind}-{os.getpid()}"), stdout=out, stderr=subprocess.STDOUT, cwd=case
    )
    result: dict[str, Any] = {"kind": kind}
    fault_at: float | None = None
    seen_before = 0
    try:
        while time.monotonic() - t0 < 200:
            rows = _losses(losses)
            if fault_at is None and rows and rows[-1][0] >= FAULT_STEP - 1:
                seen_before = len(rows)
                if kind == "crash":
                    pid = _rank_pid(f"{kind}-{os.getpid()}", "0")
                    if pid is not None:
                        os.kill(pid, signal.SIGKILL)
                        fault_at = time.monotonic()
                        result["killed_pid"] = pid
                        result["killed_after_step"] = rows[-1][0]
                else:
                    fault_at = time.monotonic()  # the job hangs by itself at FAULT_STEP
                    result["hung_after_step"] = rows[-1][0]
            if (
                fault_at is not None
                and "first_step_after_s" not in result
                and len(rows) > seen_before
            ):
                result["first_step_after_s"] = round(time.monotonic() - fault_at, 2)
                result["first_step_after_restart"] = rows[seen_before][0]
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        else:
            proc.kill()
            result["timed_out"] = True
        proc.wait(timeout=30)
    finally:
        out.close()
    result["rc"] = proc.returncode
    result["seconds"] = round(time.monotonic() - t0, 2)
    text = (case / "run.out").read_text(errors="replace")
    logs = (
        "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-6000:]}"
            for p in sorted((case / "logs").rglob("*"))
            if p.is_file()
        )
        if (case / "logs").exists()
        else ""
    )
    log.append(f"### {kind} (rc {proc.returncode})\n{text[-12000:]}\n{logs}")
    rows = _losses(losses)
    final: dict[int, str] = {}
    for step, value in rows:
        final[step] = value  # the last attempt's value of each step is the one that counts
    result["steps_completed"] = max(final) if final else 0
    result["bitwise_equal_to_uninterrupted"] = bool(final) and all(
        base.get(step) == value for step, value in final.items()
    )
    result["mismatched_steps"] = sorted(s for s, v in final.items() if base.get(s) != v)[:10]
    restored = re.findall(r"restored step (\d+) from memory snapshot", text + logs)
    result["restored_from_memory_snapshot"] = [int(s) for s in restored]
    if rows and seen_before:
        reached = max(s for s, _ in rows[:seen_before])
        restart_first = rows[seen_before][0] if len(rows) > seen_before else None
        result["lost_steps"] = (
            None if restart_first is None else max(0, reached - (restart_first - 1))
        )
    warm = re.search(r"attempt 1 requested; (warm start: .*?zygote pid \d+|cold start[^\n]*)", text)
    result["attempt1_start"] = warm.group(1) if warm else None
    result["warm_workers"] = bool(warm) and "warm workers: zygote" in warm.group(1)
    cold_workers = re.findall(r"[^\n]*(?:starts? cold|worker[^\n]*cold)[^\n]*", logs)
    result["cold_worker_notes"] = cold_workers[:3]
    result["cuda_reinit_error"] = "Cannot re-initialize CUDA in forked subprocess" in text + logs
    leftover = _rank_pid(f"{kind}-{os.getpid()}", "0")
    result["attempt0_rank_left_running"] = leftover is not None
    return result


def gpu_facts() -> dict[str, Any]:
    import torch

    facts: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpus": torch.cuda.device_count(),
        "job": " ".join(TRAIN),
    }
    if torch.cuda.is_available():
        facts["name"] = torch.cuda.get_device_name(0)
        facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return facts


def main() -> int:
    if "--cpu" in sys.argv[1:]:
        TRAIN[TRAIN.index("cuda")] = "cpu"
        TRAIN[TRAIN.index("nccl")] = "gloo"
        DEVICES[:] = ["--devices", "1"]
    out = Path(os.environ.get("OUT") or ROOT / "bench" / "results")
    out.mkdir(parents=True, exist_ok=True)
    log: list[str] = []
    summary: dict[str, Any] = {"facts": gpu_facts()}
    if "--cpu" not in sys.argv[1:] and not summary["facts"]["gpus"]:
        print("no CUDA device: run with --cpu for a dry run", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="tg-gpu-") as tmp:
        work = Path(tmp)
        summary["baseline"] = baseline(work, log)
        base = dict(_losses(work / "baseline.tsv"))
        for kind in ("crash", "hang"):
            try:
                summary[kind] = recovery(work, kind, base, log)
            except Exception as exc:  # one broken case must not hide the other's figures
                summary[kind] = {"error": repr(exc)}
    (out / "gpu_recovery_check.json").write_text(json.dumps(summary, indent=2))
    (out / "gpu_recovery_check.log").write_text("\n\n".join(log))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
