"""The `hsched` policy on gangs (issue 18 item 6): GPU-seconds least attained service with a quantum.

The full-trace figures (0e4a51 at checkpoint costs 0, 60 and 600 s against las-hetero) are
`tests/bench/bench_sim.py --gang`; these are the mechanisms, by hand and on a slice of the same trace.
"""

from __future__ import annotations

import pytest

from hsched.model import Placement
from hsched.sched import JobPhase, JobView, build_input, make_policy, schedule_round
from hsched.sim.cluster import parse_cluster
from hsched.sim.engine import SimConfig, SimCosts, simulate
from hsched.sim.trace import Trace, load_trace
from tests.sim.test_loaders import GAVEL

JT = "ResNet-18 (batch size 64)"


def _model():
    return load_trace(GAVEL / "ed69ec.trace").throughput


def _running(jid: int, started: float, service: float, gpus: int = 1) -> JobView:
    devs = tuple(f"v100-0/{i}" for i in range(gpus))
    return JobView(jid, JT, gpus, 0.0, JobPhase.RUNNING, gpu_type="v100", placement=(Placement("v100-0", devs),),
                   run_start_s=started, run_s=service, service_s=service)


def test_a_running_job_keeps_its_gpu_for_the_quantum_then_yields_to_a_less_served_one():
    servers = parse_cluster("v100:1", 1)
    pol = make_policy("hsched")
    old = _running(1, started=0.0, service=3600.0)
    new = JobView(2, JT, 1, 100.0)
    early = build_input(1000.0, [old, new], servers, _model())
    assert pol.min_run_s(early) == 5400.0
    d = schedule_round(pol, early, servers)
    assert not d.preempt and not d.starts  # within its quantum: the newcomer waits
    late = build_input(5400.0, [_running(1, started=0.0, service=5400.0), new], servers, _model())
    d = schedule_round(pol, late, servers)
    assert d.preempt == (1,) and [s.job_id for s in d.starts] == [2]


def test_the_quantum_grows_with_the_checkpoint_cost():
    servers = parse_cluster("v100:1", 1)
    pol = make_policy("hsched")
    assert pol.min_run_s(build_input(0.0, [], servers, _model(), checkpoint_cost_s=60.0)) == 5400.0
    assert pol.min_run_s(build_input(0.0, [], servers, _model(), checkpoint_cost_s=600.0)) == 7200.0


def test_attained_service_counts_gpus():
    """A 4-GPU gang that ran an hour has had 4 GPU-hours: a 1-GPU job that ran two hours is less served and
    goes first; las-hetero, counting seconds, puts the gang first."""
    servers = parse_cluster("v100:4", 4)
    gang = JobView(1, JT, 4, 0.0, service_s=3600.0, run_s=3600.0)
    single = JobView(2, JT, 1, 1.0, service_s=7200.0, run_s=7200.0)
    inp = build_input(10_000.0, [gang, single], servers, _model())
    assert [j.id for j in make_policy("hsched").order(inp)] == [2, 1]
    assert [j.id for j in make_policy("las-hetero").order(inp)] == [1, 2]


def _gang_slice() -> Trace:
    tr = load_trace(GAVEL / "0e4a51.trace")
    return Trace(tr.jobs[:120], tr.throughput, tr.source)


def test_on_the_gang_trace_hsched_stops_jobs_far_less_often_than_las_hetero():
    tr = _gang_slice()
    servers = parse_cluster("v100:4,p100:4,k80:4", 4)
    cfg = SimConfig(costs=SimCosts(checkpoint_s=60.0), max_time_s=2_000_000.0)
    h = simulate(tr, servers, make_policy("hsched"), cfg).summary
    lh = simulate(tr, servers, make_policy("las-hetero"), cfg).summary
    assert h["preemptions"] * 10 <= lh["preemptions"]
    assert h["gpu_hours_lost"] * 5 <= lh["gpu_hours_lost"]


def test_jobs_the_table_lacks_run_on_the_prior_and_are_counted():
    tr = _gang_slice()
    model = tr.throughput
    lacking = [j for j in tr.jobs if not model.measured(j.job_type, j.gpus)]
    assert lacking  # A3C, CycleGAN, recommendation models at 2, 4, 8 GPUs
    servers = parse_cluster("v100:8,p100:8,k80:8", 4)
    s = simulate(tr, servers, make_policy("hsched"), SimConfig(max_time_s=500_000.0)).summary
    assert s["unschedulable_jobs"] == 0
    assert s["prior_rate_jobs"] == len(lacking)


@pytest.mark.parametrize("policy", ["hsched", "las-hetero"])
def test_gang_slice_is_deterministic(policy):
    tr = _gang_slice()
    servers = parse_cluster("v100:4,p100:4,k80:4", 4)
    cfg = SimConfig(max_time_s=300_000.0)
    a = simulate(tr, servers, make_policy(policy), cfg)
    b = simulate(tr, servers, make_policy(policy), cfg)
    assert a.records == b.records and a.busy == b.busy
