"""The pure autoscaler (hsched/sched/autoscale.py) on hand-made sample sequences."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from hsched.sched.autoscale import Sample, ScaleDecision, ScaleMemo, ScalePolicy, decide

POLICY = ScalePolicy(min_replicas=1, max_replicas=10, target_concurrency=4.0, slo_p99_s=1.0)


def steady(
    conc: float, n: int, ready: int, *, t0: float = 0.0, arrivals: int = 10, p99: float | None = 0.3
) -> list[Sample]:
    return [Sample(t=t0 + i + 1, dt=1.0, concurrency=conc, arrivals=arrivals, p99_s=p99, ready=ready) for i in range(n)]


def drive(
    policy: ScalePolicy,
    seconds: int,
    conc: Callable[[float], float],
    *,
    arrivals: Callable[[float], int] = lambda t: 10,
    p99: Callable[[float], float | None] = lambda t: 0.3,
    start: int = 1,
    cold: int = 0,
) -> list[tuple[float, int, str]]:
    """A closed loop: each second a sample, then a decision; a replica asked for is ready `cold` s later."""
    samples: list[Sample] = []
    memo = ScaleMemo()
    current = start
    wanted_at: list[int] = []
    out = []
    for i in range(seconds):
        t = float(i + 1)
        wanted_at.append(current)
        ready = min(current, wanted_at[max(0, len(wanted_at) - 1 - cold)])
        samples.append(Sample(t=t, dt=1.0, concurrency=conc(t), arrivals=arrivals(t), p99_s=p99(t), ready=ready))
        samples = samples[-int(policy.stable_window_s) - 5 :]
        d = decide(policy, samples, t, current, memo, cold_start_s=float(cold))
        memo = d.memo
        current = d.wanted
        out.append((t, current, d.reason))
    return out


def test_steady_concurrency_over_target_and_the_reason_names_the_figures():
    d = decide(POLICY, steady(14.2, 60, ready=4), 60.0, 4, ScaleMemo())
    assert isinstance(d, ScaleDecision)
    assert d.wanted == 4
    assert d.reason == "concurrency 14.2 over 60 s, target 4 -> 4 replicas"


def test_rise_follows_the_load_up_to_its_figure():
    run = drive(POLICY, 240, lambda t: min(30.0, t / 4))  # 0 -> 30 in flight over 120 s, then flat
    wanted = [w for _, w, _ in run]
    assert all(b >= a for a, b in itertools.pairwise(wanted)), "a rising load never scales down"
    assert wanted[-1] == 8  # ceil(30 / 4)
    assert wanted[60] >= 3


def test_burst_enters_panic_and_scales_at_once():
    samples = steady(4.0, 54, ready=1) + steady(40.0, 6, ready=1, t0=54)
    d = decide(POLICY, samples, 60.0, 1, ScaleMemo())
    assert d.wanted == 10  # the panic window's 40 / 4, not the stable window's (4*54 + 40*6) / 60 = 7.6 -> 2
    assert d.reason.startswith("panic: concurrency 40.0 over 6 s needs 10 >= 2 x 1 ready")
    assert d.memo.panic_since == 60.0


def test_panic_never_scales_down_until_a_stable_window_passes():
    def conc(t: float) -> float:
        return 40.0 if 60 <= t < 70 else 4.0

    run = drive(POLICY, 200, conc)
    by_t = {t: w for t, w, _ in run}
    assert by_t[65] >= 8
    peak = max(by_t.values())
    # after the burst: no scale-down while panic holds (the condition was last seen within a stable window)
    assert all(by_t[t] == peak for t in range(70, 125))
    assert by_t[200] == 1  # and then down to what the load needs


def test_slow_decay_steps_down_without_flapping():
    def conc(t: float) -> float:
        base = max(2.0, 36.0 - t * 0.1)  # 36 -> 2 over 340 s
        return base + (1.5 if int(t) % 2 else -1.5)  # noise that would flap a naive rule

    run = drive(POLICY, 400, conc, start=9)
    wanted = [w for _, w, _ in run]
    ups = sum(1 for a, b in itertools.pairwise(wanted) if b > a)
    downs = [i for i, (a, b) in enumerate(itertools.pairwise(wanted)) if b < a]
    assert ups == 0
    assert wanted[-1] == 1
    assert all(b - a >= POLICY.scale_down_delay_s for a, b in itertools.pairwise(downs))
    holding = [r for _, _, r in run if "holding" in r]
    assert holding and "of 30 s delay" in holding[0]


def test_idle_goes_to_zero_and_an_arrival_wakes_one():
    pol = ScalePolicy(min_replicas=0, max_replicas=4, target_concurrency=4.0, slo_p99_s=1.0)

    def busy(t: float) -> bool:
        return t < 30 or t >= 200

    run = drive(pol, 220, lambda t: 2.0 if busy(t) else 0.0, arrivals=lambda t: 5 if busy(t) else 0, start=1)
    by_t = {t: (w, r) for t, w, r in run}
    assert by_t[60][0] == 1  # the window still saw requests
    zero = [t for t, (w, _) in by_t.items() if w == 0]
    assert zero and 30 + 60 <= zero[0] <= 30 + 60 + 31  # idle over a whole window, then the delay
    assert "idle: no request over 60 s -> 0 replicas" in by_t[zero[0]][1]
    assert by_t[199][0] == 0
    assert by_t[200][0] == 1
    assert by_t[200][1] == "5 arrival(s) while 0 ready -> wake 1 replica"


def test_min_one_never_goes_to_zero_and_max_clamps():
    pol = ScalePolicy(min_replicas=2, max_replicas=5, target_concurrency=4.0, slo_p99_s=1.0)
    quiet = decide(pol, steady(0.0, 120, ready=2, arrivals=0), 120.0, 2, ScaleMemo())
    assert quiet.wanted == 2
    flood = decide(pol, steady(400.0, 60, ready=5), 60.0, 5, ScaleMemo())
    assert flood.wanted == 5
    assert "clamped to [2, 5] -> 5" in flood.reason


def test_slo_check_adds_a_replica_before_the_p99_crosses():
    # concurrency asks for 3 (12 / 4) and 3 run, but the p99 is 0.9 s against a 1 s SLO (> 0.8 x 1 s)
    samples = steady(12.0, 60, ready=3, p99=0.9)
    d = decide(POLICY, samples, 60.0, 3, ScaleMemo())
    assert d.wanted == 4
    assert d.reason.startswith("p99 0.90 s > 0.8 x SLO 1 s -> +1")
    # while that replica is still starting (4 wanted, 3 ready), no second step
    again = decide(POLICY, samples + steady(12.0, 1, ready=3, t0=60, p99=0.9), 61.0, 4, d.memo)
    assert again.wanted == 4
    # once it is ready, not before a panic window has measured it, and the p99 still too high: one more
    soon = decide(POLICY, samples + steady(12.0, 2, ready=4, t0=60, p99=0.9), 62.0, 4, again.memo)
    assert soon.wanted == 4
    third = decide(POLICY, samples + steady(12.0, 6, ready=4, t0=60, p99=0.9), 66.0, 4, soon.memo)
    assert third.wanted == 5
    # a p99 under 0.8 x SLO adds nothing
    calm = decide(POLICY, steady(12.0, 60, ready=3, p99=0.7), 60.0, 3, ScaleMemo())
    assert calm.wanted == 3


def test_slo_step_is_given_back_after_a_calm_stable_window():
    run = drive(POLICY, 300, lambda t: 12.0, p99=lambda t: 0.9 if t < 20 else 0.2, start=3)
    by_t = {t: w for t, w, _ in run}
    assert max(by_t[t] for t in range(1, 20)) >= 4
    assert by_t[300] == 3


def test_scales_ahead_of_a_rising_arrival_rate_by_the_cold_start():
    # arrivals and concurrency rise together (latency 0.25 s each): 4/s -> 64/s over 60 s
    def rate(t: float) -> int:
        return int(4 + t)

    samples = [
        Sample(t=float(t), dt=1.0, concurrency=rate(t) * 0.25, arrivals=rate(t), p99_s=0.3, ready=3)
        for t in range(1, 61)
    ]
    plain = decide(POLICY, samples, 60.0, 3, ScaleMemo(), cold_start_s=0.0)
    ahead = decide(POLICY, samples, 60.0, 3, ScaleMemo(), cold_start_s=30.0)
    assert plain.wanted == 3  # avg concurrency 8.6 / 4
    assert ahead.wanted > plain.wanted
    assert ahead.reason.startswith("arrivals rising 64.5/s -> 94.5/s over 30 s cold start")
    falling = list(
        reversed(
            [
                Sample(t=61.0 - s.t, dt=1.0, concurrency=s.concurrency, arrivals=s.arrivals, p99_s=0.3, ready=3)
                for s in samples
            ]
        )
    )
    assert decide(POLICY, falling, 60.0, 3, ScaleMemo(), cold_start_s=30.0).wanted == 3


def test_a_noisy_flat_arrival_rate_is_no_trend_to_scale_ahead_of():
    # 50 arrivals/s +- Poisson-sized noise around a flat mean, concurrency 14 (4 replicas at 4): a least-squares
    # slope through the noise is positive about half the time, but not significant
    noise = [7, -5, 3, -8, 6, 1, -4, 9, -2, -6, 4, 8]
    samples = [Sample(t=float(i + 1), dt=1.0, concurrency=14.0, arrivals=50 + noise[i], p99_s=0.3, ready=4)
               for i in range(len(noise))]
    pol = ScalePolicy.for_window(1, 10, 4.0, 1.0, stable_window_s=12.0)
    d = decide(pol, samples, 12.0, 4, ScaleMemo(), cold_start_s=3.0)
    assert d.wanted == 4
    assert not d.reason.startswith("arrivals rising")
    rising = [Sample(t=s.t, dt=1.0, concurrency=14.0, arrivals=50 + 5 * int(s.t) + noise[i] // 2, p99_s=0.3,
                     ready=4) for i, s in enumerate(samples)]
    assert decide(pol, rising, 12.0, 4, ScaleMemo(), cold_start_s=3.0).reason.startswith("arrivals rising")


def test_one_large_request_is_not_an_slo_trend():
    # every sample's p99 is 0.3 s but the newest one's, whose largest request took 0.95 s
    samples = steady(12.0, 59, ready=3) + steady(12.0, 1, ready=3, t0=59, p99=0.95)
    assert decide(POLICY, samples, 60.0, 3, ScaleMemo()).wanted == 3
    samples = steady(12.0, 56, ready=3) + steady(12.0, 4, ready=3, t0=56, p99=0.95)
    assert decide(POLICY, samples, 60.0, 3, ScaleMemo()).wanted == 4  # most of the panic window's 6: a trend
    short = ScalePolicy.for_window(1, 10, 4.0, 1.0, stable_window_s=6.0)  # a 1-s panic window: 3 samples at least
    samples = steady(12.0, 4, ready=3) + steady(12.0, 2, ready=3, t0=4, p99=0.95)
    assert decide(short, samples, 6.0, 3, ScaleMemo()).wanted == 4


def test_slo_step_stays_while_the_p99_sits_between_the_lines():
    # p99 0.75 s against 1 s: under the check's 0.8 line (no step added), above the 0.7 line to give one back: the
    # step is what keeps it there (hysteresis)
    run = drive(POLICY, 200, lambda t: 12.0, p99=lambda t: 0.9 if t < 20 else 0.75, start=3)
    by_t = {t: w for t, w, _ in run}
    assert max(by_t[t] for t in range(1, 20)) >= 4
    assert by_t[200] == max(by_t[t] for t in range(1, 20))


def test_panic_held_says_so_and_names_the_window_figure():
    samples = steady(4.0, 54, ready=1) + steady(40.0, 6, ready=1, t0=54)
    d = decide(POLICY, samples, 60.0, 1, ScaleMemo())
    assert d.wanted == 10
    # ten replicas ready; the panic window needs 8 (30.7 / 4), under 2 x 10: panic holds, not by this figure
    later = steady(4.0, 50, ready=10, t0=10) + steady(36.0, 5, ready=10, t0=60)
    held = decide(POLICY, later, 65.0, 10, d.memo)
    assert held.wanted == 10
    assert held.reason == ("in panic since 60 s: concurrency 30.7 over 6 s -> 8 replicas; panic holds 10 (no "
                           "scale-down in panic)")
    assert ">=" not in held.reason


def test_for_window_scales_the_panic_window_and_the_delay_with_it():
    pol = ScalePolicy.for_window(1, 8, 4.0, 1.5, stable_window_s=6.0)
    assert (pol.stable_window_s, pol.panic_window_s, pol.scale_down_delay_s) == (6.0, 1.0, 3.0)
    default = ScalePolicy.for_window(1, 8, 4.0, 1.5)
    assert (default.stable_window_s, default.panic_window_s, default.scale_down_delay_s) == (60.0, 6.0, 30.0)
    assert default == ScalePolicy(1, 8, 4.0, 1.5)


def test_no_samples_keeps_the_current_count_within_bounds():
    assert decide(POLICY, [], 0.0, 0, ScaleMemo()).wanted == 1
    assert decide(POLICY, [], 0.0, 4, ScaleMemo()).wanted == 4


@pytest.mark.parametrize(
    ("kw", "word"),
    [
        ({"min_replicas": -1}, "min replicas"),
        ({"max_replicas": 0}, "max replicas"),
        ({"target_concurrency": 0}, "target concurrency"),
        ({"slo_p99_s": 0}, "SLO"),
        ({"panic_threshold": 0.5}, "panic threshold"),
    ],
)
def test_policy_problems_name_the_field(kw, word):
    base = {"min_replicas": 1, "max_replicas": 4, "target_concurrency": 2.0, "slo_p99_s": 1.0}
    base.update(kw)
    probs = ScalePolicy(**base).problems()
    assert len(probs) == 1 and word in probs[0]
    assert not ScalePolicy(1, 4, 2.0, 1.0).problems()
