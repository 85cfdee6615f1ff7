"""The simulator's forecasts as a dict (`eager_left`, for a policy that reads them: `Policy.reads_forecast`) answer
what `_ProgressLeft` answers, round by round: a policy told it does not read them gets the lazy mapping instead."""

from __future__ import annotations

import pytest

import hsched.sim.engine as engine
from hsched.sched import make_policy
from hsched.sim.cluster import parse_cluster
from hsched.sim.engine import SimConfig, SimCosts, simulate
from hsched.sim.trace import Trace, load_trace
from tests.sim.test_loaders import GAVEL


def _forecasts(monkeypatch: pytest.MonkeyPatch, eager: bool, cost: float) -> tuple[list[object], dict]:
    """Each full round's forecast of every job in it, and the summary, with the dict (`eager`) or without."""
    seen: list[object] = []
    real = engine.schedule_round

    def spy(policy, inp, servers, **kw):  # type: ignore[no-untyped-def]
        if not inp.starts_only:
            seen.append((inp.now, type(inp.forecast_s).__name__ == "_LeftNow",
                         [(j.id, inp.forecast_s.get(j.id)) for j in inp.jobs]))
        return real(policy, inp, servers, **kw)

    tr = load_trace(GAVEL / "ed69ec.trace")
    policy = make_policy("hsched")
    if not eager:
        policy.reads_forecast = False  # type: ignore[misc]
    servers = parse_cluster("v100:4,p100:4,k80:4", 4)
    with monkeypatch.context() as m:
        m.setattr(engine, "schedule_round", spy)
        s = simulate(Trace(tr.jobs[:120], tr.throughput, tr.source), servers, policy,
                     SimConfig(costs=SimCosts(checkpoint_s=cost))).summary
    return seen, s


@pytest.mark.parametrize("cost", [0.0, 30.0])
def test_the_dict_answers_as_the_lazy_mapping(monkeypatch: pytest.MonkeyPatch, cost: float) -> None:
    eager, s_eager = _forecasts(monkeypatch, True, cost)
    lazy, s_lazy = _forecasts(monkeypatch, False, cost)
    assert all(is_dict for _, is_dict, _ in eager) and not any(is_dict for _, is_dict, _ in lazy)
    assert sum(1 for _, _, fs in eager for _, f in fs if f is not None) > 1000  # (jobs that ran, waiting or not)
    assert [(t, fs) for t, _, fs in eager] == [(t, fs) for t, _, fs in lazy]
    s_eager.pop("wall_s")
    s_lazy.pop("wall_s")
    assert s_eager == s_lazy
