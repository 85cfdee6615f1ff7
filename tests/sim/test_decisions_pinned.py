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
    ("16:16:16", "fifo"): (887499.2273094335, 40884960.88241275, 0, 399),
    ("16:16:16", "fifo-hetero"): (583540.7491316277, 4423352.290791139, 0, 399),
    ("16:16:16", "las"): (607508.2426016909, 11760397.218512274, 70, 1232),
    ("16:16:16", "las-hetero"): (417454.6216648903, 4087550.13458985, 2164, 1002),
    ("16:16:16", "ftf"): (418336.53122366866, 4089334.5351434518, 2727, 1014),
    ("16:16:16", "srtf-oracle"): (419388.4940949564, 4490754.975933227, 32, 399),
    ("16:16:16", "backfill"): (583540.7491316277, 4423352.290791139, 0, 399),
    ("16:16:16", "hsched"): (417169.6830858995, 4084682.8063622974, 64, 1000),
    ("8:8:8", "fifo"): (2044302.2153137818, 40884960.88241275, 0, 399),
    ("8:8:8", "fifo-hetero"): (2168059.7853454314, 40885626.56201643, 0, 399),
    ("8:8:8", "las"): (956464.8755047998, 28563469.86336606, 255, 4840),
    ("8:8:8", "las-hetero"): (606574.388381985, 5887501.022319087, 12257, 4033),
    ("8:8:8", "ftf"): (608364.5471958355, 5865454.935841953, 30450, 4022),
    ("8:8:8", "srtf-oracle"): (571380.542231734, 7008260.611626642, 144, 399),
    ("8:8:8", "backfill"): (2168059.7853454314, 40885626.56201643, 0, 399),
    ("8:8:8", "hsched"): (600701.09285823, 5790917.315642858, 276, 4019),
}

# 2,000 synthetic jobs (seed 7, 0.75 jobs/h: about 70-80 % of the fleet) on v100:16,p100:16,k80:16
SYNTHETIC = {
    "fifo": (180917.9574958012, 10406803.42229631, 0, 3999),
    "las": (119082.11984873285, 10501132.20057164, 562, 20637),
    "las-hetero": (92240.78480470864, 10001477.271421516, 6350, 10449),
    "ftf": (92555.21940900122, 10053419.643228073, 9709, 10107),
    "hsched": (93708.01520123926, 9988761.306730542, 309, 10268),
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
    _check(s, (439984.29042514967, 4002012.4213271197, 71, 1106))


@pytest.mark.parametrize("policy", ["hsched", "las-hetero"])
def test_synthetic_decisions_are_pinned(policy):
    tr = synthetic(2000, seed=7, jobs_per_hour=0.75)
    servers = parse_cluster("v100:16,p100:16,k80:16", 4)
    _check(simulate(tr, servers, make_policy(policy), SimConfig()).summary, SYNTHETIC[policy])
