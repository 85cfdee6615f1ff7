#!/usr/bin/env python3
"""A small pure-Python "trainer" that checkpoints on its signal and resumes from HSCHED_CHECKPOINT_DIR.

    hsched submit --checkpoint-signal USR1@30 -- python3 trainer.py --steps 100 --step-seconds 0.5

It counts steps. On SIGUSR1 it writes its state; then, if hsched sent the signal to stop it (a preemption,
a time limit: the last line of $HSCHED_RUN_DIR/signals.log says why), it exits with 85 (hsched's checkpoint
exit code: "checkpointed, requeue me"), else (`hsched checkpoint JOB`) it goes on. On SIGTERM or SIGINT it
writes its state and exits with 85. When hsched starts it again (HSCHED_RESUME=1) it continues from the
saved step.
It also appends one line per run to `runs.log` in the checkpoint folder, so a test can see where each run
began, and reports its progress to hsched after every step (a JSON line in $HSCHED_PROGRESS: hsched learns
how fast this kind runs on each GPU type). `--speed MODEL=FACTOR` (repeatable) makes a step FACTOR times
faster on GPUs whose model (HSCHED_GPU_MODEL) contains MODEL: a stand-in for a model that suits one GPU
better than another. Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

CHECKPOINT_EXIT = 85


def why_signalled() -> str:
    """Why hsched sent the last signal (`purpose` in the run's signals.log: checkpoint, preempted, timeout,
    cancelled...), or "stop" when it cannot be told (run outside hsched)."""
    run_dir = os.environ.get("HSCHED_RUN_DIR")
    if not run_dir:
        return "stop"
    try:
        with open(os.path.join(run_dir, "signals.log")) as f:
            lines = f.read().splitlines()
        return str(json.loads(lines[-1]).get("purpose") or "stop")
    except (OSError, ValueError, IndexError):
        return "stop"


def report(step: int, total: int) -> None:
    """One progress line for hsched (hsched.progress's format, written here: this trainer needs no hsched)."""
    path = os.environ.get("HSCHED_PROGRESS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"step": step, "total": total, "t": time.time()}) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--step-seconds", type=float, default=0.2)
    ap.add_argument("--speed", action="append", default=[], metavar="MODEL=FACTOR",
                    help="steps FACTOR times faster on a GPU whose model contains MODEL")
    ap.add_argument("--model", default="", help="the model it pretends to train (part of its kind)")
    opts = ap.parse_args()
    gpu = os.environ.get("HSCHED_GPU_MODEL", "").lower()
    for item in opts.speed:
        name, _, factor = item.partition("=")
        if name and name.lower() in gpu:
            opts.step_seconds /= float(factor or 1)
    # first of all: a stop that came before the handlers killed the run outright, and it did no work
    stop = {"requested": False, "checkpoint": False}

    def on_signal(signum: int, _frame: object) -> None:
        if signum == signal.SIGUSR1 and why_signalled() == "checkpoint":
            stop["checkpoint"] = True  # save and go on
        else:
            stop["requested"] = True

    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)

    ckdir = os.environ.get("HSCHED_CHECKPOINT_DIR") or os.getcwd()
    os.makedirs(ckdir, exist_ok=True)
    path = os.path.join(ckdir, "state.json")
    state = {"step": 0}
    if os.path.exists(path):
        with open(path) as f:
            state = json.load(f)
    with open(os.path.join(ckdir, "runs.log"), "a") as f:
        f.write(f"run {os.environ.get('HSCHED_RUN', '?')} node {os.environ.get('HSCHED_NODE', '?')} "
                f"resume {os.environ.get('HSCHED_RESUME', '0')} from step {state['step']}\n")
    print(f"starting at step {state['step']} on GPUs {os.environ.get('CUDA_VISIBLE_DEVICES', '')}", flush=True)

    def save() -> None:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    while state["step"] < opts.steps:
        if stop["checkpoint"]:
            stop["checkpoint"] = False
            save()
            print(f"checkpointed at step {state['step']}, going on", flush=True)
        if stop["requested"]:
            save()
            print(f"checkpointed at step {state['step']}", flush=True)
            return CHECKPOINT_EXIT
        time.sleep(opts.step_seconds)
        state["step"] += 1
        print(f"step {state['step']}", flush=True)
        report(state["step"], opts.steps)
        if state["step"] % 10 == 0:
            save()
    save()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
