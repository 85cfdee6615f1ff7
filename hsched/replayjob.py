"""One job of `hsched replay`: it runs as long as its work takes on the GPU type it landed on, and reports.

    python -m hsched.replayjob --steps 12304123 --rates '{"v100": 4.2, "p100": 2.6, "k80": 1.1}' --speedup 2000

`--rates` are the job's steps per second on each GPU type (the trace's throughput table, for its GPU count);
its GPU type is found in HSCHED_GPU_MODEL, which hsched sets. It advances `rate x speedup` steps per second of
wall time, reports its progress every second (hsched.progress: the controller learns the kind's speed from
it), saves its step on SIGTERM/SIGUSR1 and exits 85 (hsched's "checkpointed, requeue me"), and resumes from
the saved step. No GPU is touched: a stand-in for a trainer whose speed depends on the GPU it runs on.

`--checkpoint-after S`: a first attempt that has run S wall seconds saves its step and exits 85 on its own, once,
as a trainer that checkpoints at the end of its first quantum. Why: the controller time-shares (and moves) only
jobs that proved they checkpoint (hsched.controller.moves); a job that is never stopped never proves it, and a
replay would then measure a controller that cannot time-share against a simulator that does. The run after it
resumes from the saved step, so nothing is lost, at the price of one restart, as a time-share switch costs.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys
import time

from hsched import progress
from hsched.progress import flush, report

CHECKPOINT_EXIT = 85
TICK_S = 0.05
"""The longest the loop waits between two looks at the clock (a stop wakes it at once)."""
REPORT_S = 0.05
"""How often it reports its progress (a trainer's default is once a second): at a replay's 29,000x a second is
eight hours of the trace, during which a restarted job's remaining time was unknown to the controller (one report
of the attempt gives no speed), while the simulator knows it from the first round."""


def rate_for(model: str, rates: dict[str, float]) -> float:
    """The rate of the type whose name is in the GPU model (the longest such name: "a100" before "a10")."""
    low = model.lower()
    for name in sorted(rates, key=len, reverse=True):
        if name.lower() in low:
            return rates[name]
    raise SystemExit(f"hsched.replayjob: no rate for GPU model {model!r} (rates for {', '.join(sorted(rates))})")


def _run(opts: argparse.Namespace, step: float, rate: float, first: bool, stop: dict[str, bool], wake: int) -> float:
    """Advance from `step` at `rate` steps a wall second, reporting, until the end, a stop, or the first attempt's
    own checkpoint (`stop` set); the step reached."""
    t0, s0 = time.monotonic(), step
    end = t0 + max(0.0, opts.steps - s0) / rate
    prove_at = t0 + opts.checkpoint_after if first and opts.checkpoint_after > 0 else None
    while not stop["now"]:
        now = time.monotonic()
        step = min(opts.steps, s0 + rate * (now - t0))
        report(step=step, total=opts.steps)
        if now >= end:
            break
        if prove_at is not None and now >= prove_at:
            stop["now"] = True  # the one checkpoint of its own (see the module's docstring)
            break
        until = end if prove_at is None else min(end, prove_at)
        select.select([wake], [], [], max(0.0, min(TICK_S, until - now)))
    # (the work done up to the stop itself is saved, not the step of the last look at the clock)
    return min(opts.steps, s0 + rate * (time.monotonic() - t0))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hsched.replayjob")
    ap.add_argument("--steps", type=float, required=True)
    ap.add_argument("--rates", required=True, help="JSON: GPU type -> steps per second")
    ap.add_argument("--speedup", type=float, default=1.0)
    ap.add_argument("--checkpoint-after", type=float, default=0.0,
                    help="wall seconds after which a first attempt checkpoints and exits 85 on its own (0: never)")
    opts = ap.parse_args(argv)
    rate = rate_for(os.environ.get("HSCHED_GPU_MODEL", ""), json.loads(opts.rates)) * opts.speedup
    ckpt = os.path.join(os.environ.get("HSCHED_CHECKPOINT_DIR") or ".", "replay-step")
    step = 0.0
    first = True  # no checkpoint yet: the first attempt
    try:
        with open(ckpt) as f:
            step = float(f.read().strip() or 0)
            first = False
    except (OSError, ValueError):
        pass
    stop = {"now": False}

    def on_signal(_signum: int, _frame: object) -> None:
        stop["now"] = True

    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(sig, on_signal)
    # a stop wakes the sleep at once: time.sleep resumes after a handler (PEP 475), and each 0.1 s the stop waited
    # was ~7,000 of the trace's seconds of a switch at a replay's 70,000x
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    old_fd = signal.set_wakeup_fd(wake_w)
    try:
        step = _run(opts, step, rate, first, stop, wake_r)
    finally:
        signal.set_wakeup_fd(old_fd)
        os.close(wake_r)
        os.close(wake_w)
    flush()
    if stop["now"] and step < opts.steps:
        with open(ckpt, "w") as f:
            f.write(str(step))
        return CHECKPOINT_EXIT
    return 0


if __name__ == "__main__":
    progress.EVERY_S = REPORT_S  # (its own process: a test calling main() keeps the default)
    sys.exit(main())
