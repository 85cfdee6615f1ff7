#!/usr/bin/env python3
"""The same checkpoint/resume protocol with PyTorch DDP (CPU gloo works too):

    hsched submit --nodes 2 --tasks-per-node 2 --checkpoint-signal USR1@60 -- python3 ddp_trainer.py

hsched gives every rank torchrun's environment (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK,
LOCAL_WORLD_SIZE, NODE_RANK), so `init_process_group("env://")` just works. On SIGUSR1/SIGTERM rank 0 saves
with torch.save into HSCHED_CHECKPOINT_DIR and every rank exits 85; the next run resumes with torch.load.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch
import torch.distributed as dist

try:  # progress for hsched (what it learns of this kind's speed); nothing to do without it
    from hsched.progress import report
except ImportError:
    def report(step: float | None = None, total: float | None = None, *, samples: float | None = None,
               loss: float | None = None) -> None:
        return None

CHECKPOINT_EXIT = 85


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    opts = ap.parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method="env://")
    rank = dist.get_rank()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local}") if backend == "nccl" else torch.device("cpu")
    model = torch.nn.Linear(16, 1).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local] if backend == "nccl" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    ckpt = os.path.join(os.environ.get("HSCHED_CHECKPOINT_DIR", "."), "ddp.pt")
    step = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt, map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    stop = torch.zeros(1)

    def on_signal(signum: int, _frame: object) -> None:
        stop.fill_(1)

    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, on_signal)
    while step < opts.steps:
        flag = stop.clone().to(device)
        dist.all_reduce(flag)  # every rank learns that any rank was asked to stop
        if flag.item() > 0:
            if rank == 0:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt)
            dist.barrier()
            dist.destroy_process_group()
            return CHECKPOINT_EXIT
        x = torch.randn(32, 16, device=device)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
            report(step=step, total=opts.steps, loss=loss.item())
    if rank == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
