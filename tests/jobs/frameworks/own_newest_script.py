"""A plain torchrun/DDP script that picks its own newest checkpoint, as many do:
``ckpt_<step>.pt`` files in a directory, ``sorted(glob(...))[-1]`` on start.
Nothing trainguard-specific: a damaged newest file would crash it on every restart
unless that file is moved out of its way. ``STEP_SLEEP`` paces steps (test pacing).
"""

import argparse
import glob
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--save-every", type=int, default=5)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(torch.nn.Linear(64, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    saved = sorted(glob.glob(os.path.join(args.ckpt_dir, "ckpt_*.pt")))
    if saved:
        state = torch.load(saved[-1], map_location="cpu")
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = state["step"]
        print(f"rank {rank}: resumed from {saved[-1]} at step {start}", flush=True)
    for step in range(start + 1, args.steps + 1):
        loss = model(torch.randn(16, 64)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(float(os.environ.get("STEP_SLEEP", "0")))
        if rank == 0:
            print(f"step={step} loss={loss.item():.4f}", flush=True)
            if step % args.save_every == 0:
                os.makedirs(args.ckpt_dir, exist_ok=True)
                path = os.path.join(args.ckpt_dir, f"ckpt_{step:06d}.pt")
                torch.save(
                    {"model": model.module.state_dict(), "optim": opt.state_dict(), "step": step},
                    path + ".tmp",
                )
                os.replace(path + ".tmp", path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
