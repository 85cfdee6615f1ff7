"""`hsched replay`: a trace driven through the live controller, against the simulator's figures for it.

The simulator measures the scheduling policy; the product must do what it measured. A replay starts a
controller of its own (a fresh HSCHED_HOME: nothing of the user's queue is touched) over simulated nodes that
mirror the simulated cluster, submits each trace job at its arrival time divided by the speedup, as a
stand-in job (hsched.replayjob) that runs its steps at the trace's rate for the GPU type it landed on times
the speedup and reports its progress, waits for all to end, and prints the live metrics next to the
simulator's for the same jobs, cluster and policy. JCTs are in the trace's seconds (wall seconds x speedup).

Time-sharing: with a quantum (`quantum_s`, in the trace's seconds), the controller's live quantum
(`move_min_run_s`) is that quantum over the speedup, and each stand-in job checkpoints on its own once at the end
of its first quantum (hsched.replayjob `--checkpoint-after`), which proves it checkpoints: from then on the
controller may time-share and move it, as the simulator does. Without one, no job proves it and the replay
matches `hsched sim --no-time-sharing`. Four things make the two sides count the same time (issue 33):

* A restart costs a stand-in its wall seconds whatever the speedup (its GPUs free 0.1-0.2 s after the stop's
  decision, then 0.15-0.25 s to its first step: ~0.35 s, 10,000 of the trace's seconds at 29,000x), which the
  simulator's default counts as free. So the simulator is told that cost (`--checkpoint-cost`, the restart's wall
  seconds times the speedup), and the quantum is the policy's under it on both sides (`live_quantum_s`).
* The policy keeps a (re)started job for at least its round: live, the simulator's 360 s unless settings
  `policy_round_s` says otherwise, which the replay sets to 360 s over the speedup (else a 0.08-s quantum became
  360 s of wall time, weeks of the trace, and newcomers waited for jobs to end).
* The learned speeds are seeded in the stand-ins' units, steps per wall second (`seed_knowledge`).
* The policy is given the simulator's remaining times (the controller's, not the replay's doing: a requeued job keeps
  its last attempt's figure, a run too short to measure its own speed counts at its kind's, a running job's is
  counted down since its last report; hsched.controller.learning), and a time-sharing stop holds the stopped job's
  GPUs for the job it makes room for, the simulator's stop and start being one instant (docs/scheduling.md).

Knowledge: `table` seeds the controller's learned speeds (hsched.learn.kinds) with the trace's throughput table,
what the simulator knows; `learn` starts from the accelerator prior alone and learns from progress, as a new
lab would.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from hsched.errors import HschedError
from hsched.model import Node

KNOWLEDGE = ("table", "learn")
POLL_S = 0.25
SIM_ROUND_S = 360.0
"""The simulator's round (`hsched sim --round-s`'s default), in the trace's seconds."""
RESTART_WALL_S = 0.35
"""What a stand-in job's checkpoint and restart costs in wall seconds on a loaded 2-core machine (measured: its GPUs
free 0.1-0.2 s after the stop's decision, then 0.15-0.25 s from its placing to its first step): at a replay's speedup,
trace seconds the simulator must charge too (`hsched replay --restart-cost`)."""


def live_quantum_s(policy: Any, restart_cost_s: float) -> float:
    """The least run before a time-share stop (trace seconds), as the policy counts it in the simulator with a
    checkpoint cost (hsched.sched.policies.hsched.Hsched.min_run_s: its quantum, at least its round and 12 x the
    cost): the live controller gets it over the speedup, as `move_min_run_s`, since it is told no scalar cost."""
    quantum = float(getattr(policy, "quantum_s", SIM_ROUND_S))
    return max(quantum, SIM_ROUND_S, float(getattr(policy, "quantum_per_checkpoint_s", 0.0)) * restart_cost_s)


@dataclass(frozen=True, slots=True)
class LiveJob:
    id: int
    trace_id: int
    node: str
    submit_s: float
    start_s: float
    end_s: float
    runs: int = 1
    """Its attempts: one, plus one per stop (its own checkpoint, a time-sharing stop, a move)."""


def fleet_toml(nodes: Sequence[Node]) -> str:
    """The simulated cluster as a fleet file: one local node with simulated devices per simulated server."""
    parts = []
    for n in nodes:
        nvlinked = all(lk.kind.upper().startswith("NV") for lk in n.links) if n.links else True
        parts.append("\n".join([
            "[[node]]", f'name = "{n.name}"', 'executor = "local"', "[node.simulate]",
            f'model = "{n.devices[0].model}"', f"count = {len(n.devices)}",
            f'topology = "{"nvswitch" if nvlinked else "pcie"}"', "",
        ]))
    return "\n".join(parts)


def seed_knowledge(db: Path, trace: Any, nodes: Sequence[Node], now: float, speedup: float = 1.0) -> int:
    """The trace's throughput table as learned speeds, for every job type and GPU count of the replayed jobs
    on every GPU type of the cluster (what the simulator knows); the number of entries.

    In steps per *wall* second (the table's rate times `speedup`), as the stand-ins run and the controller learns
    from their progress: seeded in the trace's units, a type a kind had run on was learnt `speedup` times faster
    than the others, so at 29,000x the policy took a K80 for 7,000 times a V100's speed, moved jobs down to K80s
    and left them there with V100s free (half the 60-job replay's makespan)."""
    from hsched.controller.store import Store
    from hsched.learn.kinds import PlacementClass
    from hsched.sched.live import gpu_type_of

    types = sorted({d.model for n in nodes for d in n.devices})
    store = Store(db)
    n = 0
    try:
        for jt, gpus in sorted({(j.job_type, j.gpus) for j in trace.jobs}):
            klass = PlacementClass.SINGLE if gpus == 1 else PlacementClass.NVLINK
            for t in types:
                rate = trace.throughput.rate(jt, gpus, t)
                if rate:
                    store.learn_kind_rate(jt, gpu_type_of(t), gpus, klass.value, float(rate) * speedup, now)
                    n += 1
    finally:
        store.close()
    return n


def job_spec(tj: Any, trace: Any, types: Sequence[str], speedup: float,
             checkpoint_after_s: float = 0.0) -> dict[str, Any]:
    rates = {t: r for t in types if (r := trace.throughput.rate(tj.job_type, tj.gpus, t))}
    extra = ["--checkpoint-after", repr(checkpoint_after_s)] if checkpoint_after_s > 0 else []
    return {"command": [sys.executable, "-m", "hsched.replayjob", "--steps", repr(float(tj.work)),
                        "--rates", json.dumps(rates), "--speedup", repr(speedup), *extra],
            "name": f"trace-{tj.id}", "kind": tj.job_type or f"trace-{tj.id}", "resources": {"gpus": tj.gpus}}


def _ts(text: str | None) -> float:
    assert text is not None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def run_live(home: Path, trace: Any, nodes: Sequence[Node], speedup: float, *, policy: str = "hsched",
             knowledge: str = "table", say: Callable[[str], None] = lambda _m: None,
             quantum_s: float | None = None, restart_cost_s: float = 0.0) -> list[LiveJob]:
    """Replay `trace` on a controller of its own in `home` (made here) and return each job's times; with
    `quantum_s` (trace seconds: the least run before a time-share stop, `live_quantum_s`), time-sharing as the
    module's docstring says, a checkpoint and restart taken to cost `restart_cost_s` (trace seconds) before the
    controller measured one."""
    from hsched.client import Client, controller_pid
    from hsched.paths import Home

    home.mkdir(parents=True, exist_ok=True)
    (home / "fleet.toml").write_text(fleet_toml(nodes))
    # (the stand-ins' progress is read with the monitoring stream: with time-sharing, often, since the policy ranks a
    # restarted job by the remaining time its reports tell)
    monitor = 0.1 if quantum_s else 0.5
    settings = f'poll_interval_s = 0.05\nmonitor_interval_s = {monitor}\npolicy = "{policy}"\n'
    live_quantum = quantum_s / speedup if quantum_s else 0.0
    if live_quantum > 0:
        # the quantum, the simulator's round (which the policy's least run is at least: 360 s of wall time would be
        # weeks of the trace) and a move's cost before one is measured, all in wall seconds (the settings must be > 0)
        settings += (f"moves = true\nmove_min_run_s = {live_quantum!r}\npolicy_round_s = {SIM_ROUND_S / speedup!r}\n"
                     f"move_cost_s = {max(restart_cost_s / speedup, 0.005)!r}\n")
    (home / "settings.toml").write_text(settings)
    h = Home(home)
    h.ensure()
    if knowledge == "table":
        say(f"seeded {seed_knowledge(h.db, trace, nodes, time.time(), speedup)} learned speeds from the trace's table")
    types = sorted({d.model for n in nodes for d in n.devices})
    out: list[LiveJob] = []
    with Client(h) as c:
        info = c.call("ping")
        while info.get("ready") is False:
            time.sleep(0.05)
            info = c.call("ping")
        try:
            t0 = time.monotonic()  # (the trace's pace: a step of the wall clock must not burst or stall it)
            ids: dict[int, int] = {}
            for tj in sorted(trace.jobs, key=lambda j: (j.arrival_s, j.id)):
                wait = t0 + tj.arrival_s / speedup - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                job = c.call("submit", spec=job_spec(tj, trace, types, speedup, live_quantum),
                             source=f"<replay {trace.source}>")
                ids[int(job["id"])] = tj.id
            say(f"submitted {len(ids)} jobs; waiting for them to end")
            while True:
                queue = c.call("queue")
                left = [j for j in queue if int(j["id"]) in ids]
                if not left:
                    break
                time.sleep(POLL_S)
            for jid, tid in sorted(ids.items()):
                s = c.call("show", id=jid)
                if s["state"] != "COMPLETED":
                    raise HschedError(f"replay: job {jid} (trace job {tid}) ended {s['state']} ({s['reason']}); "
                                      f"`hsched show {jid}` in {home} says why (--keep keeps it)")
                out.append(LiveJob(jid, tid, s["runs"][-1]["node"], _ts(s["submit_time"]),
                                   _ts(s["runs"][0]["start_time"]), _ts(s["end_time"]),
                                   len({r["attempt"] for r in s["runs"]})))
        finally:
            try:
                pid = c.call("stop").get("pid")
            except Exception:  # a controller that is gone already is what we wanted
                pid = None
    if pid is not None:
        # gone before the replay returns: the kept home is the stopped controller's (a loaded machine's controller
        # still held its lock when `replay` had printed its figures)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while controller_pid(h) is not None:
            if time.monotonic() > deadline:
                raise HschedError(f"replay: its controller (pid {pid}) did not stop within {STOP_TIMEOUT_S:g} s; "
                                  f"`HSCHED_HOME={home} hsched daemon stop` stops it")
            time.sleep(0.05)
    return out


STOP_TIMEOUT_S = 60.0
"""How long a replay waits for its controller to exit once asked to stop."""


def live_summary(jobs: Sequence[LiveJob], speedup: float) -> dict[str, Any]:
    """The live metrics in the trace's seconds: JCT from submit to end, makespan from the first submit."""
    if not jobs:
        return {"jobs": 0}
    jct = sorted((j.end_s - j.submit_s) * speedup for j in jobs)
    first = min(j.submit_s for j in jobs)
    return {"jobs": len(jobs), "avg_jct_s": statistics.fmean(jct), "p50_jct_s": jct[len(jct) // 2],
            "p95_jct_s": jct[min(len(jct) - 1, int(0.95 * len(jct)))],
            "makespan_s": (max(j.end_s for j in jobs) - first) * speedup,
            "avg_wait_s": statistics.fmean((j.start_s - j.submit_s) * speedup for j in jobs),
            # (stops of every kind: a stand-in's own first checkpoint, time-sharing stops and moves)
            "restarts": sum(j.runs - 1 for j in jobs)}
