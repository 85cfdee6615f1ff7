"""Issue 33 item 4: `hsched sim --learned` beats the trace's own throughput table on 2869ce (and ee9e8c), traces
with many gangs whose GPU count the table never measured. These tests pin where that gap is (an investigation
still open; see docs/performance.md, "--learned against the table"):

* policies that never choose a GPU type by speed (fifo, Tiresias's las) give the very same figures with the
  table and with learned speeds: the gap is not in which jobs are admitted, nor in gang sizes the model lacks;
* heterogeneity-aware policies (fifo-hetero, las-hetero) are the ones that gain with learned speeds: the gap is
  in the GPU-type choice (`base.assign_types`), which with the table follows the table's completed rates for
  unmeasured gangs (e.g. Recommendation at 8 GPUs keeps 0.8 of its best speed on a K80, by the scaling prior);
* it is not the per-GPU-type scaling prior itself: one scaling curve for every type leaves las-hetero's gap
  (learned / table 0.615 -> 0.642).
"""

from __future__ import annotations

import pytest

import hsched.sim.knowledge as knowledge
from hsched.learn.kinds import catalog_prior
from hsched.sched import make_policy
from hsched.sched.throughput import ThroughputModel
from hsched.sim.cluster import parse_cluster
from hsched.sim.engine import SimConfig, simulate
from hsched.sim.trace import load_trace
from tests.conftest import FIXTURES

TRACE = FIXTURES / "traces" / "gavel-msr" / "seed=0" / "2869ce.trace"
SERVERS = parse_cluster("v100:16,p100:16,k80:16", 4)


def _jct(policy: str, learned: bool, flat_scaling: bool = False) -> float:
    tr = load_trace(TRACE)
    if flat_scaling:
        m = tr.throughput
        for t in list(m._scaling):
            m._scaling[t] = dict(m._scaling["v100"])
    return float(simulate(tr, SERVERS, make_policy(policy), SimConfig(learned=learned)).summary["avg_jct_s"])


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["fifo", "las"])
def test_type_blind_policies_are_unchanged_by_learning(policy: str) -> None:
    assert _jct(policy, learned=True) == pytest.approx(_jct(policy, learned=False), rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize(("policy", "lo", "hi"), [("fifo-hetero", 0.70, 0.85), ("las-hetero", 0.55, 0.70)])
def test_the_gap_is_in_the_type_choice(policy: str, lo: float, hi: float) -> None:
    # measured: fifo-hetero 173,030 / 221,042 s = 0.783; las-hetero 120,154 / 195,396 s = 0.615
    assert lo <= _jct(policy, learned=True) / _jct(policy, learned=False) <= hi


@pytest.mark.slow
def test_not_the_per_type_scaling_prior() -> None:
    # the same scaling curve (V100's) on every GPU type: the gap stays (measured 0.642)
    ratio = _jct("las-hetero", learned=True, flat_scaling=True) / _jct("las-hetero", learned=False, flat_scaling=True)
    assert 0.55 <= ratio <= 0.75


@pytest.mark.slow
def test_the_gain_is_the_prior_profile_of_unmeasured_gangs(monkeypatch: pytest.MonkeyPatch) -> None:
    tr = load_trace(TRACE)
    truth = tr.throughput

    class TableButPriorForUnmeasured(ThroughputModel):
        def rate(self, job_type: str, gpus: int, gpu_type: str, spans: bool = False) -> float | None:
            if not truth.measured(job_type, gpus):
                return self.prior_speed(gpu_type)
            return truth.rate(job_type, gpus, gpu_type, spans)

    model = TableButPriorForUnmeasured(prior=catalog_prior())
    model._known_types = truth._known_types
    table = simulate(tr, SERVERS, make_policy("fifo-hetero"), SimConfig()).summary["avg_jct_s"]
    # the learned run's knowledge path, handed this model instead of what it learns
    monkeypatch.setattr(knowledge.Learner, "model", lambda self: model)
    mixed = simulate(tr, SERVERS, make_policy("fifo-hetero"), SimConfig(learned=True)).summary["avg_jct_s"]
    assert 0.70 <= mixed / table <= 0.85  # measured 174,253 / 221,042 s = 0.788 (learned: 0.783)
