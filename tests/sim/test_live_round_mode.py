"""The simulator's live round mode runs the live pipeline itself (issue 28): a QoS cap, a node constraint and a shared
GPU act in `simulate(..., round_mode="live")` and `hsched sim --round-mode live` exactly as in the live round.

The live side is run twice here, independently of the simulator's code: by hand (its own nodes, jobs, FleetView and
clock, calling `hsched.sched.pipeline.schedule` at every arrival and completion) and as the real controller in-process
on a fake clock (hsched.testing.Lab: its store, rounds and launches over fake nodes of V100s)."""

from __future__ import annotations

import asyncio
import csv
import heapq
import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hsched.cli import app
from hsched.config import load_settings
from hsched.controller import commands
from hsched.model import Job, JobSpec, JobState, Resources
from hsched.sched.fleet import FleetView, Launch, Running, Wait
from hsched.sched.limits import QosLimits
from hsched.sched.pipeline import schedule
from hsched.sched.preempt import PreemptRule
from hsched.sched.registry import make_policy
from hsched.sim.cluster import cluster_nodes, parse_cluster
from hsched.sim.engine import SimConfig, SimCosts, Simulator
from hsched.sim.live import LiveInput, parse_labels
from hsched.sim.trace import Trace, TraceJob, load_trace
from hsched.spec.constraints import node_labels
from hsched.testing import CannedNode, Lab

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "live"
TRACE = HERE / "caps-constraint-shared.csv"
SETTINGS = HERE / "settings.toml"
COLUMNS = "id=id,submit=submit,duration=duration,gpus=gpus,user=user"
CLUSTER = "v100:12"  # three servers of 4: v100-0, v100-1, v100-2
LABELS = "v100-1=ib"
V100_MIB = 16384  # the accelerator table's V100: what shared GPUs' memory is matched against

Start = tuple[float, str, tuple[tuple[str, tuple[str, ...]], ...]]
"""(when, job name, its placements as (node, devices)); devices named as `--cluster` names them (NODE/INDEX)."""


def _trace() -> Trace:
    return load_trace(TRACE, columns=COLUMNS)


def _simulated() -> list[Start]:
    tr = _trace()
    servers = parse_cluster(CLUSTER, 4)
    conf = load_settings(SETTINGS)
    live = LiveInput(parse_labels(LABELS, [s.name for s in servers]), QosLimits.from_qos(conf.qos), conf.move_min_run_s)
    sim = Simulator(tr, servers, make_policy("hsched"), SimConfig(round_mode="live", live=live))
    result = sim.run()
    assert result.summary["jobs"] == len(tr.jobs)
    assert sim.live is not None
    return [(t, tr.jobs[i].name, tuple((p.node, p.devices) for p in ps)) for t, i, ps in sim.live.log]


def _live_by_hand() -> list[Start]:
    """The live round alone, on a clock of its own: what the controller would start, when and where."""
    tr = _trace()
    conf = load_settings(SETTINGS)
    nodes = tuple(replace(n, devices=tuple(replace(d, memory_total_mib=V100_MIB) for d in n.devices))
                  for n in cluster_nodes(CLUSTER, 4))
    labels = {n.name: node_labels(n.name, ["ib"] if n.name == "v100-1" else []) for n in nodes}
    limits = QosLimits.from_qos(conf.qos)
    rule = PreemptRule.from_qos(conf.qos)

    def job(i: int, placement=()) -> Job:
        tj = tr.jobs[i]
        res = Resources(gpus=tj.gpus, gpu_memory_mib=tj.gpu_memory_mib, constraint=tj.constraint, shared=tj.shared)
        return Job(tj.id, JobSpec(("train",), name=tj.name, resources=res, qos=tj.qos), tj.user,
                   JobState.RUNNING if placement else JobState.PENDING, "", tj.arrival_s, placement=placement)

    arrivals = sorted((tj.arrival_s, tj.id) for tj in tr.jobs)
    waiting: list[int] = []
    running: dict[int, tuple[Running, float]] = {}
    ends: list[tuple[float, int]] = []
    out: list[Start] = []
    while arrivals or waiting or running:
        now = min(arrivals[0][0] if arrivals else float("inf"), ends[0][0] if ends else float("inf"))
        while ends and ends[0][0] <= now:
            del running[heapq.heappop(ends)[1]]
        while arrivals and arrivals[0][0] <= now:
            waiting.append(arrivals.pop(0)[1])
        busy = {u for r, _ in running.values() for u in r.devices}
        shared_use: dict[str, int] = {}
        for r, _ in running.values():
            if r.job.spec.resources.shared:
                for u in r.devices:
                    shared_use[u] = shared_use.get(u, 0) + (r.job.spec.resources.gpu_memory_mib or 0)
        fleet = FleetView(nodes=nodes, busy=frozenset(busy), cpus_used={},
                          running=tuple(r for r, _ in running.values()),
                          rule=rule, policy="hsched", labels=labels, limits=limits, throughput=tr.throughput,
                          ends={i: end for i, (_, end) in running.items()}, shared_use=shared_use,
                          movable={i: 0.0 for i, (r, _) in running.items() if not r.job.spec.resources.shared},
                          move_min_run_s=conf.move_min_run_s)
        for d in schedule(fleet, [job(i) for i in waiting], now):
            assert isinstance(d, Launch | Wait), d  # nothing here preempts or moves
            if isinstance(d, Launch):
                tj = tr.jobs[d.job_id]
                rate = tr.throughput.rate(tj.job_type, tj.gpus, "v100", spans=len(d.placements) > 1)
                assert rate
                end = now + tj.work / rate
                running[d.job_id] = (Running(job(d.job_id, d.placements), now), end)
                heapq.heappush(ends, (end, d.job_id))
                waiting.remove(d.job_id)
                out.append((now, tj.name, tuple((p.node, p.devices) for p in d.placements)))
        if not running and not arrivals:
            break
    return out


def _live_controller(root: Path) -> list[Start]:
    """The real controller in-process (hsched.testing.Lab): three nodes of four simulated V100s, v100-1 labelled ib,
    the settings' caps; each job is submitted at its arrival and its run exits after its duration (a V100 is the
    trace's reference type)."""
    tr = _trace()
    settings = replace(load_settings(SETTINGS), policy="hsched")

    async def drive() -> list[Start]:
        nodes = [CannedNode(f"v100-{i}", "Tesla V100-SXM2-16GB", 4) for i in range(3)]
        async with Lab.open(root, nodes=nodes, settings=settings) as lab:
            rt = lab.ctl.nodes["v100-1"]
            rt.config = replace(rt.config, labels=("ib",))  # the fleet file's `labels = ["ib"]`
            index = {d.uuid: f"{name}/{d.index}" for name, r in lab.ctl.nodes.items() for d in r.node.devices}
            t0 = lab.clock.time()
            arrivals = sorted((tj.arrival_s, tj.id) for tj in tr.jobs)
            submitted: dict[int, TraceJob] = {}
            ends: list[tuple[float, int]] = []
            out: list[Start] = []
            while arrivals or ends:
                now = min(arrivals[0][0] if arrivals else float("inf"), ends[0][0] if ends else float("inf"))
                lab.clock.advance(t0 + now - lab.clock.time())
                while ends and ends[0][0] <= now:
                    await lab.finish(heapq.heappop(ends)[1])
                while arrivals and arrivals[0][0] <= now:
                    tj = tr.jobs[arrivals.pop(0)[1]]
                    res = Resources(gpus=tj.gpus, gpu_memory_mib=tj.gpu_memory_mib, constraint=tj.constraint,
                                    shared=tj.shared)
                    job = await commands.submit(lab.ctl, JobSpec(("train",), name=tj.name, resources=res, qos=tj.qos),
                                                tj.user, None)
                    submitted[job.id] = tj
                await lab.round()  # the run that exited is reaped, the jobs that came are queued; a round decides
                await lab.round()
                for jid, tj in submitted.items():
                    job = await lab.job(jid)
                    if job.state in (JobState.LAUNCHING, JobState.RUNNING) and tj.name not in {n for _, n, _ in out}:
                        out.append((now, tj.name, tuple((p.node, tuple(index[u] for u in p.devices))
                                                        for p in job.placement)))
                        heapq.heappush(ends, (now + tj.work, jid))
            return out

    return asyncio.run(drive())


def _in_order(starts: list[Start]) -> list[Start]:
    return sorted(starts, key=lambda s: (s[0], s[1]))


def test_cap_constraint_and_shared_gpu_act_as_in_the_live_round(tmp_path):
    simulated = _simulated()
    assert simulated == _live_by_hand()
    assert _in_order(simulated) == _in_order(_live_controller(tmp_path))
    at = {name: (t, where) for t, name, where in simulated}
    # the cap: class "low" holds 2 GPUs at most, so the third low job starts when the first two end, not at 0
    assert at["cap0"][0] == at["cap1"][0] == 0.0
    assert at["cap2"][0] == 1000.0
    # the constraint: only v100-1 is labelled ib; ib1 waits for it (ib0 holds half of it) although v100-2 frees
    assert {at["ib0"][1][0][0], at["ib1"][1][0][0]} == {"v100-1"}
    assert at["ib1"][0] == 510.0
    # the shared GPU: two 4000 MiB jobs on one device; 9000 MiB more would not fit its 16384, so another device
    assert at["share0"][1] == at["share1"][1]
    assert at["share2"][1] != at["share0"][1]


def test_default_round_mode_knows_none_of_them():
    """The default rounds have no caps, labels or shared GPUs: the cap does not hold there (the reason for the mode)."""
    tr = _trace()
    sim = Simulator(tr, parse_cluster(CLUSTER, 4), make_policy("hsched"), SimConfig())
    starts = {r.name: r.start_s for r in sim.run().records}
    assert starts["cap2"] == 0.0


def test_cli_round_mode_live(tmp_path):
    out = tmp_path / "jobs.csv"
    args = ["sim", "--trace", str(TRACE), "--columns", COLUMNS, "--cluster", CLUSTER, "--policy", "hsched",
            "--round-mode", "live", "--labels", LABELS, "--settings", str(SETTINGS), "--json", "--jobs-csv", str(out)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["round_mode"] == "live"
    with out.open() as f:
        rows = {row["name"]: row for row in csv.DictReader(f)}
    expected = {name: t for t, name, _ in _live_by_hand()}
    assert {n: float(row["start_s"]) for n, row in rows.items()} == expected


@pytest.mark.parametrize(("extra", "said"), [
    (["--round-mode", "live", "--labels", "a100=fast"], "--labels"),
    (["--round-mode", "live", "--labels", "v100"], "--labels"),
    (["--labels", "v100=fast"], "--round-mode live"),
    (["--round-mode", "live", "--policy", "srtf-oracle"], "--round-mode live"),
])
def test_cli_live_bad_input_exits_2(extra, said):
    r = CliRunner().invoke(app, ["sim", "--trace", str(TRACE), "--columns", COLUMNS, "--cluster", CLUSTER, *extra])
    assert r.exit_code == 2, r.output
    assert said in r.output
    assert "Traceback" not in r.output


def test_trace_live_columns_refused_with_one_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("submit,duration,gpus,shared\n0,10,1,maybe\n")
    r = CliRunner().invoke(app, ["sim", "--trace", str(bad), "--columns", "submit=submit,duration=duration,gpus=gpus",
                                 "--cluster", CLUSTER, "--round-mode", "live"])
    assert r.exit_code == 2, r.output
    assert f"{bad}:2: shared" in r.output


def test_a_shared_gpu_counts_once_in_utilization(tmp_path):
    """Two shared jobs on the one GPU run side by side: the GPU is busy once (utilization 1, not 2), and both end
    at 600 s (sharing does not slow them in the simulator)."""
    trace = tmp_path / "shared.csv"
    trace.write_text("submit,duration,gpus,user,shared,gpu_memory_mib\n0,600,1,alice,yes,4000\n0,600,1,alice,yes,4000\n")
    tr = load_trace(trace, columns="submit=submit,duration=duration,gpus=gpus,user=user")
    sim = Simulator(tr, parse_cluster("v100:1"), make_policy("hsched"), SimConfig(round_mode="live"))
    result = sim.run()
    assert [(r.start_s, r.end_s) for r in result.records] == [(0.0, 600.0), (0.0, 600.0)]
    assert result.summary["utilization"] == pytest.approx(1.0)


def test_qos_preemption_checkpoints_and_requeues(tmp_path):
    """The live round's QoS preemption (the default table: prod preempts scavenger) stops the victim at once; the job
    that asked starts on its devices in the round that follows at the same instant; the victim requeues and resumes
    after paying the checkpoint cost (30 s): 100 s + 30 s + the 900 s it had left."""
    trace = tmp_path / "preempt.csv"
    trace.write_text("id,submit,duration,gpus,user,qos\nlow,0,1000,2,alice,scavenger\nhigh,100,200,1,bob,prod\n")
    tr = load_trace(trace, columns="id=id,submit=submit,duration=duration,gpus=gpus,user=user")
    sim = Simulator(tr, parse_cluster("v100:2"), make_policy("hsched"),
                    SimConfig(round_mode="live", costs=SimCosts(checkpoint_s=30.0)))
    result = sim.run()
    got = {r.name: (r.start_s, r.end_s, r.restarts) for r in result.records}
    assert got == {"low": (0.0, 1230.0, 1), "high": (100.0, 300.0, 0)}
    assert result.summary["preemptions"] == 1
