"""Demo: trainguard catches a damaged checkpoint and picks the previous valid one.

1. trains a tiny model for 60 steps with ``trainguard.train``, checkpointing every 20;
2. lists the checkpoints with ``trainguard checkpoints DIR --verify full``;
3. flips one byte in the newest checkpoint (as a bad disk or a torn write would);
4. lists them again: the newest is invalid ("sha256 mismatch");
5. ``trainguard checkpoints DIR --latest`` chooses the previous one, and
   ``trainguard.train.resume`` restores from it.

Deterministic (fixed seeds, fixed byte), CPU only, a few seconds. Exits non-zero if
any of these outcomes is not what it should be.

    .venv/bin/python examples/demo_checkpoints.py [--dir demo-run/checkpoints]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def banner(text: str) -> None:
    print(f"\n=== {text}")


def trainguard(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the real ``trainguard`` command and show it as a user would see it."""
    print(f"$ trainguard {' '.join(args)}")
    result = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", *args], capture_output=True, text=True
    )
    sys.stdout.write(result.stdout)
    sys.stdout.write("".join(f"[stderr] {line}\n" for line in result.stderr.splitlines()))
    print(f"(exit {result.returncode})")
    return result


def train(ckpt_dir: Path, steps: int, every: int) -> list[str]:
    import torch

    from trainguard.train import CheckpointManager, TrainState, resume

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=25, gamma=0.5)
    state = TrainState(model=model, optimizer=opt, scheduler=sched)
    target = torch.randn(16, 1)
    saved = []
    with CheckpointManager(ckpt_dir, keep=3) as ckpt:
        start = resume(ckpt, state).step
        for step in range(start + 1, steps + 1):
            x = torch.randn(32, 16)
            loss = torch.nn.functional.mse_loss(model(x), x @ target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            if step % every == 0:
                result = ckpt.save(step, state) or ckpt.wait()
                assert result is not None and result.valid, f"save of step {step} failed"
                saved.append(result.path)
                print(f"step {step:3d}  loss {loss.item():.4f}  checkpoint -> {result.path}")
    return saved


def flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    offset = len(data) // 2
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    print(f"flipped the byte at offset {offset} of {path} ({len(data)} bytes, same size)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dir", default=str(ROOT / "demo-run" / "checkpoints"))
    args = parser.parse_args()
    # Keep our lines and the library's log lines (stderr) in order when piped.
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    ckpt_dir = Path(args.dir)
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    ckpt_dir.mkdir(parents=True)
    failures: list[str] = []

    banner("1. train a tiny model for 60 steps, checkpoint every 20 (trainguard.train)")
    saved = train(ckpt_dir, steps=60, every=20)
    newest, previous = Path(saved[-1]), Path(saved[-2])

    banner("2. list the checkpoints, verifying every byte against the manifest's sha256")
    trainguard("checkpoints", str(ckpt_dir), "--verify", "full")

    banner("3. damage the newest checkpoint: one flipped byte, size unchanged")
    victim = max((p for p in newest.iterdir() if p.suffix == ".pt"), key=lambda p: p.stat().st_size)
    flip_one_byte(victim)

    banner("4. list again: full verification catches it")
    listing = trainguard("checkpoints", str(ckpt_dir), "--verify", "full")
    if "sha256 mismatch" not in listing.stdout:
        failures.append("the damaged checkpoint was not reported with 'sha256 mismatch'")
    print("\nquick mode reads sizes only, so it cannot see a same-size change:")
    trainguard("checkpoints", str(ckpt_dir), "--verify", "quick")

    banner("5. which checkpoint would a restart use?")
    latest = trainguard("checkpoints", str(ckpt_dir), "--latest")
    if latest.returncode != 0 or latest.stdout.strip() != str(previous):
        failures.append(f"--latest chose {latest.stdout.strip()!r}, expected {previous}")

    banner("6. resume training: trainguard.train.resume restores the previous valid one")
    import torch

    from trainguard.train import CheckpointManager, TrainState, resume

    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with CheckpointManager(ckpt_dir, keep=3) as ckpt:
        resumed = resume(ckpt, TrainState(model=model, optimizer=opt))
    print(f"resumed from {resumed.path} at step {resumed.step} ({resumed.source})")
    if resumed.path is None or Path(resumed.path) != previous:
        failures.append(f"resume restored {resumed.path}, expected {previous}")

    banner("result")
    if failures:
        for f in failures:
            print(f"FAILED: {f}")
        return 1
    print(
        f"OK: the damaged {newest.name} was reported invalid and {previous.name} "
        "(the previous valid checkpoint) was chosen."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
