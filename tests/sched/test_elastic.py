"""hsched.sched.elastic: the pure grow/shrink decision (issue 31), each rule on the smallest input that shows it."""

from __future__ import annotations

import math

from hsched.sched.elastic import (
    Direction,
    ElasticJob,
    Waiting,
    allowed_sizes,
    fair_gpus,
    plan_resizes,
    rate_at,
)
from hsched.sched.policies.hsched import gain_pays, speedup_gain
from hsched.sched.priority import UserShare

# a job that scales well to 8 GPUs (each doubling 1.8x), one that scales badly past 2, and one measured at 1 GPU alone
GOOD = ((1, 10.0), (2, 18.0), (4, 32.4), (8, 58.3))
POOR = ((1, 10.0), (2, 12.0), (4, 12.5), (8, 12.6))
ONE = ((1, 10.0),)


def job(jid: int = 1, size: int = 2, *, lo: int = 1, hi: int = 8, rates=GOOD, run_s: float = 3600.0,
        cost: float = 30.0, proven: bool = True, pool: str = "v100", user: str = "ann", base: int | None = 2,
        **kw) -> ElasticJob:
    return ElasticJob(jid, size, lo, hi, rates, run_s, cost, proven, pool=pool, user=user, base_size=base, **kw)


def test_grows_into_idle_gpus_nobody_waits_for():
    (r,) = plan_resizes([job()], {"v100": 6}, [])
    assert (r.job_id, r.old, r.new, r.direction) == (1, 2, 8, Direction.GROW)
    assert r.gain_s == speedup_gain(3600.0, 18.0, 58.3) and r.cost_s == 30.0
    assert "idle" in r.reason


def test_grows_only_in_its_own_pool():
    assert plan_resizes([job()], {"k80": 6}, []) == ()


def test_no_grow_where_a_waiting_job_can_use_the_gpus():
    assert plan_resizes([job()], {"v100": 4}, [Waiting(7, 4)]) == ()
    # ... but what the waiting job leaves is still grown into
    (r,) = plan_resizes([job()], {"v100": 6}, [Waiting(7, 4)])
    assert (r.old, r.new) == (2, 4)


def test_a_waiting_job_that_cannot_use_the_pool_does_not_stop_growth():
    (r,) = plan_resizes([job()], {"v100": 2}, [Waiting(7, 2, pools=("k80",))])
    assert (r.old, r.new) == (2, 4)


def test_outbid_grows_only_where_each_gpu_beats_the_waiting_job():
    # off by default: the waiting job takes the free GPUs
    assert plan_resizes([job(rates=GOOD)], {"v100": 2}, [Waiting(7, 2)]) == ()
    # with a measured superlinear step (2 -> 4 GPUs: 3x), each added GPU gives 2 GPU-equivalents > 1.5
    superlinear = ((1, 10.0), (2, 18.0), (4, 54.0))
    (r,) = plan_resizes([job(rates=superlinear, hi=4)], {"v100": 2}, [Waiting(7, 2)], outbid=1.5)
    assert (r.old, r.new) == (2, 4)
    assert plan_resizes([job(rates=GOOD, hi=4)], {"v100": 2}, [Waiting(7, 2)], outbid=1.5) == ()


def test_shrinks_borrowed_gpus_to_let_a_waiting_job_start():
    (r,) = plan_resizes([job(size=8)], {"v100": 0}, [Waiting(7, 4)])
    assert (r.job_id, r.old, r.new, r.direction, r.for_job) == (1, 8, 4, Direction.SHRINK, 7)


def test_shrinks_nothing_when_it_cannot_free_enough():
    # 6 borrowed and free together are 6 < 8: no restart that lets nobody start
    assert plan_resizes([job(size=4, base=2, lo=2)], {"v100": 2}, [Waiting(7, 8)]) == ()


def test_shrinks_below_the_asked_size_only_where_the_waiting_job_gets_more():
    # scaling linearly from 2 to 4 GPUs: going back to 2 loses 1 GPU-equivalent per GPU freed, what the waiting job
    # would get: kept
    linear = ((1, 10.0), (2, 20.0), (4, 40.0))
    assert plan_resizes([job(size=4, base=4, rates=linear)], {"v100": 0}, [Waiting(7, 2)]) == ()
    # GOOD loses 0.89 per GPU going 4 -> 2, POOR 0.02: they give them to the waiting job
    for rates in (GOOD, POOR):
        (r,) = plan_resizes([job(size=4, base=4, rates=rates)], {"v100": 0}, [Waiting(7, 2)])
        assert (r.old, r.new, r.for_job) == (4, 2, 7)


def test_shrink_loss_sets_how_much_a_job_may_lose_below_its_asked_size():
    linear = ((1, 10.0), (2, 20.0), (4, 40.0))
    # the same linear job at 4: the default (1) keeps it; a higher threshold gives the waiting job its GPUs
    assert plan_resizes([job(size=4, base=4, rates=linear)], {"v100": 0}, [Waiting(7, 2)], shrink_loss=1.0) == ()
    (r,) = plan_resizes([job(size=4, base=4, rates=linear)], {"v100": 0}, [Waiting(7, 2)], shrink_loss=1.5)
    assert (r.old, r.new, r.for_job) == (4, 2, 7)
    # unlimited: down to MIN (here 1) when that is what the waiting job needs, never below it
    (r,) = plan_resizes([job(size=4, base=4, rates=linear)], {"v100": 0}, [Waiting(7, 3)], shrink_loss=math.inf)
    assert (r.old, r.new) == (4, 1)
    assert plan_resizes([job(size=4, base=4, lo=2, rates=linear)], {"v100": 0}, [Waiting(7, 3)],
                        shrink_loss=math.inf) == ()
    # a tighter one keeps GOOD (0.89 per GPU freed going 4 -> 2) where the default gave its GPUs away
    assert plan_resizes([job(size=4, base=4, rates=GOOD)], {"v100": 0}, [Waiting(7, 2)], shrink_loss=0.5) == ()


def test_never_below_min_nor_above_max():
    assert plan_resizes([job(size=4, base=4, lo=4, rates=POOR)], {"v100": 0}, [Waiting(7, 2)]) == ()
    (r,) = plan_resizes([job(hi=4)], {"v100": 16}, [])
    assert r.new == 4
    for rz in plan_resizes([job(jid=i, size=2, lo=2, hi=4) for i in range(4)], {"v100": 5}, []):
        assert 2 <= rz.new <= 4


def test_no_resize_whose_gain_does_not_pay_for_the_checkpoint():
    # just started (run_s 0: one round of 360 s expected): 2 -> 8 saves 249 s, a 200 s checkpoint needs > 400 s
    assert plan_resizes([job(run_s=0.0, cost=200.0)], {"v100": 6}, []) == ()
    assert not gain_pays(speedup_gain(360.0, 18.0, 58.3), 200.0)
    # the same job after a day: it pays
    assert plan_resizes([job(run_s=86400.0, cost=200.0)], {"v100": 6}, [])
    # a prediction of what is left wins over the time run
    assert plan_resizes([job(run_s=86400.0, cost=200.0, remaining_s=100.0)], {"v100": 6}, []) == ()


def test_no_grow_where_the_table_measured_no_speed_up():
    assert plan_resizes([job(rates=ONE, size=1, base=1)], {"v100": 8}, []) == ()


def test_only_jobs_that_proved_they_checkpoint_are_resized():
    assert plan_resizes([job(proven=False)], {"v100": 6}, []) == ()
    assert plan_resizes([job(size=8, proven=False)], {"v100": 0}, [Waiting(7, 4)]) == ()


def test_fair_share_stops_growth_past_the_users_share_while_others_wait():
    fair = {"ann": 4.0, "bob": 4.0}
    waiting = [Waiting(7, 8, user="bob")]  # bob waits (for more than is free)
    (r,) = plan_resizes([job()], {"v100": 6}, waiting, fair=fair, held={"ann": 2})
    assert r.new == 4  # up to ann's 4 GPUs, not 8
    # nobody else waits: the share does not hold it back
    (r,) = plan_resizes([job()], {"v100": 6}, [], fair=fair, held={"ann": 2})
    assert r.new == 8


def test_fair_gpus_from_user_shares():
    def share(norm: float) -> UserShare:
        return UserShare(0.0, decayed_s=0.0, norm_share=norm, lab_decayed_s=0.0)

    assert fair_gpus({"ann": share(0.75), "bob": share(0.25)}, 8) == {"ann": 6.0, "bob": 2.0}
    assert fair_gpus({"ann": 1.0, "bob": 2.0}, 8) == {"ann": 4.0, "bob": 4.0}


def test_allowed_sizes_powers_of_two_or_any():
    assert allowed_sizes(1, 8) == (1, 2, 4, 8)
    assert allowed_sizes(3, 12) == (3, 4, 8, 12)
    assert allowed_sizes(2, 5, any_size=True) == (2, 3, 4, 5)
    assert allowed_sizes(4, 2) == ()


def test_rate_at_interpolates_per_gpu_and_never_extrapolates_a_speed_up():
    rates = ((1, 10.0), (2, 18.0), (4, 32.0))
    assert rate_at(rates, 2) == 18.0
    # 3 GPUs: per-GPU rate halfway between 9 and 8
    assert rate_at(rates, 3) == 3 * 8.5
    # above the largest measured size: that size's rate
    assert rate_at(rates, 8) == 32.0
    # below the smallest: its per-GPU rate
    assert rate_at(((2, 18.0),), 1) == 9.0
    # between a fast and a slow measured size: never above the faster
    assert rate_at(((2, 20.0), (4, 12.0)), 3) <= 20.0
    assert rate_at((), 2) is None


def test_deterministic_and_one_resize_per_job():
    jobs = [job(jid=i, size=2) for i in (3, 1, 2)]
    a = plan_resizes(jobs, {"v100": 6}, [])
    assert a == plan_resizes(list(reversed(jobs)), {"v100": 6}, [])
    assert len({r.job_id for r in a}) == len(a)
    assert sum(r.new - r.old for r in a) <= 6


def test_a_job_faster_at_a_smaller_size_shrinks_to_it_when_it_pays():
    falls = ((1, 10.0), (2, 20.0), (4, 15.0))  # Gavel measures some models slower at 4 GPUs than at 2
    (r,) = plan_resizes([job(size=4, base=4, rates=falls)], {"v100": 0}, [])
    assert (r.old, r.new, r.direction) == (4, 2, Direction.SHRINK) and -r.gain_s > 2 * r.cost_s  # a loss < 0
    assert "faster" in r.reason
    # ... and the GPUs it gives back go to a waiting job, with no further shrink
    (r,) = plan_resizes([job(size=4, base=4, rates=falls)], {"v100": 0}, [Waiting(7, 2)])
    assert r.new == 2
    # not when the restart costs more than the saving
    assert plan_resizes([job(size=4, base=4, rates=falls, run_s=0.0, cost=100.0)], {"v100": 0}, []) == ()


def test_grow_room_bounds_growth_to_its_own_node():
    (r,) = plan_resizes([job(grow_room=2)], {"v100": 6}, [])
    assert (r.old, r.new) == (2, 4)
    assert plan_resizes([job(grow_room=0)], {"v100": 6}, []) == ()


def test_a_shrink_for_a_waiting_job_says_what_it_costs():
    (r,) = plan_resizes([job(size=8)], {"v100": 0}, [Waiting(7, 4)])
    assert r.gain_s > 0 and r.cost_s == 30.0 and "waiting job 7" in r.reason  # what it is expected to lose
