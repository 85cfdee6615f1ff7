"""The simulator and the live controller make the same decisions on the same small trace.

Both call the scheduling core's `hsched` policy and `apply_plan`; the live side runs real processes on
simulated nodes (each job sleeps as long as its work takes on the GPU type it landed on).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hsched.sched.live import catalog_throughput, gpu_type_of
from hsched.sched.registry import make_policy
from hsched.sched.throughput import ThroughputModel
from hsched.sched.view import ServerView
from hsched.sim.engine import SimConfig, SimCosts, simulate
from hsched.sim.trace import Trace, TraceJob
from hsched.topo.models import DEFAULT_CATALOG
from tests.conftest import Hs

pytestmark = pytest.mark.slow  # the controller runs real processes on simulated nodes

FAST, SLOW = "NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-16GB"
FLEET = f"""
[[node]]
name = "fast"
[node.simulate]
model = "{FAST}"
count = 2
topology = "nvswitch"

[[node]]
name = "slow"
[node.simulate]
model = "{SLOW}"
count = 2
topology = "nvswitch"
"""
# (gpus, work in V100-seconds); every event at least a second from the next, so the live run (real
# processes, a poll every 0.1 s) sees the same order of completions as the simulated clock
JOBS = [(1, 10.0), (1, 10.0), (1, 10.0), (1, 20.0), (2, 10.0), (1, 5.0)]


def speed(model: str) -> float:
    m = DEFAULT_CATALOG.lookup(model)
    assert m is not None
    return m.train


def test_simulator_and_live_controller_agree(tmp_path: Path) -> None:
    fast_t, slow_t = gpu_type_of(FAST), gpu_type_of(SLOW)
    servers = (ServerView("fast", fast_t, ("f0", "f1"), "nvlink"), ServerView("slow", slow_t, ("s0", "s1"), "nvlink"))
    prior = {m.key.lower(): m.train for m in DEFAULT_CATALOG.models}
    assert catalog_throughput().prior_speed(fast_t) == prior[fast_t.lower()]
    model = ThroughputModel(prior=prior, reference_type=slow_t)
    trace = Trace(jobs=tuple(TraceJob(id=i + 1, job_type="", gpus=g, arrival_s=0.0, work=w, user="u")
                             for i, (g, w) in enumerate(JOBS)), throughput=model, source="replay")
    # a checkpoint cost this high makes the simulated policy keep running jobs where they are (a move never
    # pays for it), as the live controller does: it moves jobs only through QoS preemption
    sim = simulate(trace, servers, make_policy("hsched"), SimConfig(costs=SimCosts(checkpoint_s=1000.0)))
    sim_type = {r.id: r.last_gpu_type for r in sim.records}
    sim_start = {r.id: r.start_s for r in sim.records}
    assert len(sim_type) == len(JOBS) and all(r.restarts == 0 for r in sim.records)
    assert set(sim_type.values()) == {fast_t, slow_t}  # the trace exercises the heterogeneity choice

    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    h = Hs(tmp_path / "home", fleet=fleet)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "settings.toml").write_text('poll_interval_s = 0.1\npolicy = "hsched"\n')
    try:
        ids = []
        for g, w in JOBS:
            script = (f'case "$HSCHED_NODE" in fast) sleep {w / (speed(FAST) / speed(SLOW)):.3f};; '
                      f'slow) sleep {w:.3f};; esac')
            ids.append(h.run("submit", "--parsable", "--hold", "--gpus", str(g), "--name",
                             f"j{len(ids) + 1}", "--", "sh", "-c", script,
                             check=True).stdout.strip())
        h.run("release", *ids, check=True)
        assert h.run("wait", *ids, "--timeout", "120").returncode == 0
        live = [json.loads(h.run("show", i, "--json", check=True).stdout) for i in ids]
    finally:
        h.stop()
    by_node = {"fast": fast_t, "slow": slow_t}
    live_type = {int(j["id"]): by_node[j["placement"][0]["node"]] for j in live}
    assert live_type == {i + 1: sim_type[i + 1] for i in range(len(JOBS))}
    # the same jobs start in the first round, and the rest in the same order
    from datetime import datetime

    t = {int(j["id"]): datetime.fromisoformat(j["start_time"].replace("Z", "+00:00")).timestamp() for j in live}
    t0 = min(t.values())
    first_live = {i for i, v in t.items() if v - t0 < 0.8}
    first_sim = {i for i, v in sim_start.items() if v == 0.0}
    assert first_live == first_sim
    later = sorted(set(t) - first_live, key=lambda i: t[i])
    assert later == sorted(set(sim_start) - first_sim, key=lambda i: (sim_start[i], i))
