"""Benchmark: predictions from the real round (issue 29, item 5). A script, not a test.

    nice python tests/bench/bench_forecast.py            # accuracy over ten busy queues, then the cost
    nice python tests/bench/bench_forecast.py --cost     # the cost alone

Accuracy: `tests/controller/test_forecast.py`'s `measure` (two nodes of 8 GPUs, 30 jobs of 1 to 8 GPUs submitted at
once after their kinds were learnt, a reservation held, a `--test-only` job submitted right after, two whole-node
jobs nothing predicts and one behind them), for ten seeds and run lengths exact, 5% and 10% off their kind's: the
error of each predicted start over its predicted wait, the share within 10%, the share on the predicted node, the
reservation's and the `--test-only` job's errors, and how many "not before" held.

Cost: `queue --start` over 500 and 2,000 waiting jobs on the same two nodes (CPU time of this process, every thread
counted): how many starts the forecast predicts before its step cap (forecast.MAX_STEPS) says "not before".
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hsched.testing import CannedNode, Lab
from tests.controller import test_forecast as tf


async def accuracy() -> None:
    for noise in (0.0, 0.05, 0.10):
        rows = []
        for seed in range(29, 39):
            with tempfile.TemporaryDirectory() as d:
                rows.append(await tf.measure(Path(d), noise=noise, seed=seed))
        med = [r["median_error"] for r in rows]
        print(f"lengths +-{noise:.0%}: {sum(r['jobs'] for r in rows)} predictions over {len(rows)} queues; "
              f"median error {statistics.median(med):.3f} (worst queue's {max(med):.3f}); "
              f"within 10%: {statistics.fmean(r['within_10pc'] for r in rows):.2f}; "
              f"same node: {statistics.fmean(r['same_node'] for r in rows):.2f}; "
              f"reservation's job: worst {max(r['head_error'] for r in rows):.3f}; "
              f"--test-only job: {sum(r['probe_error'] <= 0.10 for r in rows)}/{len(rows)} within 10% "
              f"(worst {max(r['probe_error'] for r in rows):.3f}); "
              f"not before held: {sum(r['not_before_held'] for r in rows)}/{sum(r['not_before'] for r in rows)}")


async def cost() -> None:
    nodes = (CannedNode("a", tf.A100, 8), CannedNode("b", tf.A100, 8))
    for count in (500, 2000):
        with tempfile.TemporaryDirectory() as d:
            async with Lab.open(Path(d), nodes=nodes) as lab:
                await tf._teach(lab)
                await tf._busy(lab, count, 1)
                await lab.round()
                cpu, wall = time.process_time(), time.perf_counter()
                got = await tf._starts(lab)
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                told = sum(1 for g in got.values() if g["start_time"])
                print(f"queue --start over {len(got)} waiting jobs on 16 GPUs: {cpu:.2f} s CPU ({wall:.2f} s wall), "
                      f"{told} starts predicted, {len(got) - told} 'not before'")


if __name__ == "__main__":
    if "--cost" not in sys.argv:
        asyncio.run(accuracy())
    asyncio.run(cost())
