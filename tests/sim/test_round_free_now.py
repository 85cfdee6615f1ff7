"""The simulator hands its rounds the devices no running job holds (`schedule_round(free_now=...)`), so a round reads
the devices of the jobs it stops or moves instead of every kept job's: every such round of these replays is applied
again without them, from the kept jobs as the live controller's rounds are, and must decide exactly the same. Gangs
(the synthetic trace's multi-GPU jobs) take the placer's general path, one-GPU jobs (ed69ec) the inline one.

Also the frozen dataclasses made through their slots (hsched.sched.frozen): equal to those made by __init__, and a
field list that is not the class's is refused at import."""

from __future__ import annotations

import pytest

import hsched.sched.round as round_mod
from hsched.model import Placement
from hsched.sched import make_policy
from hsched.sched.frozen import slot_setters
from hsched.sched.placement import _start
from hsched.sched.view import JobPhase, JobView, PolicyInput, RoundDecision, Start
from hsched.sim.cluster import parse_cluster
from hsched.sim.engine import SimConfig, simulate
from hsched.sim.trace import Trace, load_trace, synthetic
from tests.sim.test_loaders import GAVEL


def _checked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Wrap the round's `apply_rule`: with `free_now`, also without it, and the two decisions compared. Returns the
    count of rounds compared, and of those that started or stopped someone (filled as the replay runs)."""
    seen = [0, 0]
    real = round_mod.apply_rule

    def both(plan, inp, servers, placer, rule, *, reasons=True, free_now=None):  # type: ignore[no-untyped-def]
        got = real(plan, inp, servers, placer, rule, reasons=reasons, free_now=free_now)
        if free_now is not None:
            # the hint is what the kept jobs say: every device of a running view is not free, every other one is
            running = [j for j in inp.jobs if j.phase is JobPhase.RUNNING]
            held = {(p.node, d) for j in running for p in j.placement for d in p.devices}
            for s in servers:
                assert list(free_now[s.name]) == [d for d in s.devices if (s.name, d) not in held]
            want = real(plan, inp, servers, placer, rule, reasons=reasons, free_now=None)
            assert got == want
            seen[0] += 1
            seen[1] += bool(got.starts or got.preempt)
        return got

    monkeypatch.setattr(round_mod, "apply_rule", both)
    return seen


@pytest.mark.parametrize("policy", ["las-hetero", "hsched"])
def test_one_gpu_rounds_decide_alike_with_free_devices(monkeypatch: pytest.MonkeyPatch, policy: str) -> None:
    tr = load_trace(GAVEL / "ed69ec.trace")
    head = Trace(tr.jobs[:120], tr.throughput, tr.source)
    seen = _checked(monkeypatch)
    simulate(head, parse_cluster("v100:4,p100:4,k80:4", 4), make_policy(policy), SimConfig())
    assert seen[0] > 100 and seen[1] > 20, seen  # (moves and stops among them, not only idle rounds)


@pytest.mark.parametrize("policy", ["las-hetero", "hsched", "fifo"])
def test_gang_rounds_decide_alike_with_free_devices(monkeypatch: pytest.MonkeyPatch, policy: str) -> None:
    tr = synthetic(150, seed=3, jobs_per_hour=2.0)
    assert any(j.gpus > 1 for j in tr.jobs)
    seen = _checked(monkeypatch)
    simulate(tr, parse_cluster("v100:8,p100:8,k80:8", 4), make_policy(policy), SimConfig())
    assert seen[0] > 50 and seen[1] > 10, seen


def test_frozen_makers_equal_init() -> None:
    where = (Placement("n1", ("gpu0",)),)
    assert _start(7, "k80", where, True) == Start(7, "k80", where, True)
    assert round_mod._decision((1, 2), (), {3: "Resources"}) == RoundDecision((1, 2), (), {3: "Resources"})
    model = load_trace(GAVEL / "ed69ec.trace").throughput
    servers = parse_cluster("v100:4,p100:4,k80:4", 4)
    jobs = (JobView(1, "ResNet-18 (batch size 16)", 1, 0.0),)
    inp = round_mod.build_input(5.0, jobs, servers, model, checkpoint_cost_s=2.0, user_usage={"u": 1.0},
                                forecast_s={1: 3.0}, quantum_s=60.0)
    assert inp == PolicyInput(5.0, jobs, {"v100": 4, "p100": 4, "k80": 4}, inp.gpu_types, model, 2.0, 360.0,
                              {"u": 1.0}, False, {}, {1: 3.0}, 60.0)
    assert set(inp.gpu_types) == {"v100", "p100", "k80"}


def test_slot_setters_refuse_another_field_list() -> None:
    with pytest.raises(RuntimeError):
        slot_setters(Start, "job_id", "gpu_type", "placement")  # one left out
    with pytest.raises(RuntimeError):
        slot_setters(Start, "gpu_type", "job_id", "placement", "migrate")  # out of order
