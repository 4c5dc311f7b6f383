"""A small job for the control-plane tests: steps, checkpoints, and failures on cue.

Stdlib only (no torch), so a test can start many. It prints ``step=N`` lines
(the progress the controller follows), writes a trainguard-format checkpoint
(``step_<8 digits>/`` with ``state.json`` and the manifest written last) every
``--every`` steps under ``--ckpt``, resumes from ``TRAINGUARD_RESUME_FROM``, and
fails on cue:

  --fail-attempts 0,1   attempts that fail (``TRAINGUARD_ATTEMPT``)
  --fail-at STEP        ... when they reach this step
  --exit CODE           ... with this exit code (default 1)
  --error TEXT          ... printing this as a Python exception first
  --hang                ... by hanging (no more output, never exits) instead
  --hang-for SECONDS    ... by hanging that long once, then stepping on to the end
  --xid-log FILE        ... after appending an XID 79 line for its device ``--xid-device``
                        (an index into ``TRAINGUARD_DEVICES``) to this kernel log
  --steps N             stop (exit 0) after step N (default: run for a long time)
  --interval S          seconds per step
  --no-steps            print ``tick`` lines, no step (a job without a progress signal)
  --steps-from N        ... until step N, then ``step=N`` lines (a slow first step)
  --epoch-lines         ... printing ``Epoch N | Batchsize: 32`` (liveness) instead of ``tick``
  --slow-attempts 1     attempts that step every ``--slow-interval`` seconds instead
  --json-steps          print ``{"step": N, "time": T}`` lines (the job's own time of
                        each step, decision 0320) instead of ``step=N``
  --ranks N             print each step once per rank, with torchrun's ``[rankR]:`` prefix
                        (one process standing for N ranks that report their progress)
  --silent-rank-attempts 1,2  attempts in which only rank 0 reports (the others are mute)
  --warn TEXT           ... printing this line before the failure (an NCCL warning before
                        the exception it causes, as a real log reads)
  --damage-newest       ... after truncating the newest checkpoint's ``state.json``
                        (its manifest then disagrees: damaged on storage)
  --nan-log-attempts 0  attempts that print a Trainer log dict with a NaN loss and gradient
  --nan-log-at STEP     ... after this step: ``{'loss': nan, 'grad_norm': nan, ...}``
                        (and step on, as a Trainer does)
  --env-log FILE        append ``{"attempt": N, "PYTORCH_CUDA_ALLOC_CONF": ...}`` to FILE
                        at start (what the attempt's environment really had)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path


def save(root: Path, step: int) -> None:
    final = root / f"step_{step:08d}"
    if final.exists():
        return
    tmp = root / f".tmp-step_{step:08d}-{os.getpid()}"
    tmp.mkdir(parents=True)
    data = json.dumps({"step": step}).encode()
    (tmp / "state.json").write_bytes(data)
    manifest = {
        "format": "trainguard",
        "format_version": 1,
        "step": step,
        "epoch": None,
        "world_size": 1,
        "created_at": time.time(),
        "save_seconds": 0.0,
        "trainguard_version": "test",
        "files": [
            {"path": "state.json", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        ],
        "extra": {},
    }
    (tmp / "trainguard-manifest.json").write_text(json.dumps(manifest))
    os.rename(tmp, final)


def xid(kernel_log: str, index: int) -> None:
    """The card falls off the bus: the kernel's line, as ``trainguard run`` follows it."""
    dev = json.loads(os.environ["TRAINGUARD_DEVICES"])[index]
    with open(kernel_log, "a") as fh:
        fh.write(
            f"NVRM: Xid (PCI:{dev['pci_bus_id'][:-2]}): 79, pid={os.getpid()}, name=python, "
            "GPU has fallen off the bus.\n"
        )
    time.sleep(0.3)  # the supervisor reads the evidence before the exit it explains


def damage_newest(root: Path) -> None:
    """Half of the newest checkpoint's state.json is lost (size and sha256 no longer
    match its manifest): a restore from it would fail, validation must reject it."""
    newest = max(root.glob("step_*"))
    data = (newest / "state.json").read_bytes()
    (newest / "state.json").write_bytes(data[: len(data) // 2])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt")
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--fail-attempts", default="")
    ap.add_argument("--fail-at", type=int, default=8)
    ap.add_argument("--exit", type=int, default=1)
    ap.add_argument("--error")
    ap.add_argument("--hang", action="store_true")
    ap.add_argument("--hang-for", type=float, default=0.0)
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--interval", type=float, default=0.05)
    ap.add_argument("--no-steps", action="store_true")
    ap.add_argument("--steps-from", type=int, default=0)
    ap.add_argument("--epoch-lines", action="store_true")
    ap.add_argument("--slow-attempts", default="")
    ap.add_argument("--slow-interval", type=float, default=1.0)
    ap.add_argument("--json-steps", action="store_true")
    ap.add_argument("--xid-log")
    ap.add_argument("--xid-device", type=int, default=1)
    ap.add_argument("--ranks", type=int, default=0)
    ap.add_argument("--silent-rank-attempts", default="")
    ap.add_argument("--warn")
    ap.add_argument("--damage-newest", action="store_true")
    ap.add_argument("--env-log")
    ap.add_argument("--nan-log-attempts", default="")
    ap.add_argument("--nan-log-at", type=int, default=0)
    args = ap.parse_args()
    nan_log = {int(a) for a in args.nan_log_attempts.split(",") if a.strip()}
    attempt = int(os.environ.get("TRAINGUARD_ATTEMPT", "0"))
    failing = {int(a) for a in args.fail_attempts.split(",") if a.strip()}
    hung = False
    if attempt in {int(a) for a in args.slow_attempts.split(",") if a.strip()}:
        args.interval = args.slow_interval
    if args.env_log:
        seen = {
            "attempt": attempt,
            "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        }
        with open(args.env_log, "a") as fh:
            fh.write(json.dumps(seen) + "\n")
    step = 0
    resume = os.environ.get("TRAINGUARD_RESUME_FROM")
    if resume:
        step = json.loads((Path(resume) / "state.json").read_text())["step"]
        if not args.no_steps:
            print(f"resumed from step {step} ({resume})", flush=True)
    while step < args.steps:
        step += 1
        time.sleep(args.interval)
        if args.no_steps and not (args.steps_from and step >= args.steps_from):
            print(f"Epoch {step} | Batchsize: 32" if args.epoch_lines else "tick", flush=True)
        elif args.json_steps:
            print(json.dumps({"step": step, "time": time.time()}), flush=True)
        elif args.ranks:
            mute = attempt in {int(a) for a in args.silent_rank_attempts.split(",") if a.strip()}
            for rank in range(1 if mute else args.ranks):
                print(f"[rank{rank}]:step={step}", flush=True)
        else:
            print(f"step={step}", flush=True)
        if attempt in nan_log and step == args.nan_log_at:
            print(
                "{'loss': nan, 'grad_norm': nan, 'learning_rate': 5e-05, 'epoch': 0.5}",
                flush=True,
            )
        if args.ckpt and step % args.every == 0:
            save(Path(args.ckpt), step)
        if attempt in failing and step >= args.fail_at:
            if args.damage_newest and args.ckpt:
                damage_newest(Path(args.ckpt))
            if args.xid_log:
                xid(args.xid_log, args.xid_device)
            if args.warn:
                print(args.warn, flush=True)
            if args.hang_for:
                if not hung:  # silent for a while, then on to the end as if nothing happened
                    hung = True
                    time.sleep(args.hang_for)
                continue
            if args.hang:
                while True:
                    time.sleep(3600)
            if args.error:
                print("Traceback (most recent call last):", flush=True)
                print('  File "train.py", line 1, in <module>', flush=True)
                print(args.error, flush=True)
            return args.exit
    return 0


if __name__ == "__main__":
    sys.exit(main())
