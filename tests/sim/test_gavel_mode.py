"""`--round-mode gavel`: Gavel's round mechanism (hsched.sim.gavel) and its allocation solver (gavel_alloc).

Fast checks on a slice of the real trace ed69ec; the full-trace figures next to Gavel's published ones are
`tests/bench/bench_sim.py --gavel` (minutes).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from hsched.cli import app
from hsched.sim.cluster import parse_cluster
from hsched.sim.engine import SimConfig, simulate
from hsched.sim.gavel import GavelConfig, GavelSimulator
from hsched.sim.trace import Trace, load_trace
from tests.sim.test_loaders import GAVEL

np = pytest.importorskip("numpy")
from hsched.sim import gavel_alloc  # noqa: E402 - needs numpy, skipped above without it

CAP = {"v100": 4, "p100": 4, "k80": 4}
# the trace's jobs run for hours to days: a slice on 12 GPUs would take thousands of rounds (and LP solves) to
# drain, so the mechanism tests stop the clock after ~80 rounds and look at what happened until then
SHORT = GavelConfig(max_time_s=30_000.0)


def _slice(n: int) -> Trace:
    tr = load_trace(GAVEL / "ed69ec.trace")
    return Trace(tr.jobs[:n], tr.throughput, tr.source, tr.work_unit)


@pytest.mark.parametrize("policy", ["fifo", "las", "las-hetero", "ftf"])
def test_gpus_change_hands_only_at_round_boundaries(policy):
    tr = _slice(40)  # 40 jobs arriving in the first 5 minutes, each hours long, on 12 GPUs
    result = GavelSimulator(tr, CAP, policy, SHORT).run()
    s = result.summary
    assert s["jobs"] + s["unfinished_jobs"] == 40
    changes = [t for t, _ in result.busy]
    assert changes[0] == 0.0  # the first arrival finds the cluster idle and starts a round at once
    gaps = [b - a for a, b in itertools.pairwise(changes)]
    # nobody starts on arrival while a round runs: the held count moves only when a round ends (about 360 s,
    # the longest micro-task of the round, itself int(rate * 360) steps)
    assert gaps and all(350.0 < g <= 360.0 + 1e-6 for g in gaps)
    assert s["rounds"] >= len(changes)
    held = [n for _, n in result.busy]
    assert max(held) <= 12


def test_same_input_same_result_and_the_seed_matters_only_where_gavel_draws():
    tr = _slice(30)

    def run(policy: str, seed: int) -> tuple[object, ...]:
        r = GavelSimulator(tr, CAP, policy, replace(SHORT, seed=seed)).run()
        return r.records, r.busy, {k: v for k, v in r.summary.items() if k != "wall_s"}

    assert run("las", 0) == run("las", 0)
    # het-LAS walks the types fastest first (no shuffle) and draws nothing: the seed changes nothing
    assert run("las-hetero", 0) == run("las-hetero", 7)


def test_gavel_fifo_gives_the_last_open_type_by_name_whatever_it_draws():
    """Gavel's base FIFO draws a random type but assigns the last open type in name order (v100 while open);
    the draw only picks which type leaves the open list when v100 is exactly full, so v100 can end up
    over-committed (its jobs then take turns)."""
    import random

    tr = _slice(12)
    sim = GavelSimulator(tr, CAP, "fifo", SHORT)
    from hsched.sim.gavel import _GJob

    jobs = [_GJob(j, {"v100": 1.0, "p100": 1.0, "k80": 1.0}, 100) for j in tr.jobs]
    over = 0
    for seed in range(10):
        assigned: dict[int, str] = {}
        sim._fifo(jobs, assigned, random.Random(seed))
        types = [assigned[j.tj.id] for j in jobs if j.tj.id in assigned]
        assert types[:4] == ["v100"] * 4  # a random choice would have spread the first four
        over += types.count("v100") > 4
    assert over > 0


def test_hsched_policies_get_gavels_timing_in_the_main_engine():
    tr = _slice(40)
    servers = parse_cluster("v100:4,p100:4,k80:4", 4)
    from hsched.sched.registry import make_policy

    ev = simulate(tr, servers, make_policy("las-hetero"), SimConfig(max_time_s=30_000.0))
    gv = simulate(tr, servers, make_policy("las-hetero"), SimConfig(round_mode="gavel", max_time_s=30_000.0))
    # on arrival (the GPUs held change at arrival instants) vs at the next 360 s boundary only
    ev_times = [t for t, _ in ev.busy if t > 0]
    gv_times = [t for t, _ in gv.busy if t > 0]
    assert any(abs(t / 360.0 - round(t / 360.0)) > 1e-6 for t in ev_times)
    assert gv_times and all(abs(t / 360.0 - round(t / 360.0)) < 1e-6 for t in gv_times)
    with pytest.raises(ValueError, match="round_mode"):
        simulate(tr, servers, make_policy("hsched"), SimConfig(round_mode="nope"))


def test_max_min_by_hand():
    # two kinds of single-GPU jobs, one V100 and one K80; kind A is 4x faster on V100, kind B 2x: max-min of
    # normalised rate puts A on the V100 and B on the K80, each at rate 1 relative to its isolated share
    coef = np.array([[4.0, 1.0], [2.0, 1.0]])
    x = gavel_alloc.max_min(coef, np.ones(2), np.ones(2), np.array([1.0, 1.0]))
    rates = (coef * x).sum(axis=1)
    # the optimum: t* with A and B equal; here x_A = (a, 0..) etc. The value can be checked against the LP
    # optimum found by brute force over a grid
    best = 0.0
    for i in range(101):
        for k in range(101):
            a_v, b_v = i / 100, 1 - i / 100  # V100 split
            a_k = k / 100
            b_k = 1 - a_k
            if a_v + a_k > 1 + 1e-9 or b_v + b_k > 1 + 1e-9:
                continue
            best = max(best, min(4 * a_v + a_k, 2 * b_v + b_k))
    assert min(rates) == pytest.approx(best, rel=2e-2)
    assert x.sum(axis=0) == pytest.approx([1.0, 1.0], abs=1e-4)


def test_max_min_light_load_is_interior_like_an_interior_point_solver():
    """Fewer jobs than GPUs: every job can have a whole GPU of each type, so the optimal face is wide; the
    solver returns its centre (an equal split), as Gavel's ECOS does, not a vertex."""
    x = gavel_alloc.max_min(np.ones((1, 3)), np.ones(1), np.array([6.0]), np.array([4.0, 4.0, 4.0]))
    assert x[0] == pytest.approx([1 / 3, 1 / 3, 1 / 3], abs=1e-4)
    x = gavel_alloc.max_min(np.ones((1, 3)), np.ones(1), np.array([24.0]), np.array([4.0, 4.0, 4.0]))
    assert x[0] == pytest.approx([4 / 24, 4 / 24, 4 / 24], abs=1e-4)


def test_finish_time_fairness_equalises_the_worst_ratio():
    rng = np.random.default_rng(0)
    n = 30
    tp = rng.uniform(1, 10, size=(n, 3))
    since = rng.uniform(0, 1e4, n)
    left = rng.uniform(1e4, 1e6, n)
    iso = tp.mean(axis=1) * 3 / n
    x = gavel_alloc.finish_time_fair(tp, np.ones(n), since, left, iso, np.array([1.0, 1.0, 1.0]))
    a = (tp * x).sum(axis=1)
    rho = (since + left / a) / (since + left / iso)
    # the isolated allocation is feasible with every rho = 1, so the optimum is at most 1; all but capped jobs
    # share the worst ratio
    assert rho.max() <= 1.0 + 1e-6
    assert x.sum(axis=0) == pytest.approx([1.0, 1.0, 1.0], abs=1e-3)
    assert np.all(x.sum(axis=1) <= 1 + 1e-9)
    assert rho.max() - np.median(rho) < 0.05 * rho.max()
    assert math.isfinite(float(rho.max()))


@pytest.mark.slow  # ~10 s: the slice's longest job needs thousands of rounds in each of the two modes
def test_cli_round_mode_gavel_json():
    r = CliRunner().invoke(app, ["sim", "compare", "--trace", str(GAVEL / "ed69ec.trace"),
                                 "--cluster", "v100:8,p100:8,k80:8", "--policy", "las-hetero,hsched",
                                 "--max-jobs", "4", "--round-mode", "gavel", "--json"])
    assert r.exit_code == 0, r.output
    runs = json.loads(r.stdout)["runs"]
    assert [x["round_mode"] for x in runs] == ["gavel", "gavel"]
    assert [x["gavel_allocation"] for x in runs] == [True, False]
    assert all(x["unfinished_jobs"] == 0 for x in runs)


def test_cli_round_mode_gavel_refuses_costs_it_does_not_model():
    r = CliRunner().invoke(app, ["sim", "--trace", str(GAVEL / "ed69ec.trace"), "--cluster", "v100:4",
                                 "--policy", "las", "--max-jobs", "5", "--round-mode", "gavel",
                                 "--checkpoint-cost", "60"])
    assert r.exit_code == 2 and "checkpoint" in r.output
    r = CliRunner().invoke(app, ["sim", "--synthetic", "5", "--cluster", "v100:4", "--round-mode", "rounds"])
    assert r.exit_code == 2 and "--round-mode" in r.output
