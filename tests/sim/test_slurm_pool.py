"""A Slurm-backed pool in the simulator (issue #17): Slurm's FIFO with EASY backfill, the hand-over, the figures."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hsched.cli import app
from hsched.sched import make_policy
from hsched.sched.throughput import ThroughputModel
from hsched.sim.cluster import parse_cluster
from hsched.sim.engine import SimConfig, simulate
from hsched.sim.slurm import SlurmPoolSpec, SlurmQueue, parse_slurm_pool
from hsched.sim.trace import Trace, TraceJob
from tests.sim.test_loaders import GAVEL

# A runs at 2 work/s and gangs G at 4, on "fast" only: the one "slow" workstation takes none of them, so every
# job goes to the pool (the round sees it as one server of 8 fast GPUs: two Slurm nodes of 4)
MODEL = ThroughputModel({"fast": {("A", 1): 2.0, ("G", 2): 4.0, ("G", 4): 4.0}, "slow": {("X", 1): 1.0}},
                        prior={"fast": 2.0, "slow": 1.0})


def _trace(*jobs: tuple[str, int, float, float]) -> Trace:
    return Trace(tuple(TraceJob(i, jt, g, at, work, name=f"j{i}") for i, (jt, g, at, work) in enumerate(jobs)),
                 MODEL, "hand-made", "steps")


def _jct(result) -> dict[int, float]:
    return {r.id: r.jct_s for r in result.records}


# ---------------------------------------------------------------- Slurm's queue alone


def test_easy_backfill_lets_short_and_out_of_the_way_jobs_past_a_blocked_gang():
    q = SlurmQueue(SlurmPoolSpec("fast", 8, gpus_per_node=4))
    q.submit(1, 1, 0.0, 100.0)
    q.submit(2, 4, 0.0, 50.0)
    assert q.schedule(0.0) == [(1, ((0, 1),)), (2, ((1, 4),))]  # best fit: the 4-GPU gang takes the empty node
    q.submit(3, 4, 0.0, 10.0)  # no node has 4 free: reserved on node 1 at 50, when job 2 is expected to end
    q.submit(4, 1, 0.0, 30.0)  # ends by 50: backfills
    q.submit(5, 1, 0.0, 200.0)  # ends after 50, but on node 0, which the reservation does not need: backfills
    q.submit(6, 4, 0.0, 5.0)  # does not fit now
    assert q.schedule(0.0) == [(4, ((0, 1),)), (5, ((0, 1),))]
    assert q.backfilled == 2
    q.release(2)
    assert q.schedule(50.0) == [(3, ((1, 4),))]  # the reservation holds: the head first


def test_a_long_job_may_not_take_the_gpus_the_head_is_waiting_for():
    q = SlurmQueue(SlurmPoolSpec("fast", 4, gpus_per_node=4))
    q.submit(1, 2, 0.0, 100.0)
    q.schedule(0.0)
    q.submit(2, 4, 0.0, 10.0)  # waits for job 1's end at 100
    q.submit(3, 1, 0.0, 500.0)  # would still run at 100, on the node the head needs whole
    q.submit(4, 1, 0.0, 100.0)  # ends at 100: may go
    assert q.schedule(0.0) == [(4, ((0, 1),))]


def test_a_gang_bigger_than_a_node_takes_whole_free_nodes():
    q = SlurmQueue(SlurmPoolSpec("fast", 10, gpus_per_node=4))  # nodes of 4, 4 and 2
    assert q.size == (4, 4, 2)
    q.submit(1, 1, 0.0, 10.0)
    q.submit(2, 6, 0.0, 10.0)
    q.submit(3, 9, 0.0, 10.0)
    # best fit: the small node for one GPU; two whole nodes of 4 for 6; not 9 on the whole nodes left
    assert q.schedule(0.0) == [(1, ((2, 1),)), (2, ((0, 4), (1, 2)))]
    q.release(1)
    q.release(2)
    assert q.schedule(10.0) == [(3, ((0, 4), (1, 4), (2, 1)))]


def test_submit_latency():
    q = SlurmQueue(SlurmPoolSpec("fast", 4, queue_wait_s=60.0, gpus_per_node=4))
    q.submit(1, 1, 60.0, 10.0)
    assert q.schedule(0.0) == []
    assert q.next_submit(0.0) == 60.0
    assert q.schedule(60.0) == [(1, ((0, 1),))]


# ---------------------------------------------------------------- in a replay


def test_backfill_in_a_replay_by_hand():
    # t=0: seven jobs fill the pool; Slurm packs node 0 with j0 (1000 s) and three 50 s jobs, node 1 with the
    # gang j4 (1000 s) and two 50 s jobs. At 50 the short ones end: node 0 has 3 free, node 1 has 2.
    # t=60: the gang j7 (4 GPUs, 50 s) cannot fit a node: reserved on node 0 at 1000 (j0's end). j8 (20 s)
    # backfills at once; j9 (1000 s), handed over when j8 ends at 80, backfills on node 1, which the
    # reservation does not need. Plain FIFO would hold both behind j7 until 1050.
    tr = _trace(("A", 1, 0.0, 2000.0), *[("A", 1, 0.0, 100.0)] * 3, ("G", 2, 0.0, 4000.0),
                *[("A", 1, 0.0, 100.0)] * 2, ("G", 4, 60.0, 200.0), ("A", 1, 60.0, 40.0), ("A", 1, 60.0, 2000.0))
    r = simulate(tr, parse_cluster("slow:1", 1), make_policy("fifo-hetero"),
                 SimConfig(slurm_pool=SlurmPoolSpec("fast", 8, gpus_per_node=4)))
    jct = _jct(r)
    assert (jct[7], jct[8], jct[9]) == pytest.approx((990.0, 20.0, 1020.0))
    assert r.summary["slurm_backfilled"] == 2
    assert r.summary["pool_jobs"] == 10 and r.summary["workstation_jobs"] == 0
    assert {x.pool for x in r.records} == {"slurm"}


def test_hand_over_latency_and_per_pool_figures():
    # one workstation GPU and a pool 30 s away: j0 runs on the workstation, j1 and the gang j2 go to the pool
    model = ThroughputModel({"fast": {("A", 1): 2.0, ("G", 4): 4.0}}, prior={"fast": 2.0})
    tr = Trace((TraceJob(0, "A", 1, 0.0, 200.0), TraceJob(1, "A", 1, 0.0, 200.0), TraceJob(2, "G", 4, 0.0, 200.0)),
               model, "hand-made", "steps")
    r = simulate(tr, parse_cluster("fast:1", 1), make_policy("fifo-hetero"),
                 SimConfig(slurm_pool=SlurmPoolSpec("fast", 8, queue_wait_s=30.0, gpus_per_node=4)))
    assert _jct(r) == pytest.approx({0: 100.0, 1: 130.0, 2: 80.0})
    s = r.summary
    assert (s["workstation_jobs"], s["workstation_avg_jct_s"]) == (1, pytest.approx(100.0))
    assert (s["pool_jobs"], s["pool_avg_jct_s"]) == (2, pytest.approx(105.0))
    assert s["slurm_avg_wait_s"] == pytest.approx(30.0)
    assert s["cluster"] == {"fast": 9}


def test_a_time_sharing_policy_never_moves_a_job_it_handed_over():
    # hsched time-shares on the workstations; jobs in the pool run there to their end
    tr = _trace(*[("A", 1, 60.0 * i, 2000.0 + 100.0 * i) for i in range(14)])
    r = simulate(tr, parse_cluster("slow:1", 1), make_policy("hsched"),
                 SimConfig(slurm_pool=SlurmPoolSpec("fast", 8, gpus_per_node=4)))
    assert r.summary["unfinished_jobs"] == 0
    assert all(x.restarts == 0 for x in r.records if x.pool)


# ---------------------------------------------------------------- the command line


def test_parse_slurm_pool():
    assert parse_slurm_pool("V100:32", 4) == SlurmPoolSpec("v100", 32, 0.0, 4)
    assert parse_slurm_pool("v100:32:60:8", 4) == SlurmPoolSpec("v100", 32, 60.0, 8)


def test_cli_workstations_alone_and_with_the_pool():
    r = CliRunner().invoke(app, ["sim", "compare", "--trace", str(GAVEL / "ed69ec.trace"), "--cluster",
                                 "v100:4,p100:4,k80:4", "--policy", "hsched", "--max-jobs", "60",
                                 "--slurm-pool", "none,v100:8:60", "--json"])
    assert r.exit_code == 0, r.output
    alone, pooled = json.loads(r.stdout)["runs"]
    assert "slurm_pool" not in alone
    assert pooled["slurm_pool"] == "v100:8:60:4"
    assert pooled["pool_jobs"] + pooled["workstation_jobs"] == 60
    assert pooled["cluster"]["v100"] == 12


@pytest.mark.parametrize(("args", "needle"), [
    (["--slurm-pool", "v100"], "--slurm-pool 'v100'"),
    (["--slurm-pool", "v100:0"], "N >= 1"),
    (["--slurm-pool", "v100:8:-1"], "QUEUE_WAIT_S >= 0"),
    (["--slurm-pool", "none,v100:8"], "`hsched sim compare` runs several"),
    (["--slurm-pool", "v100:8", "--data-model", "synthetic"], "give one of them"),
])
def test_bad_pool_options_exit_2_with_one_line(args, needle):
    r = CliRunner().invoke(app, ["sim", "--synthetic", "5", "--cluster", "v100:4", *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output
    assert "Traceback" not in r.output


def test_every_job_ending_at_the_heads_start_counts_as_freed_then() -> None:
    """Re-pinned on purpose (issue 28: the reservation's search is the live round's, `soonest_fit`): all that
    frees at the head's start counts together. Before, the search stopped at the first of two jobs ending at the same
    moment, so a long job that fits beside the head on the GPUs the second one frees was refused backfill."""
    q = SlurmQueue(SlurmPoolSpec("a100", 16, 0.0, 8))
    # node 0 held for ever; node 1: two jobs of 2 GPUs end at 100, 4 GPUs free now
    q.free = [0, 4]
    q.running = {1: (((0, 8),), float("inf")), 2: (((1, 2),), 100.0), 3: (((1, 2),), 100.0)}
    q.submit(10, 6, 0.0, 50.0)  # the head: 6 GPUs, at 100 on node 1
    q.submit(11, 2, 0.0, 10_000.0)  # long, behind it: at 100 node 1 has 8 free, the head takes 6, 2 stay its own
    assert q._reserve(q.queue[0], 0.0) == (100.0, [0, 8], {1: 6})
    assert [j for j, _ in q.schedule(0.0)] == [11]
