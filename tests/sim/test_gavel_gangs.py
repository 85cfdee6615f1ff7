"""Issue 33 item 3: `--round-mode gavel` on jobs of several GPUs, against Gavel's own simulator on a trace from
Gavel's own generator (tests/fixtures/traces/gavel-generated/, 100 jobs: 73 of one GPU, 5 of two, 22 of four;
4 V100 + 4 P100 + 4 K80 in servers of 4, seed 0, 360 s rounds). Gavel's figures are the average JCT its log
prints (tests/fixtures/README.md says where they come from).

Two causes made the gang figures differ, both in what a policy normalises by (the single-GPU figures did not
see them: with one GPU per job they cancel out or nearly):

* het-LAS (Gavel's MaxMinFairnessPolicyWithPerf) divides each job's throughput by its throughput on a
  proportional share of every type (capacity[t] / total), whatever its scale; normalising by the type-blind LAS
  allocation, which already gives a gang of s GPUs 1/s of a one-GPU job's time, counted the scale twice and
  starved the gangs: 1.208x Gavel's figure before, 0.986x now.
* FTF (FinishTimeFairnessPolicyWithPerf) takes its isolated share from IsolatedPolicy (capacity[t] / (jobs x
  scale), rows scaled so the fullest sums to 1) and counts the isolated finish time from the work done so far at
  the isolated rates, not from the time since arrival: 0.934x before, 1.032x now.
"""

from __future__ import annotations

import pytest

from hsched.sim.gavel import GavelConfig, GavelSimulator
from hsched.sim.trace import load_trace
from tests.conftest import FIXTURES

TRACE = FIXTURES / "traces" / "gavel-generated" / "gen_100jobs_lam1800_multi.trace"
THROUGHPUTS = FIXTURES / "traces" / "gavel-msr" / "simulation_throughputs.json"

GAVEL_AVG_JCT_S = {"fifo": 49_960.2, "las": 25_309.9, "las-hetero": 18_625.4, "ftf": 18_833.4}
"""Gavel's simulator (stanford-futuredata/gavel at c4fa40097339) on the trace: fifo, max_min_fairness,
max_min_fairness_perf, finish_time_fairness_perf."""


@pytest.mark.slow  # about 7 s of CPU for the four
@pytest.mark.parametrize(("policy", "measured"), [("fifo", 0.979), ("las", 0.974), ("las-hetero", 0.986),
                                                  ("ftf", 1.032)])
def test_gangs_within_five_percent_of_gavel(policy: str, measured: float) -> None:
    tr = load_trace(TRACE, throughputs=THROUGHPUTS)
    assert sum(j.gpus > 1 for j in tr.jobs) == 27
    s = GavelSimulator(tr, {"v100": 4, "p100": 4, "k80": 4}, policy, GavelConfig()).run().summary
    assert s["unfinished_jobs"] == 0 and s["jobs"] == 100
    ratio = s["avg_jct_s"] / GAVEL_AVG_JCT_S[policy]
    assert abs(ratio - 1.0) <= 0.05
    # pinned: a change to the round or the allocations shows here before it shows in the 5% bound
    assert ratio == pytest.approx(measured, abs=0.002)
