"""Pokes close together make one scheduling round (issue 18): a client submitting job after job pokes the loop at
every submit, and a round per submit held single submits to 77-182 jobs/s. A poke after a quiet spell still gets
its round at once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hsched.controller import loops
from hsched.controller.core import Controller
from hsched.testing import Lab
from tests.controller.conftest import until


async def test_a_burst_of_pokes_waits_for_one_round_and_a_poke_after_quiet_runs_one_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rounds: list[int] = []
    waits: list[float] = []
    gate = asyncio.Event()

    async def round_(ctl: Controller) -> bool:
        rounds.append(1)
        return False

    async def held(event: asyncio.Event, seconds: float) -> None:
        # the pause between rounds, held until the test lets it end (real time would make this test timed)
        waits.append(seconds)
        await gate.wait()

    monkeypatch.setattr(loops, "one_round", round_)
    monkeypatch.setattr(loops, "wait_at_most", held)
    monkeypatch.setattr(loops, "ROUND_GAP_S", 3600.0)
    async with Lab.open(tmp_path) as lab:
        ctl = lab.ctl
        ctl.ready.set()
        task = asyncio.create_task(loops.run_loop(ctl))
        ctl.poke()
        await until(lambda: rounds)
        assert waits == []  # the first poke after a quiet spell: no pause before its round
        for _ in range(20):  # a burst: the loop wakes at the first poke, then waits out the gap
            ctl.poke()
            for _ in range(5):
                await asyncio.sleep(0)
        assert len(rounds) == 1 and len(waits) == 1
        assert 3599.0 < waits[0] <= 3600.0
        gate.set()
        await until(lambda: len(rounds) == 2)  # the whole burst: one round
        for _ in range(50):
            await asyncio.sleep(0)
        # every poke of the burst came before that round: nothing is left to wake the loop (the fake clock does
        # not move, so no poll comes either)
        assert len(rounds) == 2 and not ctl.wake.is_set()
        ctl.stopping.set()
        ctl.poke()
        await task


async def test_the_gap_is_at_least_as_long_as_the_round_took(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow round (a big queue) leaves as much time again to requests before the next poked round."""
    waits: list[float] = []
    rounds: list[int] = []

    now = [100.0]
    monkeypatch.setattr(loops, "_pace_clock", lambda: now[0])

    async def slow_round(ctl: Controller) -> bool:
        rounds.append(1)
        now[0] += 10.0  # the round takes 10 s on the clock that paces rounds
        return False

    async def held(event: asyncio.Event, seconds: float) -> None:
        waits.append(seconds)
        await event.wait()

    monkeypatch.setattr(loops, "one_round", slow_round)
    monkeypatch.setattr(loops, "wait_at_most", held)
    async with Lab.open(tmp_path) as lab:
        ctl = lab.ctl
        ctl.ready.set()
        task = asyncio.create_task(loops.run_loop(ctl))
        ctl.poke()
        await until(lambda: rounds)
        ctl.poke()
        await until(lambda: waits)
        assert waits == [10.0]  # not ROUND_GAP_S: the round took 10 s
        ctl.stopping.set()
        await task
