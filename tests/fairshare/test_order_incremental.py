"""The `hsched` order kept from round to round (issue 33): a waiting job's key kept while its view is, a few new keys
inserted into the last round's sorted ones, and the order between users made only as far as the round reads it.
Each must give exactly what the order made afresh gives: rounds of a churning queue (jobs start, end, arrive,
change priority) are ordered with the cache carried over and without, and compared."""

from __future__ import annotations

import random

from hsched.sched.policies.hsched import Hsched
from hsched.sched.view import JobPhase, JobView, PolicyInput
from tests.fairshare.test_fair_share_decides import MODEL, shares

USERS = ("alice", "bob", "carol", "dave")


def _input(jobs: list[JobView], now: float, usage: dict[str, float], cache: dict[str, object]) -> PolicyInput:
    return PolicyInput(now=now, jobs=tuple(jobs), capacity={"a100": 24}, gpu_types=("a100",), throughput=MODEL,
                       user_usage=usage, cache=cache)


def _churn(rng: random.Random, jobs: list[JobView], now: float, next_id: int) -> tuple[list[JobView], int]:
    """One round's changes: a few jobs end, a few waiting ones start, a few arrive, one changes priority; every other
    job keeps its very view (as the live controller and the simulator keep them)."""
    out = list(jobs)
    for _ in range(rng.randint(0, 3)):
        if out:
            out.pop(rng.randrange(len(out)))
    waiting = [k for k, j in enumerate(out) if j.phase is not JobPhase.RUNNING]
    for k in rng.sample(waiting, min(len(waiting), rng.randint(0, 3))):
        out[k] = out[k]._replace(phase=JobPhase.RUNNING, gpu_type="a100", run_start_s=now, service_s=1.0)
    waiting = [k for k, j in enumerate(out) if j.phase is not JobPhase.RUNNING]
    if waiting and rng.random() < 0.3:
        k = rng.choice(waiting)
        out[k] = out[k]._replace(priority=out[k].priority + 10)
    # sometimes a burst: more new keys than are inserted one by one
    for _ in range(rng.choice((0, 1, 2, 3, 80))):
        out.append(JobView(next_id, "A", rng.choice((1, 1, 2, 4)), now, user=rng.choice(USERS),
                           priority=rng.choice((0, 0, 5)), qos=rng.choice(("normal", "normal", "scavenger"))))
        next_id += 1
    return out, next_id


def test_the_order_kept_from_round_to_round_is_the_order_made_afresh() -> None:
    rng = random.Random(7)
    jobs = [JobView(i, "A", rng.choice((1, 2)), float(i), user=rng.choice(USERS), service_s=float(rng.randint(0, 9)))
            for i in range(300)]
    next_id = 300
    cache: dict[str, object] = {}
    for r in range(40):
        now = 1000.0 + 60.0 * r
        usage = shares({u: 100.0 * (k + 1) + r for k, u in enumerate(USERS)})
        kept = Hsched().order(_input(jobs, now, usage, cache))
        fresh = Hsched().order(_input(jobs, now, usage, {}))
        assert [j.id for j in kept] == [j.id for j in fresh], f"round {r}"
        # the plan reads the order only as far as it selects; the reservation's head from the same, read on
        inp = _input(jobs, now, usage, cache)
        plan = Hsched().plan(inp)
        assert plan.wants == Hsched().plan(_input(jobs, now, usage, {})).wants
        head = next(iter(Hsched().waiting_order(inp) or ()), None)
        assert head == next((j.id for j in fresh if j.phase is not JobPhase.RUNNING), None)
        jobs, next_id = _churn(rng, jobs, now, next_id)


def test_one_user_is_ordered_whole_and_alike() -> None:
    jobs = [JobView(i, "A", 1, float(i), user="alice", service_s=float(i % 5)) for i in range(50)]
    cache: dict[str, object] = {}
    usage = shares({"alice": 10.0})
    assert [j.id for j in Hsched().order(_input(jobs, 100.0, usage, cache))] == \
        [j.id for j in Hsched().order(_input(jobs, 100.0, usage, {}))]
