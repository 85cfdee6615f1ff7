"""The parts of `hsched replay` that need no controller: the fleet it builds, the stand-in jobs' specs and
rates, and the live metrics in the trace's seconds."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest

from hsched.replay import LiveJob, fleet_toml, job_spec, live_summary
from hsched.replayjob import rate_for
from hsched.sched.throughput import ThroughputModel
from hsched.sim.cluster import cluster_nodes
from hsched.sim.trace import Trace, TraceJob


def test_the_fleet_mirrors_the_simulated_cluster() -> None:
    text = fleet_toml(cluster_nodes("v100:3,k80:2@pcie", 2))
    assert text.count("[[node]]") == 3
    assert 'name = "v100-1"' in text and 'model = "v100"' in text and "count = 1" in text
    assert 'topology = "pcie"' in text and 'topology = "nvswitch"' in text


def test_a_stand_in_job_runs_at_the_traces_rate_for_its_type() -> None:
    model = ThroughputModel({"v100": {("A", 1): 4.0}, "k80": {("A", 1): 1.0}})
    tr = Trace(jobs=(TraceJob(id=7, job_type="A", gpus=1, arrival_s=0.0, work=100.0, user="u"),), throughput=model,
               source="t")
    spec = job_spec(tr.jobs[0], tr, ["v100", "k80"], 50.0)
    assert spec["kind"] == "A" and spec["resources"] == {"gpus": 1} and spec["name"] == "trace-7"
    cmd = spec["command"]
    assert cmd[1:3] == ["-m", "hsched.replayjob"]
    assert json.loads(cmd[cmd.index("--rates") + 1]) == {"v100": 4.0, "k80": 1.0}
    assert float(cmd[cmd.index("--speedup") + 1]) == 50.0
    assert rate_for("v100", {"v100": 4.0, "k80": 1.0}) == 4.0
    assert rate_for("NVIDIA A10", {"a10": 2.0, "a100": 5.0}) == 2.0
    assert rate_for("NVIDIA A100-SXM4", {"a10": 2.0, "a100": 5.0}) == 5.0  # the longest name that fits
    with pytest.raises(SystemExit):
        rate_for("H100", {"v100": 1.0})


def test_live_metrics_are_in_the_traces_seconds() -> None:
    jobs = [LiveJob(1, 1, "n", 100.0, 100.5, 102.0), LiveJob(2, 2, "n", 101.0, 102.0, 105.0)]
    s = live_summary(jobs, 10.0)
    assert s["avg_jct_s"] == pytest.approx((20 + 40) / 2) and s["makespan_s"] == pytest.approx(50.0)
    assert s["avg_wait_s"] == pytest.approx((5 + 10) / 2)


def test_a_replayed_job_checkpoints_once_on_its_own_then_resumes(tmp_path, monkeypatch) -> None:
    """Issue 33 item 5: `--checkpoint-after` makes a first attempt save its step and exit 85 (which proves to the
    controller that it checkpoints); the next attempt resumes from the saved step and never does it again."""
    import signal

    from hsched import replayjob

    monkeypatch.delenv("HSCHED_PROGRESS", raising=False)
    monkeypatch.setenv("HSCHED_GPU_MODEL", "Tesla V100-SXM2-16GB")
    monkeypatch.setenv("HSCHED_CHECKPOINT_DIR", str(tmp_path))
    args = ["--steps", "1e12", "--rates", '{"v100": 1000.0}', "--checkpoint-after", "0.05"]
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    try:  # main() installs its own signal handlers: pytest's come back after
        assert replayjob.main(args) == replayjob.CHECKPOINT_EXIT  # 1e12 steps at 1,000/s: only the checkpoint ends it
        saved = float((tmp_path / "replay-step").read_text())
        assert 0 < saved < 1e12
        # the second attempt: fast enough to finish at once, and no second checkpoint of its own
        assert replayjob.main([*args, "--speedup", "1e12"]) == 0
    finally:
        for sig, h in handlers.items():
            signal.signal(sig, h)


def test_a_stop_wakes_a_replayed_job_at_once(tmp_path, monkeypatch) -> None:
    """Issue 33 item 5: a stand-in job checkpoints as soon as it is signalled, not at its next look at the clock.
    At a replay's 70,000x each 0.1 s a stop waited was ~7,000 of the trace's seconds added to every time-share
    switch. The look is made 30 s apart here: a stop that waited for it would take 30 s."""
    import signal
    import threading
    import time

    from hsched import replayjob

    monkeypatch.delenv("HSCHED_PROGRESS", raising=False)
    monkeypatch.setenv("HSCHED_GPU_MODEL", "Tesla V100-SXM2-16GB")
    monkeypatch.setenv("HSCHED_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.setattr(replayjob, "TICK_S", 30.0)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1))
    try:
        t0 = time.monotonic()
        timer.start()
        assert replayjob.main(["--steps", "1e12", "--rates", '{"v100": 1000.0}']) == replayjob.CHECKPOINT_EXIT
        assert time.monotonic() - t0 < 15.0
        assert 0 < float((tmp_path / "replay-step").read_text()) < 1e12
    finally:
        timer.cancel()
        for sig, h in handlers.items():
            signal.signal(sig, h)


def test_a_time_compressed_round_keeps_a_job_only_its_quantum() -> None:
    """Issue 33 item 5: the policy keeps a (re)started job for max(quantum, round): live, the round was always the
    simulator's 360 s, so a replay's quantum (1.5 h over 70,000x: 0.08 s of wall time) became 360 s of wall time
    (weeks of its trace) and newcomers waited for jobs to end. With `policy_round_s` (the replay's: 360 s over its
    speedup) a job that has run its quantum is time-shared for a newcomer, as in the simulator."""
    from hsched.config import SimulatedDevices
    from hsched.model import Job, JobSpec, JobState, Node, NodeState, Placement, Resources
    from hsched.sched.live import FleetView, Running, schedule
    from hsched.sched.view import Preempt
    from hsched.simulated import simulated_devices

    devices, links = simulated_devices("n", SimulatedDevices(model="NVIDIA H100 80GB HBM3", count=1))
    node = Node("n", "fake", NodeState.UP, cpus=16, memory_total_mib=64 << 10, devices=devices, links=links)
    running = Job(1, JobSpec(command=("x",), resources=Resources(gpus=1), kind="j"), "alice", JobState.RUNNING, "",
                  0.0, start_time=0.0, placement=(Placement("n", (devices[0].uuid,)),))
    newcomer = Job(2, JobSpec(command=("y",), resources=Resources(gpus=1), kind="j"), "alice", JobState.PENDING, "",
                   9.0)
    fleet = FleetView((node,), frozenset({devices[0].uuid}), {}, running=(Running(running, 0.0),), policy="hsched",
                      movable={1: 0.01}, move_min_run_s=1.0)

    def stopped(view: FleetView) -> list[tuple[int, tuple[int, ...]]]:
        return [(d.job_id, d.victims) for d in schedule(view, [newcomer], 10.0) if isinstance(d, Preempt)]

    assert stopped(fleet) == []  # 10 s run: within the 360-s round, kept
    assert stopped(replace(fleet, policy_round_s=0.005)) == [(2, (1,))]  # past its 1-s quantum: the newcomer's turn


def test_the_learned_speeds_are_seeded_in_the_stand_ins_wall_units(tmp_path) -> None:
    """Issue 33 item 5: the controller learns a kind's speed from the stand-ins' progress, in steps per wall second
    (the table's rate times the speedup); seeded in the trace's units, a type a kind had run on looked `speedup`
    times faster than the others, so the policy moved jobs down to K80s and left them there."""
    from hsched.controller.store import Store
    from hsched.replay import seed_knowledge

    model = ThroughputModel({"v100": {("A", 1): 4.0}, "k80": {("A", 1): 1.0}})
    tr = Trace(jobs=(TraceJob(id=7, job_type="A", gpus=1, arrival_s=0.0, work=100.0, user="u"),), throughput=model,
               source="t")
    db = tmp_path / "hsched.db"
    assert seed_knowledge(db, tr, cluster_nodes("v100:1,k80:1", 1), 0.0, 1000.0) == 2
    store = Store(db)
    try:
        rates = {k.gpu_type: k.steps_per_s for k in store.kind_rates() if k.kind == "A"}
    finally:
        store.close()
    assert rates == {"V100": 4000.0, "K80": 1000.0}
