"""The dashboard's cost per snapshot with 64 GPUs and 500 jobs (goal: under 50 ms), and its idle CPU use.

Headless (Textual's run_test), no controller: frames are built like the feed builds them. Every frame changes
the utilization of all 64 devices (so every Fleet row and sparkline moves) and the state of 10% of the jobs.
Reported per frame: `parse` (dict to immutable frame, done in the feed thread), `apply` (the UI thread's
handler: every view updated in place) and `apply+paint` (until the screen has been repainted), in wall time and
(`apply_paint_cpu_ms_median`) in CPU time of this process, which a loaded machine does not inflate.
Run: python tests/bench/bench_dash.py [--frames N] [--idle SECONDS]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from typing import Any

from hsched.tui.app import DashApp
from hsched.tui.model import parse_snapshot

from hsched.serialize import iso

NODES, PER_NODE, JOBS = 8, 8, 500
NOW = time.time()


def snapshot(tick: int, rng: random.Random) -> dict[str, Any]:
    nodes = []
    running = []
    for n in range(NODES):
        name = f"node{n:02d}"
        devs = []
        for i in range(PER_NODE):
            job = 1 + n * PER_NODE + i if (n * PER_NODE + i) % 3 else None
            if job:
                running.append((job, name, f"GPU-{name}-{i}"))
            devs.append({"uuid": f"GPU-{name}-{i}", "index": i, "model": "NVIDIA H100 80GB HBM3",
                         "memory_total_mib": 81559, "memory_used_mib": rng.randrange(81559),
                         "utilization_gpu": float(rng.randrange(101)), "numa_node": i // 4,
                         "temperature_c": float(rng.randrange(30, 80)), "power_w": float(rng.randrange(60, 700)),
                         "job": job})
        links = [{"a": f"GPU-{name}-{i}", "b": f"GPU-{name}-{j}", "kind": "NV18"}
                 for i in range(PER_NODE) for j in range(i + 1, PER_NODE)]
        nodes.append({"name": name, "state": "UP", "executor": "ssh", "cpus": 128, "memory_total_mib": 1 << 20,
                      "numa_nodes": 2, "message": "", "devices": devs, "links": links})
    owner = {job: (node, uuid) for job, node, uuid in running}
    jobs = []
    for j in range(1, JOBS + 1):
        flip = (j + tick) % 10 == 0  # 10% of the jobs change each frame
        if j in owner:
            state, reason, start = ("PREEMPTING" if flip else "RUNNING"), "", NOW - 100 * j
        else:
            state, reason, start = "PENDING", ("Priority" if flip else "Resources"), None
        node, uuid = owner.get(j, (None, None))
        jobs.append({"id": j, "name": f"job-{j}", "state": state, "reason": reason, "qos": "normal",
                     "priority": j % 7, "user": f"user{j % 13}", "gpus": 1, "submit_time": iso(NOW - 9999),
                     "start_time": iso(start), "end_time": None,
                     "placement": [{"node": node, "devices": [uuid]}] if node else [],
                     "placement_explanation": None})
    return {"version": tick, "time": iso(NOW + tick), "jobs": jobs, "nodes": nodes}


async def measure(frames: int, idle_s: float, view: str) -> dict[str, Any]:
    rng = random.Random(1)
    snaps = [snapshot(t, rng) for t in range(frames + 1)]
    t0 = time.perf_counter()
    parsed = [parse_snapshot(s) for s in snaps]
    parse_ms = (time.perf_counter() - t0) * 1000 / len(snaps)
    app = DashApp(None, frame=parsed[0], view=view, user="user1")
    apply_ms: list[float] = []
    total_ms: list[float] = []
    cpu_ms: list[float] = []
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        for f in parsed[1:]:
            c0, t0 = time.process_time(), time.perf_counter()
            app.apply_frame(f)
            t1 = time.perf_counter()
            await pilot.pause()  # the repaint that the frame caused
            t2, c2 = time.perf_counter(), time.process_time()
            apply_ms.append((t1 - t0) * 1000)
            total_ms.append((t2 - t0) * 1000)
            cpu_ms.append((c2 - c0) * 1000)
        assert app.jobs.table.row_count == JOBS and app.fleet.table.row_count == NODES * PER_NODE
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(idle_s)  # no frames: the 1 s clock for elapsed times only
        idle = (time.process_time() - cpu0) / (time.perf_counter() - wall0) * 100
    return {"view": view, "gpus": NODES * PER_NODE, "jobs": JOBS, "frames": frames,
            "parse_ms": round(parse_ms, 2),
            "apply_ms_median": round(statistics.median(apply_ms), 2), "apply_ms_max": round(max(apply_ms), 2),
            "apply_paint_ms_median": round(statistics.median(total_ms), 2),
            "apply_paint_ms_p95": round(sorted(total_ms)[int(len(total_ms) * 0.95) - 1], 2),
            "apply_paint_cpu_ms_median": round(statistics.median(cpu_ms), 2),
            "idle_cpu_percent": round(idle, 2), "goal_ms": 50}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--idle", type=float, default=5.0, help="seconds of idle to measure CPU over")
    args = ap.parse_args()
    for view in ("jobs", "fleet"):
        print(json.dumps(asyncio.run(measure(args.frames, args.idle, view))))


if __name__ == "__main__":
    main()
