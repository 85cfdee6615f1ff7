"""Pinned decisions: exact summaries of small replays, so that a change that alters scheduling decisions
(an optimisation that was meant not to, say) fails here instead of passing silently.

The figures were recorded with the scheduling core as it was before the performance work of issue 4 and
are unchanged by it. A deliberate change of policy behaviour must update them, and say so in its commit.
"""

from __future__ import annotations

import pytest

from hsched.sched import make_policy
from hsched.sim.cluster import parse_cluster
from hsched.sim.engine import SimConfig, SimCosts, simulate
from hsched.sim.trace import Trace, load_trace, synthetic
from tests.sim.test_loaders import GAVEL, needs_shared

# (cluster v100:p100:k80, policy) -> (avg_jct_s, makespan_s, preemptions, rounds); the first 200 jobs of
# ed69ec, servers of 4, 360 s rounds, no checkpoint cost
ED69EC_HEAD = {
    ("16:16:16", "fifo"): (887499.2273094335, 40884960.88241275, 0, 397),
    ("16:16:16", "fifo-hetero"): (583540.7491316277, 4423352.290791139, 0, 398),
    ("16:16:16", "las"): (607508.2426016909, 11760397.218512274, 70, 1230),
    ("16:16:16", "las-hetero"): (417457.8451165793, 4087529.596491584, 2171, 999),
    ("16:16:16", "ftf"): (418342.8540298824, 4089304.4250171385, 2740, 1008),
    ("16:16:16", "srtf-oracle"): (419401.2804615936, 4491022.904365547, 32, 397),
    ("16:16:16", "backfill"): (583540.7491316277, 4423352.290791139, 0, 398),
    ("16:16:16", "hsched"): (417176.9347917355, 4084687.9098776737, 64, 997),
    ("8:8:8", "fifo"): (2044302.2153137818, 40884960.88241275, 0, 399),
    ("8:8:8", "fifo-hetero"): (2168059.7853454314, 40885626.56201643, 0, 399),
    ("8:8:8", "las"): (956464.8755047998, 28563469.86336606, 255, 4840),
    ("8:8:8", "las-hetero"): (606574.7926315228, 5887503.412060776, 12257, 4033),
    ("8:8:8", "ftf"): (608365.0395984766, 5865457.657857543, 30450, 4022),
    ("8:8:8", "srtf-oracle"): (571381.7101196704, 7008260.611626642, 144, 399),
    ("8:8:8", "backfill"): (2168059.7853454314, 40885626.56201643, 0, 399),
    ("8:8:8", "hsched"): (600701.09285823, 5790917.315642858, 276, 4019),
}

# 2,000 synthetic jobs (seed 7, 0.75 jobs/h: about 70-80 % of the fleet) on v100:16,p100:16,k80:16
SYNTHETIC = {
    "fifo": (180917.9574958012, 10406803.42229631, 0, 3988),
    "las": (119082.11984873285, 10501132.20057164, 562, 20631),
    "las-hetero": (92071.62949219094, 10002250.31819318, 6427, 10613),
    "ftf": (93283.24479062676, 9988524.695060538, 10489, 10841),
    "hsched": (93297.83001995595, 9950301.00536154, 353, 10055),
}


def _check(s: dict, want: tuple[float, float, int, int]) -> None:
    got = (s["avg_jct_s"], s["makespan_s"], s["preemptions"], s["rounds"])
    assert got[2:] == want[2:], got
    assert got[:2] == pytest.approx(want[:2], rel=1e-9, abs=1e-6), got


def _head() -> Trace:
    tr = load_trace(GAVEL / "ed69ec.trace")
    return Trace(tr.jobs[:200], tr.throughput, tr.source)


@needs_shared
@pytest.mark.parametrize("shape,policy", sorted(ED69EC_HEAD))
def test_ed69ec_head_decisions_are_pinned(shape, policy):
    v, p, k = shape.split(":")
    servers = parse_cluster(f"v100:{v},p100:{p},k80:{k}", 4)
    _check(simulate(_head(), servers, make_policy(policy), SimConfig()).summary, ED69EC_HEAD[(shape, policy)])


@needs_shared
def test_ed69ec_head_with_checkpoint_cost_is_pinned():
    # a checkpoint cost turns on hsched's move_pays check and its second, pinned assignment
    servers = parse_cluster("v100:16,p100:16,k80:16", 4)
    s = simulate(_head(), servers, make_policy("hsched"), SimConfig(costs=SimCosts(checkpoint_s=60.0))).summary
    _check(s, (439987.3815984449, 4002012.4213271197, 71, 1103))


@pytest.mark.parametrize("policy", ["hsched", "las-hetero"])
def test_synthetic_decisions_are_pinned(policy):
    tr = synthetic(2000, seed=7, jobs_per_hour=0.75)
    servers = parse_cluster("v100:16,p100:16,k80:16", 4)
    _check(simulate(tr, servers, make_policy(policy), SimConfig()).summary, SYNTHETIC[policy])
