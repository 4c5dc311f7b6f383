"""A torchtitan-style job on CPU: gloo, ``torch.distributed.checkpoint`` (DCP) saves,
a step line every ``--log-every`` steps, written at module level as many scripts are,
and the process group destroyed at the end (torchtitan does) while the script's globals
still hold it and the DCP state that used it.

``--resume`` loads the newest ``step-N`` directory under ``--ckpt`` (torchtitan's
"Loading the checkpoint at step N."). The exit status is ``--exit-code``.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--save-every", type=int, default=2)
    parser.add_argument("--log-every", type=int, default=1)
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--async-save", action="store_true")
    # A garbage collection on the way out (any allocation in an atexit handler may start
    # one): what frees a runpy'd script's globals before finalisation (decision 0490).
    parser.add_argument("--collect-at-exit", action="store_true")
    args = parser.parse_args()
    if args.collect_at_exit:
        atexit.register(gc.collect)

    dist.init_process_group("gloo")
    group = dist.new_group(backend="gloo")  # the checkpoint's own, as torchtitan's async mode
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    start = 0
    saved = sorted(
        (int(name.split("-")[1]) for name in os.listdir(args.ckpt) if name.startswith("step-"))
        if os.path.isdir(args.ckpt)
        else []
    )
    if saved:
        start = saved[-1]
        print(f"Loading the checkpoint at step {start}.", flush=True)
        dcp.load(state, checkpoint_id=os.path.join(args.ckpt, f"step-{start}"), process_group=group)
        model.load_state_dict(state["model"])
    data = torch.randn(16, 32)
    pending = None
    for step in range(start + 1, args.steps + 1):
        loss = model(data).pow(2).mean()
        loss.backward()
        for param in model.parameters():
            assert param.grad is not None
            dist.all_reduce(param.grad)
        optimizer.step()
        optimizer.zero_grad()
        if step % args.save_every == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            if pending is not None:
                pending.result()  # one save in flight, as torchtitan's async mode
            where = os.path.join(args.ckpt, f"step-{step}")
            if args.async_save:
                pending = dcp.async_save(state, checkpoint_id=where, process_group=group)
            else:
                dcp.save(state, checkpoint_id=where, process_group=group)
        if step % args.log_every == 0:
            print(f"step: {step:2d}  loss: {loss.item():7.4f}", flush=True)
    if pending is not None:
        pending.result()
    print("training completed", flush=True)
    dist.destroy_process_group()
    sys.exit(args.exit_code)
