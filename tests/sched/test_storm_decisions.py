"""The QoS preemption search keeps a server's answer between waiting jobs (issue 33: linear in the running jobs per
round): a preemption storm decides exactly as the search before it (tests/sched/preempt_before.py, the per-job
search over every server, asking the topology engine for every candidate set), and the same victims once more with
the round's cache."""

from __future__ import annotations

import pytest

from hsched.sched.cache import RoundCache
from hsched.sched.live import Preempt, schedule
from hsched.sched.stages import preemption
from tests.bench.bench_live import storm_case
from tests.sched import preempt_before


@pytest.mark.parametrize(("gpus", "waiting"), [(64, 300), (128, 120)])
def test_storm_decisions_unchanged(monkeypatch: pytest.MonkeyPatch, gpus: int, waiting: int) -> None:
    view, queue = storm_case(gpus, waiting)
    now = schedule(view, queue, 1000.0)  # type: ignore[arg-type]
    cached = schedule(view, queue, 1000.0, cache=RoundCache())  # type: ignore[arg-type]
    with monkeypatch.context() as m:
        m.setattr(preemption, "Victims", preempt_before.Victims)
        m.setattr(preemption.Preempting, "room", preempt_before.room_by_placement)
        m.setattr(preemption.Preempting, "forced", lambda *_a: None)  # (every claim asks the topology engine)
        before = schedule(view, queue, 1000.0)  # type: ignore[arg-type]
    preempts = [d for d in before if isinstance(d, Preempt)]
    # the case is a storm: many jobs preempt, and some wait once no victim is left
    assert len(preempts) >= gpus // 8
    assert len(preempts) < len(queue)
    assert now == before
    assert cached == before
