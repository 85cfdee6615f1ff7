"""Each policy on tiny hand-made traces whose answers are worked out in the comments."""

from __future__ import annotations

import pytest

from hsched.sched import build_input, make_policy, schedule_round
from hsched.sched.view import JobPhase, JobView
from hsched.sim.cluster import parse_cluster
from hsched.sim.engine import SimConfig, SimCosts, simulate
from tests.sched.handmade import model, trace


def ends(result) -> dict[int, float]:
    return {r.id: r.end_s for r in result.records}


def run(policy, tr, cluster: str, gpn: int = 4, **cfg):
    pol = make_policy(policy) if isinstance(policy, str) else policy
    return simulate(tr, parse_cluster(cluster, gpn), pol, SimConfig(**cfg))


def test_fifo_runs_in_arrival_order_without_preemption():
    # one fast GPU at 2/s: job0 (10 work) runs 0..5; job1 (2 work, arrives at 1) waits, runs 5..6
    r = run("fifo", trace(("A", 1, 0.0, 10.0), ("A", 1, 1.0, 2.0)), "fast:1")
    assert ends(r) == pytest.approx({0: 5.0, 1: 6.0})
    assert r.summary["avg_jct_s"] == pytest.approx((5.0 + 5.0) / 2)
    assert r.summary["preemptions"] == 0


def test_srtf_oracle_preempts_for_the_shorter_job():
    # at t=1 job0 has 4 s left, job1 needs 1 s: job1 runs 1..2, job0 resumes 2..6
    r = run("srtf-oracle", trace(("A", 1, 0.0, 10.0), ("A", 1, 1.0, 2.0)), "fast:1")
    assert ends(r) == pytest.approx({0: 6.0, 1: 2.0})
    assert r.summary["preemptions"] == 1


def test_las_demotes_the_job_that_has_run_longest():
    pol = make_policy("las")
    pol.first_threshold_gpu_s = 1.0  # job0 leaves the top queue after 1 GPU-second
    # at t=1 job0 (1 GPU-s) is in queue 1, the newcomer in queue 0: it preempts, runs 1..2; job0 ends at 6
    r = run(pol, trace(("A", 1, 0.0, 10.0), ("A", 1, 1.0, 2.0)), "fast:1", round_s=1.0)
    assert ends(r) == pytest.approx({0: 6.0, 1: 2.0})


def test_las_starvation_guard_promotes_a_waiting_job():
    pol = make_policy("las")
    pol.first_threshold_gpu_s = 1.0
    pol.starve_factor = 2.0
    # job0 runs 0..1, then the newcomer (arrives at 1) and job0 compete; without the guard job0 would
    # wait for all of job1 (100 work = 50 s); with it, job0 comes back once it has waited 2x its 1 s run.
    r = run(pol, trace(("A", 1, 0.0, 4.0), ("A", 1, 1.0, 100.0)), "fast:1", round_s=1.0)
    assert ends(r)[0] < 10.0


def test_fifo_hetero_takes_the_fastest_free_type():
    # job0 gets fast (2/s: 0..2); job1 arrives at 0.5, fast is busy: slow (1/s): 0.5..4.5
    r = run("fifo-hetero", trace(("A", 1, 0.0, 4.0), ("A", 1, 0.5, 4.0)), "fast:1,slow:1")
    assert ends(r) == pytest.approx({0: 2.0, 1: 4.5})


def _views(*specs: tuple[int, str]) -> tuple[JobView, ...]:
    return tuple(JobView(i, jt, 1, 0.0) for i, jt in specs)


@pytest.mark.parametrize("policy", ["las-hetero", "ftf", "hsched"])
def test_hetero_policies_give_the_fast_gpu_to_the_job_that_gains_most(policy):
    # A keeps 1/2 of its speed on slow, B only 1/4: B must get fast, A slow (total normalised 1.5, not 1.25)
    servers = parse_cluster("fast:1,slow:1", 4)
    inp = build_input(0.0, _views((0, "A"), (1, "B")), servers, model())
    d = schedule_round(make_policy(policy), inp, servers)
    assert {s.job_id: s.gpu_type for s in d.starts} == {0: "slow", 1: "fast"}


def test_hsched_moves_to_a_faster_gpu_when_it_frees():
    # Two equal jobs: among equals the first in priority order (job0) takes the slow type.
    # job1: fast 0..2. job0: slow from 0 (1/s); at 2 it has 2 work left, moves to fast (2/s): ends at 3.
    # (1 s rounds: the last round is more than a quantum old when job1 ends, so the move is made at once)
    tr = trace(("A", 1, 0.0, 4.0), ("A", 1, 0.0, 4.0))
    r = run("hsched", tr, "fast:1,slow:1", round_s=1.0)
    assert ends(r) == pytest.approx({0: 3.0, 1: 2.0})
    assert r.summary["migrations"] == 1
    # fifo-hetero never moves a job: job0 takes fast (0..2), job1 stays on slow and ends at 4
    assert ends(run("fifo-hetero", tr, "fast:1,slow:1")) == pytest.approx({0: 2.0, 1: 4.0})


def test_a_move_nobody_waits_for_comes_with_the_next_round():
    # Nobody waits when job1 ends at 2, and the last round (at 0) is less than a 360 s quantum old: the move
    # of job0 to the freed fast GPU waits for the quantum, at 360 (job0 has 640 work left then, at 2/s).
    tr = trace(("A", 1, 0.0, 1000.0), ("A", 1, 0.0, 4.0))
    r = run("hsched", tr, "fast:1,slow:1")
    assert ends(r) == pytest.approx({0: 680.0, 1: 2.0})
    assert r.summary["migrations"] == 1
    assert r.summary["rounds"] == 2
    # With nobody waiting, an arrival is started at once on free GPUs by a start-only round, and the pending
    # move still waits for the quantum. Two fast GPUs free up at 2; job3 arrives at 100 and starts on one
    # (ends at 125); job0 moves at 360 with 640 work left, at 2/s: it ends at 680.
    tr = trace(("A", 1, 0.0, 1000.0), ("A", 1, 0.0, 4.0), ("A", 1, 0.0, 4.0), ("A", 1, 100.0, 50.0))
    r = run("hsched", tr, "fast:2,slow:1")
    assert ends(r) == pytest.approx({0: 680.0, 1: 2.0, 2: 2.0, 3: 125.0})
    assert r.summary["migrations"] == 1


def test_hsched_stays_put_when_the_move_does_not_pay_for_its_checkpoint():
    # same trace, 1000 s checkpoint: expected gain 360 s * (1 - 1/2) = 180 s < 2 * 1000 s, so no move
    tr = trace(("A", 1, 0.0, 4.0), ("A", 1, 0.0, 4.0))
    r = run("hsched", tr, "fast:1,slow:1", costs=SimCosts(checkpoint_s=1000.0))
    assert ends(r)[0] == pytest.approx(4.0)
    assert r.summary["migrations"] == 0


def test_las_hetero_moves_pay_the_checkpoint_cost():
    # las-hetero does move (it ignores the cost, like Gavel): job0 moves at 2, restores 5 s, runs 1 s: ends at 8
    tr = trace(("A", 1, 0.0, 4.0), ("A", 1, 0.0, 4.0))
    r = run("las-hetero", tr, "fast:1,slow:1", costs=SimCosts(checkpoint_s=5.0), round_s=1.0)
    assert ends(r)[0] == pytest.approx(8.0)
    assert r.summary["gpu_hours_lost"] == pytest.approx(5.0 / 3600)


def test_gang_is_all_or_nothing():
    # 4 fast GPUs on one server; job0 (1 GPU, 10 work) runs 0..5; the 4-GPU gang (8 work at 4/s) arriving at
    # 1 cannot start on the 3 free GPUs: it waits and runs 5..7, never partially
    r = run("fifo", trace(("A", 1, 0.0, 10.0), ("G", 4, 1.0, 8.0)), "fast:4")
    rec = {x.id: x for x in r.records}
    assert rec[1].start_s == pytest.approx(5.0)
    assert rec[1].end_s == pytest.approx(7.0)


def test_spanning_servers_costs_throughput():
    # a 4-GPU gang on 2-GPU servers must span two: at span factor 0.5 it runs at 2/s instead of 4/s
    tr = trace(("G", 4, 0.0, 8.0))
    assert ends(run("hsched", tr, "fast:4", gpn=2))[0] == pytest.approx(2.0)
    slow = run("hsched", tr, "fast:4", gpn=2, costs=SimCosts(span_factor=0.5))
    assert ends(slow)[0] == pytest.approx(4.0)
    # on one 4-GPU server it does not span, so the factor does not apply
    assert ends(run("hsched", tr, "fast:4", gpn=4, costs=SimCosts(span_factor=0.5)))[0] == pytest.approx(2.0)
    # a server without NVLink slows a multi-GPU gang by the PCIe factor
    assert ends(run("hsched", tr, "fast:4@pcie", costs=SimCosts(pcie_factor=0.5)))[0] == pytest.approx(4.0)


def test_placement_packs_a_gang_onto_one_server():
    servers = parse_cluster("fast:8", 4)
    busy = JobView(9, "A", 1, 0.0, JobPhase.RUNNING, gpu_type="fast",
                   placement=(__import__("hsched.model").model.Placement("fast-1", ("fast-1/0",)),), run_start_s=0.0)
    inp = build_input(0.0, (busy, JobView(0, "G", 2, 0.0)), servers, model())
    d = schedule_round(make_policy("fifo"), inp, servers)
    (start,) = d.starts
    # best fit: the partly used server fast-1 (3 free) rather than the empty fast-0
    assert [p.node for p in start.placement] == ["fast-1"]
    assert len(start.placement[0].devices) == 2


def test_backfill_easy():
    # 2 fast GPUs. job0: 1 GPU, 0..10 (limit 10). job1: 2-GPU gang at 1: reserved for t=10.
    # job2 (limit 3, arrives 2) ends by 5 <= 10: backfills 2..4. job3 has no limit: it may not backfill,
    # so it waits until the gang is done (10..12) and runs 12..14.
    tr = trace(("A", 1, 0.0, 20.0, 10.0), ("G", 2, 1.0, 8.0), ("A", 1, 2.0, 4.0, 3.0), ("A", 1, 2.5, 4.0))
    r = run("backfill", tr, "fast:2")
    rec = {x.id: x for x in r.records}
    assert (rec[2].start_s, rec[2].end_s) == pytest.approx((2.0, 4.0))
    assert rec[1].start_s == pytest.approx(10.0)
    assert rec[3].start_s == pytest.approx(12.0)
    # strict FIFO makes job2 wait behind the gang
    assert {x.id: x for x in run("fifo", tr, "fast:2").records}[2].start_s == pytest.approx(12.0)


def test_qos_prod_goes_first_in_hsched():
    servers = parse_cluster("fast:1", 4)
    jobs = (JobView(0, "A", 1, 0.0, qos="scavenger"), JobView(1, "A", 1, 5.0, qos="prod"))
    d = schedule_round(make_policy("hsched"), build_input(5.0, jobs, servers, model()), servers)
    assert [s.job_id for s in d.starts] == [1]
    assert d.waiting == {0: "Priority"}  # waits behind a higher-priority job, as squeue says
