"""The scheduling round computes in a worker thread, without the controller's lock (issue 18): requests are
answered while it computes, and what changed meanwhile (a cancel, a hold, a drain, a victim that ended) is checked
before the round's decisions are applied, so a decision that no longer holds is dropped, never applied.

Each test stops the round's pure part in its thread after it has decided (a threading.Event), acts while it
waits, then lets it go: the waits are for events, never for time.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from hsched.controller import commands, launching
from hsched.controller.api import Api
from hsched.model import EndReason, Job, JobState, NodeState
from hsched.sched import live
from hsched.sched.live import Decision, FleetView, Launch, Preempt
from hsched.testing import CannedNode, Lab

WAIT_S = 30.0
"""Only a bound on a hang: every wait below ends on an event."""


class Paused:
    """Replaces the round's pure function: it decides, says so, and returns only when let go."""

    def __init__(self) -> None:
        self.decided = threading.Event()
        self.go = threading.Event()
        self.thread: str | None = None
        self.decisions: list[Decision] = []

    def __call__(self, view: FleetView, pending: Sequence[Job], now: float,
                 cache: live.RoundCache | None = None) -> list[Decision]:
        self.decisions = live.schedule(view, pending, now, cache=cache)
        self.thread = threading.current_thread().name
        self.decided.set()
        if not self.go.wait(WAIT_S):
            raise TimeoutError("the test never let the round go")
        return self.decisions


@asynccontextmanager
async def paused_round(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Paused]:
    """A round running in the background, paused after its decisions; it completes when the block ends."""
    paused = Paused()
    monkeypatch.setattr(launching, "schedule", paused)
    task = asyncio.create_task(lab.round())
    try:
        await asyncio.wait_for(asyncio.to_thread(paused.decided.wait, WAIT_S), WAIT_S)
        yield paused
    finally:
        paused.go.set()
        async with asyncio.timeout(WAIT_S):
            await task
        monkeypatch.setattr(launching, "schedule", live.schedule)


async def test_requests_are_answered_while_a_round_computes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with Lab.open(tmp_path) as lab:
        api = Api(lab.ctl)
        uid = os.getuid()
        first = await lab.submit("x", gpus=2)
        async with paused_round(lab, monkeypatch) as paused:
            assert paused.thread is not None and paused.thread.startswith("hsched-round")
            assert not lab.ctl.lock.locked()  # the lock is not held while the round computes
            async with asyncio.timeout(WAIT_S):
                assert (await api.handle("ping", {}, uid))["pid"] == os.getpid()
                assert [j["id"] for j in await api.handle("queue", {}, uid)] == [first.id]
                # a submit takes the lock: it goes through while the round waits
                second = await api.handle("submit", {"spec": {"command": ["y"], "resources": {"gpus": 1}}}, uid)
            assert [type(d).__name__ for d in paused.decisions] == ["Launch"]
        # the round applied what it decided; the job submitted meanwhile waits for the next round
        assert (await lab.job(first.id)).state is JobState.RUNNING
        assert (await lab.job(second["id"])).state is JobState.PENDING
        await lab.round()
        assert (await lab.job(second["id"])).state is JobState.RUNNING


async def test_a_job_cancelled_while_the_round_computed_is_not_launched(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    async with Lab.open(tmp_path) as lab:
        gone = await lab.submit("x", gpus=4)
        kept = await lab.submit("y", gpus=4)
        async with paused_round(lab, monkeypatch) as paused:
            assert {d.job_id for d in paused.decisions if isinstance(d, Launch)} == {gone.id, kept.id}
            await commands.cancel(lab.ctl, gone.id)
        job = await lab.job(gone.id)
        assert (job.state, job.reason) == (JobState.CANCELLED, EndReason.CANCELLED)
        assert await lab.runs(gone.id) == []
        assert sum(len(ex.runs) for ex in lab.executors.values()) == 1  # the nodes started only the other job
        assert (await lab.job(kept.id)).state is JobState.RUNNING  # the other decision still held


async def test_a_job_held_while_the_round_computed_is_not_launched(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    async with Lab.open(tmp_path) as lab:
        held = await lab.submit("x", gpus=4)
        async with paused_round(lab, monkeypatch) as paused:
            assert [type(d) for d in paused.decisions] == [Launch]
            await commands.hold(lab.ctl, [held.id], True)
        job = await lab.job(held.id)
        assert job.spec.hold and job.state is JobState.PENDING and job.reason == EndReason.HELD
        assert await lab.runs(held.id) == []
        await commands.hold(lab.ctl, [held.id], False)
        await lab.round()
        assert (await lab.job(held.id)).state is JobState.RUNNING


async def test_a_node_drained_while_the_round_computed_gets_no_launch(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("x", gpus=4)
        async with paused_round(lab, monkeypatch) as paused:
            [launch] = paused.decisions
            assert isinstance(launch, Launch)
            node = launch.placements[0].node
            await Api(lab.ctl).handle("node_admin", {"name": node, "action": "drain", "reason": "fan"}, os.getuid())
            assert lab.ctl.nodes[node].node.state is NodeState.DRAINED
        assert (await lab.job(job.id)).state is JobState.PENDING
        assert await lab.runs(job.id) == []
        # the next round sees the drained node and starts the job on the other one
        await lab.round()
        job = await lab.job(job.id)
        assert job.state is JobState.RUNNING and job.placement[0].node != node


async def test_a_preemption_whose_victim_ended_meanwhile_is_not_applied(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = (CannedNode("a", "NVIDIA A100-SXM4-80GB", 4),)
    async with Lab.open(tmp_path, nodes=nodes) as lab:
        victim = await lab.submit("x", gpus=4, qos="scavenger")
        await lab.round()
        assert (await lab.job(victim.id)).state is JobState.RUNNING
        urgent = await lab.submit("y", gpus=4, qos="prod")
        async with paused_round(lab, monkeypatch) as paused:
            [pre] = paused.decisions
            assert isinstance(pre, Preempt) and pre.victims == (victim.id,)
            await commands.cancel(lab.ctl, victim.id)  # the victim is being stopped already, for another reason
        assert (await lab.job(victim.id)).reason == EndReason.CANCELLED  # not overwritten with preemption
        [fake] = await lab.fake_runs(victim.id)
        assert fake.signals == ["TERM"]  # the cancel's signal only
        assert "preempts" not in await lab.events(urgent.id)
        # once the cancelled job is gone, the urgent one starts on its devices
        await lab.finish(victim.id, 143)
        await lab.round()
        await lab.round()
        assert (await lab.job(urgent.id)).state is JobState.RUNNING


async def test_a_preemptor_cancelled_meanwhile_stops_no_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = (CannedNode("a", "NVIDIA A100-SXM4-80GB", 4),)
    async with Lab.open(tmp_path, nodes=nodes) as lab:
        victim = await lab.submit("x", gpus=4, qos="scavenger")
        await lab.round()
        urgent = await lab.submit("y", gpus=4, qos="prod")
        async with paused_round(lab, monkeypatch) as paused:
            assert [type(d) for d in paused.decisions] == [Preempt]
            await commands.cancel(lab.ctl, urgent.id)
        assert (await lab.job(victim.id)).state is JobState.RUNNING
        [fake] = await lab.fake_runs(victim.id)
        assert fake.signals == []


async def test_lab_rounds_stay_whole_and_deterministic(tmp_path: Path) -> None:
    """`lab.round()` still completes a whole round (decide, apply, launch) before it returns."""
    async with Lab.open(tmp_path) as lab:
        jobs = [await lab.submit("x", gpus=g) for g in (4, 2, 2, 4)]
        await lab.round()
        states = [(await lab.job(j.id)).state for j in jobs]
        assert states == [JobState.RUNNING, JobState.RUNNING, JobState.RUNNING, JobState.PENDING]
        assert [len(await lab.fake_runs(j.id)) for j in jobs] == [1, 1, 1, 0]
