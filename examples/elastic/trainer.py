#!/usr/bin/env python3
"""An elastic data-parallel "trainer" to copy: it resumes from its checkpoint at whatever size hsched gives it.

    hsched submit --gpus 2-8 --checkpoint-signal USR1@60 -- python3 examples/elastic/trainer.py --steps 2000

hsched grows an elastic job into GPUs that would idle and shrinks it when others wait, by checkpoint and restart:
it sends the checkpoint signal (here SIGUSR1; SIGTERM too), the trainer finishes the step it is in, saves, and exits
with 85 ("checkpointed, requeue me"); hsched starts it again with the new size in its environment. So a trainer
needs three things, all here:

1. Read its size at start: `HSCHED_GPUS` (GPUs in all; `WORLD_SIZE` says the same for one process per node, and
   `torchrun` reads `PET_NPROC_PER_NODE`/`PET_NNODES` to start one worker per GPU) and `CUDA_VISIBLE_DEVICES`.
2. Keep the *global* batch fixed and split it over the world (per-GPU batch = global / world), so a step means
   the same at every size: steps are counted once, whatever the size, and the learning rate needs no change.
3. Save its state (the step, the model, the optimizer, the data order's position) atomically to
   `$HSCHED_CHECKPOINT_DIR` on the signal, and load it at start when there is one (`HSCHED_RESUME=1`).

This stand-in trains nothing: a step sleeps `--step-seconds` x `--base-gpus` / world (linear scaling; `--efficiency`
below 1 makes it sub-linear), reports progress to hsched (`$HSCHED_PROGRESS`: hsched learns steps/s per size, which
is how it decides whether growing pays), and appends `STEP WORLD` to `steps.log` in its checkpoint folder when the
step is saved, with one `run ...` line per start in `runs.log`: a test reads them to check that no step was lost or
repeated across resizes. `--requeue-after-steps N` makes its first run checkpoint and requeue itself after N steps
(as a job that saves and requeues itself at intervals does): hsched resizes only jobs that proved they resume.

In place (`hsched submit --gpus 2-8 --resize-signal USR2 -- python3 trainer.py --in-place`): hsched does not stop it;
it writes the new devices to `$HSCHED_RESIZE_FILE` (JSON: `gpus`, `world_size`, `devices`, `cuda_visible_devices`)
and sends SIGUSR2; the trainer finishes its step, reads the file and goes on at the new size (a real one would
re-form its process group on the new devices: new workers with the file's CUDA_VISIBLE_DEVICES, a new rendezvous).
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

CHECKPOINT_EXIT = 85
"""hsched's checkpoint exit code: "I saved; requeue me"."""


def world_size() -> int:
    """The GPUs this run has: HSCHED_GPUS (hsched sets it for every run), else WORLD_SIZE, else the visible ones."""
    for name in ("HSCHED_GPUS", "WORLD_SIZE"):
        v = os.environ.get(name, "")
        if v.isdigit() and int(v) > 0:
            return int(v)
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    return max(1, len(visible))


def save(ckdir: str, state: dict[str, int], pending: list[str]) -> None:
    """The steps done since the last save go to steps.log, then the state file is replaced atomically (write, fsync,
    rename): a run killed between the two repeats nothing (the log is read against the state, not the reverse)."""
    if pending:
        with open(os.path.join(ckdir, "steps.log"), "a") as f:
            f.write("".join(pending))
            f.flush()
            os.fsync(f.fileno())
        pending.clear()
    tmp = os.path.join(ckdir, "state.json.tmp")
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(ckdir, "state.json"))


def resized(world: int, ckdir: str, step: int) -> int:
    """The size `$HSCHED_RESIZE_FILE` names now (an in-place resize); `world` when it cannot be read."""
    path = os.environ.get("HSCHED_RESIZE_FILE", "")
    try:
        with open(path) as f:
            new = int(json.load(f)["world_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return world
    with open(os.path.join(ckdir, "runs.log"), "a") as f:
        f.write(f"resize {os.environ.get('HSCHED_RUN', '?')} world {new} in place at step {step}\n")
    print(f"resized in place: world {world} -> {new} at step {step}", flush=True)
    return max(1, new)


def report(step: int, total: int, samples: int) -> None:
    """One progress line for hsched (hsched.progress's format, written here: this trainer needs no hsched)."""
    path = os.environ.get("HSCHED_PROGRESS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"step": step, "total": total, "samples": samples, "t": time.time()}) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--steps", type=int, default=1000, help="global steps in all")
    ap.add_argument("--global-batch", type=int, default=256, help="samples per global step, at every size")
    ap.add_argument("--step-seconds", type=float, default=0.2, help="a step's time at --base-gpus")
    ap.add_argument("--base-gpus", type=int, default=1)
    ap.add_argument("--efficiency", type=float, default=1.0,
                    help="scaling exponent: a step takes step_seconds x (base/world) ** efficiency")
    ap.add_argument("--in-place", action="store_true",
                    help="resize in place on SIGUSR2 (submit with --resize-signal USR2): read $HSCHED_RESIZE_FILE")
    ap.add_argument("--requeue-after-steps", type=int, default=0,
                    help="first run only: checkpoint and requeue itself after this many steps (proves it resumes)")
    opts = ap.parse_args()
    world = world_size()
    ckdir = os.environ.get("HSCHED_CHECKPOINT_DIR") or os.getcwd()
    os.makedirs(ckdir, exist_ok=True)
    state = {"step": 0, "samples": 0}
    path = os.path.join(ckdir, "state.json")
    if os.path.exists(path):
        with open(path) as f:
            state = json.load(f)
    with open(os.path.join(ckdir, "runs.log"), "a") as f:
        f.write(f"run {os.environ.get('HSCHED_RUN', '?')} world {world} resume {os.environ.get('HSCHED_RESUME', '0')} "
                f"from step {state['step']} gpus {os.environ.get('CUDA_VISIBLE_DEVICES', '')}\n")
    per_gpu = opts.global_batch // world  # the global batch split over the world: a step is the same at any size
    print(f"world {world}: {per_gpu} samples per GPU, resuming at step {state['step']}", flush=True)

    stop = {"requested": False, "resize": False}

    def on_signal(_signum: int, _frame: object) -> None:
        stop["requested"] = True  # finish the step in flight, save, exit 85

    def on_resize(_signum: int, _frame: object) -> None:
        stop["resize"] = True  # finish the step in flight, then take the new size

    if opts.in_place:
        signal.signal(signal.SIGUSR2, on_resize)
    signal.signal(signal.SIGUSR1, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    step_s = opts.step_seconds * (opts.base_gpus / world) ** opts.efficiency
    first_run = os.environ.get("HSCHED_RESTART_COUNT", "0") == "0"
    pending: list[str] = []
    done_here = 0
    while state["step"] < opts.steps:
        if stop["requested"]:
            save(ckdir, state, pending)
            print(f"checkpointed at step {state['step']}", flush=True)
            return CHECKPOINT_EXIT
        if stop["resize"]:
            stop["resize"] = False
            world = resized(world, ckdir, state["step"])
            per_gpu = opts.global_batch // world
            step_s = opts.step_seconds * (opts.base_gpus / world) ** opts.efficiency
        time.sleep(step_s)  # one step: world GPUs each on global_batch / world samples
        state["step"] += 1
        state["samples"] += per_gpu * world
        pending.append(f"{state['step']} {world}\n")
        done_here += 1
        report(state["step"], opts.steps, state["samples"])
        if first_run and opts.requeue_after_steps and done_here >= opts.requeue_after_steps:
            save(ckdir, state, pending)
            print(f"requeueing itself at step {state['step']}", flush=True)
            return CHECKPOINT_EXIT
    save(ckdir, state, pending)
    print(f"done: {state['step']} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
