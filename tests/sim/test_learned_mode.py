"""`hsched sim --learned` and `--predict`: the policy's knowledge learned from the jobs' own progress and
predicted from the completed jobs, while the jobs run at the trace table's true rates (issue 14 item 7)."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from hsched.cli import app
from hsched.learn.kinds import MIN_WINDOW_S, KindRate, PlacementClass, catalog_prior
from hsched.sched import make_policy
from hsched.sched.policies.base import AnyPolicy
from hsched.sched.view import PolicyInput
from hsched.sim.cluster import parse_cluster
from hsched.sim.engine import SimConfig, Simulator, simulate
from hsched.sim.knowledge import DEFAULT_GUESS_S, Learner, Predictor, measured_prior
from hsched.sim.trace import Trace, load_trace
from tests.sim.test_decisions_pinned import ED69EC_HEAD, _check
from tests.sim.test_loaders import GAVEL

TYPES = ("v100", "p100", "k80")


def _slice(n: int) -> Trace:
    tr = load_trace(GAVEL / "ed69ec.trace")
    return Trace(tr.jobs[:n], tr.throughput, tr.source)


def _recording(name: str, seen: list[PolicyInput]) -> AnyPolicy:
    """The named policy, keeping every round's input."""
    base = make_policy(name)

    class Recording(type(base)):  # type: ignore[misc]
        def plan(self, inp):
            seen.append(inp)
            return super().plan(inp)

    return Recording()


# ------------------------------------------------------------------------------------------------ learning


def test_the_learner_starts_from_the_prior_alone():
    model = Learner(TYPES).model()
    prior = catalog_prior()
    rel = model.rel_speeds("ResNet-50 (batch size 64)", 1, TYPES)
    assert rel == pytest.approx({t: prior[t] / prior["v100"] for t in TYPES})
    assert not model.knows("ResNet-50 (batch size 64)")


def test_the_policy_rate_equals_the_measured_one_once_a_job_type_ran_there():
    tr = _slice(60)
    truth = tr.throughput
    seen: list[PolicyInput] = []
    sim = Simulator(tr, parse_cluster("v100:8,p100:8,k80:8", 4), _recording("hsched", seen), SimConfig(learned=True))
    s = sim.run().summary
    assert s["jobs"] == 60 and s["throughputs"] == "learned" and s["durations"] == "true"
    assert s["model_rebuilds"] >= 2
    checked = 0
    ran: dict[tuple[str, str], float] = {}  # (job type, GPU type) -> when a stint there was first measurable
    for inp in seen:
        for j in inp.jobs:
            if j.running and j.gpu_type is not None and inp.now - (j.run_start_s or 0.0) >= MIN_WINDOW_S:
                ran.setdefault((j.job_type, j.gpu_type), inp.now)
        for (jt, gt), since in ran.items():
            if since < inp.now:  # measured at an earlier round: this round's model has it
                assert inp.throughput.rate(jt, 1, gt) == pytest.approx(truth.rate(jt, 1, gt), rel=1e-9)
                checked += 1
    assert checked > 100
    # at the end, every (job type, GPU type) that ran is the table's, and one that never ran on a type is
    # completed there from the prior's ratio to the types it ran on
    learner = sim.learner
    assert learner is not None
    model = learner.model()
    prior = catalog_prior()
    measured: dict[str, set[str]] = {}
    for jt, gt, gpus, klass in learner.rates:
        assert (gpus, klass) == (1, PlacementClass.SINGLE)
        assert model.rate(jt, 1, gt) == pytest.approx(truth.rate(jt, 1, gt), rel=1e-9)
        measured.setdefault(jt, set()).add(gt)
    partial = [(jt, ts) for jt, ts in measured.items() if len(ts) < len(TYPES)]
    assert partial, "the slice is meant to leave some job type unmeasured on some GPU type"
    for jt, ts in partial:
        for t in set(TYPES) - ts:
            logs = [math.log(truth.rate(jt, 1, m) * prior[t] / prior[m]) for m in ts]
            assert model.rate(jt, 1, t) == pytest.approx(math.exp(sum(logs) / len(logs)), rel=1e-9)


def test_learned_mode_changes_only_the_policy_view_not_the_truth():
    # the same jobs, the same lower bounds (the truth), other decisions (the policy's view)
    tr = _slice(60)
    servers = parse_cluster("v100:8,p100:8,k80:8", 4)
    table = simulate(tr, servers, make_policy("hsched"), SimConfig()).summary
    learned = simulate(tr, servers, make_policy("hsched"), SimConfig(learned=True)).summary
    assert learned["lower_bound_avg_jct_s"] == table["lower_bound_avg_jct_s"]
    assert learned["jobs"] == table["jobs"] == 60
    assert learned["avg_jct_s"] != table["avg_jct_s"]


def test_a_gang_size_never_measured_still_runs_at_the_prior():
    learner = Learner(TYPES)
    learner.observe("LM", "v100", 4, PlacementClass.NVLINK, 8.0, 0.0)
    model = learner.model()
    assert model.rate("LM", 4, "k80") == pytest.approx(8.0 * catalog_prior()["k80"])
    # a 1-GPU job of a type only seen as a gang of 4: the table has no rate to scale from; the prior's
    one = model.rel_speeds("LM", 1, TYPES)
    assert one["v100"] == 1.0 and one["k80"] == pytest.approx(catalog_prior()["k80"])


def test_a_speed_seen_again_does_not_rebuild_the_model():
    learner = Learner(TYPES)
    learner.observe("A3C", "v100", 1, PlacementClass.SINGLE, 2.0, 0.0)
    first = learner.model()
    learner.observe("A3C", "v100", 1, PlacementClass.SINGLE, 2.0, 10.0)
    assert learner.model() is first and learner.rebuilds == 1
    learner.observe("A3C", "v100", 1, PlacementClass.SINGLE, 4.0, 20.0)
    assert learner.model() is not first and learner.rebuilds == 2
    assert learner.rates[("A3C", "v100", 1, PlacementClass.SINGLE)].runs == 3


def test_measured_prior_is_the_geometric_mean_of_the_measured_ratios():
    def rate(kind: str, gpu: str, speed: float) -> KindRate:
        return KindRate(kind, gpu, 1, PlacementClass.SINGLE, speed, 1, 0.0)

    rates = [rate("a", "v100", 4.0), rate("a", "k80", 1.0), rate("b", "v100", 1.0), rate("b", "k80", 0.36),
             rate("c", "p100", 1.0)]  # c ran on p100 alone: nothing to compare p100 with
    prior = measured_prior(rates, {"v100": 1.0, "p100": 0.55, "k80": 0.2}, TYPES)
    assert prior["k80"] == pytest.approx(math.sqrt(0.25 * 0.36))
    assert prior["p100"] == 0.55 and prior["v100"] == 1.0


@pytest.mark.parametrize("refine", [False, True])
def test_learned_mode_on_a_gang_trace_finishes_every_job(refine):
    tr = load_trace(GAVEL / "0e4a51.trace")
    tr = Trace(tr.jobs[:40], tr.throughput, tr.source)
    sim = Simulator(tr, parse_cluster("v100:8,p100:8,k80:8", 4), make_policy("hsched"),
                    SimConfig(learned=True, refine_prior=refine))
    s = sim.run().summary
    assert s["jobs"] + s["unschedulable_jobs"] == 40 and s["unfinished_jobs"] == 0
    assert sim.learner is not None
    assert {gpus for _jt, _gt, gpus, _k in sim.learner.rates} > {1}  # gangs were measured too


# ------------------------------------------------------------------------------------------------ predicting


def test_predictor_falls_back_to_the_median_so_far_then_to_an_hour():
    p = Predictor()
    assert p.expected("LM", "ann") == DEFAULT_GUESS_S
    p.done("A3C", "bob", 100.0)
    p.done("A3C", "bob", 300.0)
    p.done("CycleGAN", "bob", 1000.0)
    assert p.expected("LM", "ann") == 300.0  # nothing of its kind: the median of all
    assert p.expected("A3C", "ann") == 200.0  # anyone's runs of the kind
    p.done("A3C", "ann", 50.0)
    p.done("A3C", "ann", 70.0, predicted_s=140.0)
    assert p.expected("A3C", "ann") == 60.0  # the user's own, once there are two
    assert p.mean_abs_error == pytest.approx(1.0)
    assert Predictor.remaining(10.0, 60.0) == 50.0
    assert Predictor.remaining(100.0, 60.0) == 100.0  # outlived its prediction: as long again


def test_backfill_and_the_oracle_get_predicted_durations():
    tr = _slice(60)
    servers = parse_cluster("v100:8,p100:8,k80:8", 4)
    seen: list[PolicyInput] = []
    s = simulate(tr, servers, _recording("backfill", seen), SimConfig(predict=True)).summary
    assert s["durations"] == "predicted" and s["throughputs"] == "table"
    assert isinstance(s["prediction_mean_abs_error"], float)
    first = seen[0]
    assert all(j.time_limit_s == DEFAULT_GUESS_S for j in first.jobs if not j.running)  # nothing completed yet
    later = [j for inp in seen[len(seen) // 2:] for j in inp.jobs if not j.running]
    assert later and any(j.time_limit_s != DEFAULT_GUESS_S for j in later)
    assert all(j.time_limit_s is not None and j.time_limit_s > 0 for inp in seen for j in inp.jobs)
    truth = simulate(tr, servers, make_policy("srtf-oracle"), SimConfig()).summary
    predicted = simulate(tr, servers, make_policy("srtf-oracle"), SimConfig(predict=True)).summary
    assert predicted["jobs"] == truth["jobs"] == 60
    assert predicted["avg_jct_s"] != truth["avg_jct_s"]


# ------------------------------------------------------------------------------------------------ defaults


@pytest.mark.parametrize("policy", ["hsched", "backfill", "srtf-oracle"])
def test_the_default_mode_is_the_pinned_one(policy):
    s = simulate(_slice(200), parse_cluster("v100:16,p100:16,k80:16", 4), make_policy(policy), SimConfig()).summary
    _check(s, ED69EC_HEAD[("16:16:16", policy)])
    assert (s["throughputs"], s["durations"]) == ("table", "true")
    assert "learned_rates" not in s and "prediction_mean_abs_error" not in s


def test_cli_learned_and_predict(tmp_path):
    r = CliRunner().invoke(app, ["sim", "compare", "--trace", str(GAVEL / "ed69ec.trace"), "--cluster",
                                 "v100:8,p100:8,k80:8", "--policy", "hsched,srtf-oracle", "--max-jobs", "30",
                                 "--learned", "--learned-prior", "measured", "--predict", "--json"])
    assert r.exit_code == 0, r.output
    for run in json.loads(r.stdout)["runs"]:
        assert (run["throughputs"], run["durations"], run["learned_prior"]) == ("learned", "predicted", "measured")
    bad = CliRunner().invoke(app, ["sim", "--synthetic", "5", "--cluster", "v100:4", "--learned",
                                   "--learned-prior", "oracle"])
    assert bad.exit_code == 2 and "--learned-prior" in bad.output
    gavel = CliRunner().invoke(app, ["sim", "--synthetic", "5", "--cluster", "v100:4", "--round-mode", "gavel",
                                     "--policy", "fifo", "--predict"])
    assert gavel.exit_code == 2 and "--predict" in gavel.output
