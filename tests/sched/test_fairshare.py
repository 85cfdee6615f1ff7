"""Fair share's pure parts (hsched.learn.fairshare): the decay, the folding ledger, shares and factors."""

from __future__ import annotations

import math

import pytest

from hsched.learn.fairshare import (
    Account,
    Ledger,
    RunUsage,
    Usage,
    decay_factor,
    decayed_gpu_seconds,
    policy_usage,
    run_usage,
    share_rows,
)

DAY = 86400.0
WEEK = 7 * DAY


def test_usage_one_half_life_old_counts_half_and_two_a_quarter() -> None:
    # one GPU for one second, a week ago (the default half-life): half a GPU-second
    assert decayed_gpu_seconds(1, 0.0, 1.0, WEEK + 1.0, WEEK) == pytest.approx(0.5, rel=1e-5)
    assert decayed_gpu_seconds(4, 0.0, 1.0, 2 * WEEK + 1.0, WEEK) == pytest.approx(1.0, rel=1e-5)
    # running right now: not decayed at all
    assert decayed_gpu_seconds(2, 100.0, 101.0, 101.0, WEEK) == pytest.approx(2.0, rel=1e-5)
    assert decay_factor(WEEK, WEEK) == 0.5 and decay_factor(3 * WEEK, 0) == 1.0


def test_the_closed_form_is_the_integral() -> None:
    """The exact formula against a fine Riemann sum of the decay weight over a long run."""
    start, end, now, h = 0.0, 3 * DAY, 10 * DAY, WEEK
    steps = 30000
    dt = (end - start) / steps
    numeric = sum(3 * 2 ** (-(now - (start + (k + 0.5) * dt)) / h) * dt for k in range(steps))
    assert decayed_gpu_seconds(3, start, end, now, h) == pytest.approx(numeric, rel=1e-6)


def test_no_decay_and_clock_skew() -> None:
    assert decayed_gpu_seconds(2, 0.0, 100.0, 10 * WEEK, 0.0) == 200.0  # half-life 0: raw GPU-seconds
    # an end after now (a node's clock ahead) counts up to now only
    assert decayed_gpu_seconds(1, 0.0, 200.0, 100.0, 0.0) == 100.0
    assert decayed_gpu_seconds(1, 50.0, 40.0, 100.0, WEEK) == 0.0


def direct(rows: list[RunUsage], now: float, h: float) -> dict[str, Usage]:
    out: dict[str, Usage] = {}
    for r in rows:
        out[r.user] = out.get(r.user, Usage()) + run_usage(r, now, h)
    return out


def test_the_ledger_folds_ended_runs_and_gives_what_a_full_recount_gives() -> None:
    h = 2 * DAY
    history = [
        RunUsage(1, "lab1", 1, 0.0, 3600.0),
        RunUsage(2, "lab2", 2, 100.0, None),  # still running at the first look
        RunUsage(3, "lab1", 4, 200.0, 7200.0),
        RunUsage(4, "lab1", 1, None, None),  # launching, not started
    ]
    led = Ledger(h)
    led, first = led.advance(history, 10_000.0)
    assert led.upto == 4 and led.open == frozenset({2, 4})
    assert first == pytest.approx(direct(history, 10_000.0, h))
    # later: run 2 ended, run 4 started and runs, run 5 is new; the ledger is handed only those
    later = [RunUsage(2, "lab2", 2, 100.0, 20_000.0), RunUsage(4, "lab1", 1, 15_000.0, None),
             RunUsage(5, "lab3", 1, 21_000.0, 25_000.0)]
    led, second = led.advance(later, 50_000.0)
    assert led.open == frozenset({4}) and led.upto == 5
    full = [history[0], later[0], history[2], later[1], later[2]]
    expected = direct(full, 50_000.0, h)
    assert set(second) == set(expected)
    for u in expected:
        assert second[u].raw_s == pytest.approx(expected[u].raw_s)
        assert second[u].decayed_s == pytest.approx(expected[u].decayed_s)
    # a clock stepped back never makes usage grow
    led2, third = led.advance([RunUsage(4, "lab1", 1, 15_000.0, None)], 40_000.0)
    assert third["lab2"].decayed_s == pytest.approx(second["lab2"].decayed_s)
    assert led2.as_of == 50_000.0


def test_shares_effective_usage_and_the_factor() -> None:
    usage = {"lab1": Usage(7200.0, 3600.0), "lab2": Usage(0.0, 0.0)}
    rows = {r.user: r for r in share_rows(["lab1", "lab2"], usage, {})}
    assert rows["lab1"].norm_shares == 0.5 and rows["lab1"].effective_usage == 1.0
    assert rows["lab1"].fairshare == pytest.approx(0.25)  # 2^(-1/0.5)
    assert rows["lab2"].fairshare == 1.0 and rows["lab2"].account == "lab2"  # an account of one
    # with no usage at all, everyone is at 1.0
    assert all(r.fairshare == 1.0 for r in share_rows(["a", "b"], {}, {}))


def test_accounts_split_the_lab_first_then_among_their_users() -> None:
    accounts = {"physics": Account("physics", ("p1", "p2")), "bio": Account("bio", ("b1",), shares=2)}
    usage = {"p1": Usage(100.0, 100.0), "b1": Usage(100.0, 100.0)}
    rows = {r.user: r for r in share_rows(["p1", "b1"], usage, accounts)}
    # every account member is listed even without jobs; physics has 1 of 3 shares, bio 2 of 3
    assert set(rows) == {"p1", "p2", "b1"}
    assert rows["p1"].norm_shares == pytest.approx(1 / 6) and rows["p2"].norm_shares == pytest.approx(1 / 6)
    assert rows["b1"].norm_shares == pytest.approx(2 / 3)
    assert rows["b1"].fairshare > rows["p1"].fairshare  # same usage, a larger share
    # the policy compares usage per share: b1's counts a quarter of p1's
    pu = policy_usage(rows.values())
    assert pu["b1"] == pytest.approx(pu["p1"] / 4)
    assert pu["p2"] == 0.0
    # with equal shares, the policy's number is the decayed usage itself
    eq = policy_usage(share_rows(["x", "y"], {"x": Usage(5.0, 3.0)}, {}))
    assert eq == {"x": 3.0, "y": 0.0}


def test_the_factor_is_one_half_at_exactly_the_share() -> None:
    rows = share_rows(["a", "b"], {"a": Usage(1.0, 1.0), "b": Usage(1.0, 1.0)}, {})
    assert [r.fairshare for r in rows] == [pytest.approx(0.5), pytest.approx(0.5)]
    assert math.isclose(sum(r.effective_usage for r in rows), 1.0)
