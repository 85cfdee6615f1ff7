"""The simulator's policy, live (issue 14, item 5): a job that proved it checkpoints moves to a faster GPU that
frees, only when the expected gain pays for its checkpoint and restart; the new GPU is held for it while it stops;
jobs that never checkpointed are never moved; equals of a QoS class time-share by least attained service, with a
minimum run time between stops. In-process, on a fake clock."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

from hsched.config import Settings
from hsched.controller import learning, moves
from hsched.controller.api import Api
from hsched.controller.launching import job_cache
from hsched.controller.metrics import recorder
from hsched.model import Job, JobState
from hsched.sched.live import gpu_type_of
from hsched.testing import CannedNode, Lab
from tests.controller.test_learning import progress

FLEET = (CannedNode("fast", "NVIDIA H100 80GB HBM3", 1), CannedNode("slow", "NVIDIA A100-SXM4-80GB", 1))
H100, A100 = gpu_type_of("NVIDIA H100 80GB HBM3"), gpu_type_of("NVIDIA A100-SXM4-80GB")
SETTINGS = Settings(move_min_run_s=600.0, move_cost_s=60.0)


async def report(lab: Lab, job_id: int, step: float, total: float | None) -> None:
    """The job's live run reports `step` of `total` now (as its node's monitoring stream carries it)."""
    (run,) = [r for r in await lab.runs(job_id) if r.state.is_live()]
    await lab.ctl.db(job_cache(lab.ctl).read, lab.ctl.store)
    learning.observe(lab.ctl, lab.ctl.nodes[run.node], progress(run.run_dir, lab.clock.time(), step, total),
                     lab.clock.time(), job_cache(lab.ctl).last)


async def node_of(lab: Lab, job_id: int) -> str:
    job = await lab.job(job_id)
    assert job.state is JobState.RUNNING, job
    return job.placement[0].node


async def proven_on_slow(lab: Lab, *, total: float, speed: float = 10.0) -> int:
    """A blocker holds the H100; a job of kind `k` starts on the A100, checkpoints on its own (exit 85: proof that
    it resumes), starts again there and reports progress at `speed` steps/s for `move_min_run_s`."""
    blocker = await lab.submit("python3", "other.py", gpus=1, kind="blocker")
    await lab.round()
    assert await node_of(lab, blocker.id) == "fast"
    job = await lab.submit("python3", "train.py", gpus=1, kind="k")
    await lab.round()
    assert await node_of(lab, job.id) == "slow"
    await lab.finish(job.id, 85)
    await lab.round()
    await lab.round()
    assert await node_of(lab, job.id) == "slow" and (await lab.job(job.id)).restarts == 1
    step = 0.0
    for _ in range(int(SETTINGS.move_min_run_s // 100) + 1):
        await report(lab, job.id, step, total)
        lab.clock.advance(100.0)
        step += 100.0 * speed
    await report(lab, job.id, step, total)
    lab.clock.advance(learning.MODEL_EVERY_S)
    await lab.finish(blocker.id, 0)
    return job.id


async def test_a_proven_job_moves_to_the_faster_gpu_that_frees_and_it_is_held_for_it(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=FLEET, settings=SETTINGS) as lab:
        jid = await proven_on_slow(lab, total=200_000.0)  # ~19,300 s left at 10 steps/s: a move pays
        for ex in lab.executors.values():
            ex.exit_on_signal.pop("TERM")  # it takes its time to checkpoint
        await lab.round()
        job = await lab.job(jid)
        assert job.state is JobState.PREEMPTING
        assert "move" in await lab.events(jid)
        # meanwhile another job arrives: the H100 is held for the moving job, the A100 is still its
        other = await lab.submit("python3", "other.py", gpus=1, kind="blocker")
        await lab.round()
        assert (await lab.job(other.id)).state is JobState.PENDING
        # it checkpoints (exit 85 on the signal) and starts again on the H100; the other job gets the A100
        assert any(s == "TERM" for r in await lab.fake_runs(jid) for s in r.signals)
        await lab.finish(jid, 85)
        await lab.round()
        await lab.round()
        assert await node_of(lab, jid) == "fast"
        assert await node_of(lab, other.id) == "slow"
        shown = await Api(lab.ctl).handle("show", {"id": jid}, os.getuid())
        (mv,) = shown["moves"]
        assert (mv["from"], mv["to"], mv["nodes"]) == (A100, H100, ["fast"])
        assert mv["gain_s"] > 2 * mv["cost_s"] > 0 and "expected to save" in mv["why"]
        assert shown["preemptions"]["count"] == 1
        assert recorder(lab.ctl).moves == 1  # hsched_moves_total
        from hsched.cli.jobs import _moves_line

        assert _moves_line(shown["moves"]).startswith(f"1: {A100} -> {H100} (to save ~")  # `hsched show`'s row


async def test_no_move_when_the_gain_does_not_pay_or_the_job_never_checkpointed(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=FLEET, settings=SETTINGS) as lab:
        # nearly done: 100 steps left (10 s at the A100's speed) cannot pay for a checkpoint and restart
        jid = await proven_on_slow(lab, total=7_100.0)
        await lab.round()
        assert await node_of(lab, jid) == "slow" and "move" not in await lab.events(jid)
    async with Lab.open(tmp_path / "2", nodes=FLEET, settings=SETTINGS) as lab:
        # a long job that never exited with the checkpoint code stays where it is, whatever it would gain
        blocker = await lab.submit("python3", "other.py", gpus=1, kind="blocker")
        await lab.round()
        job = await lab.submit("python3", "train.py", gpus=1, kind="k")
        await lab.round()
        assert await node_of(lab, job.id) == "slow"
        await report(lab, job.id, 0.0, 1e6)
        lab.clock.advance(2 * SETTINGS.move_min_run_s)
        await report(lab, job.id, 12_000.0, 1e6)
        await lab.finish(blocker.id, 0)
        await lab.round()
        await lab.round()
        assert await node_of(lab, job.id) == "slow" and "move" not in await lab.events(job.id)
    async with Lab.open(tmp_path / "3", nodes=FLEET, settings=Settings(moves=False, move_min_run_s=600.0)) as lab:
        # and with `moves = false` nobody moves
        jid = await proven_on_slow(lab, total=200_000.0)
        await lab.round()
        assert await node_of(lab, jid) == "slow"


async def test_equals_time_share_by_least_attained_service_after_the_minimum_run(tmp_path: Path) -> None:
    one = (CannedNode("n1", "NVIDIA A100-SXM4-80GB", 1),)
    async with Lab.open(tmp_path, nodes=one, settings=SETTINGS) as lab:
        for ex in lab.executors.values():
            ex.exit_on_signal.pop("TERM")  # the jobs take their time to checkpoint
        first = await lab.submit("python3", "a.py", gpus=1, kind="a")
        await lab.round()
        await lab.finish(first.id, 85)  # proves it checkpoints; starts again at once
        await lab.round()
        await lab.round()
        assert (await lab.job(first.id)).state is JobState.RUNNING
        second = await lab.submit("python3", "b.py", gpus=1, kind="b")
        stranger = await lab.submit("python3", "c.py", gpus=1, kind="c", priority=-1)
        await lab.advance(SETTINGS.move_min_run_s / 2)
        assert (await lab.job(first.id)).state is JobState.RUNNING  # before its minimum run: it keeps the GPU
        await lab.advance(SETTINGS.move_min_run_s / 2 + 1)
        assert (await lab.job(first.id)).state is JobState.PREEMPTING
        assert "preempts" in await lab.events(second.id)
        await lab.finish(first.id, 85)
        await lab.round()
        await lab.round()
        assert await node_of(lab, second.id) == "n1"
        # the first job waits with its attained service counted: it does not jump straight back
        assert moves.moves_of(lab.ctl).attained[first.id][1] >= SETTINGS.move_min_run_s
        await lab.advance(SETTINGS.move_min_run_s / 2)
        assert await node_of(lab, second.id) == "n1"
        # the second job never proved it checkpoints: it is never time-shared away, however long it runs
        await lab.advance(10 * SETTINGS.move_min_run_s)
        assert await node_of(lab, second.id) == "n1"
        await lab.finish(second.id, 0)
        await lab.round()
        await lab.round()
        assert await node_of(lab, first.id) == "n1"  # the least attained of those waiting, over the stranger
        assert (await lab.job(stranger.id)).state is JobState.PENDING


@contextlib.asynccontextmanager
async def two_stoppable_and_a_waiter(tmp_path: Path) -> AsyncIterator[tuple[Lab, Job, Job, Job]]:
    """Two GPUs held by two jobs that proved they checkpoint (and take their time to), and a third job that has
    waited past the move quantum: the round has just stopped one of the two for it."""
    two = (CannedNode("n2", "NVIDIA A100-SXM4-80GB", 2),)
    async with Lab.open(tmp_path, nodes=two, settings=SETTINGS) as lab:
        for ex in lab.executors.values():
            ex.exit_on_signal.pop("TERM")  # they take their time to checkpoint
        a = await lab.submit("python3", "a.py", gpus=1, kind="a")
        b = await lab.submit("python3", "b.py", gpus=1, kind="b")
        await lab.round()
        for j in (a, b):
            await lab.finish(j.id, 85)  # both prove they checkpoint
        await lab.round()
        await lab.round()
        waiter = await lab.submit("python3", "w.py", gpus=1, kind="w")
        await lab.advance(SETTINGS.move_min_run_s + 1)
        yield lab, a, b, waiter


async def test_one_waiting_job_stops_one_equal_not_one_per_round(tmp_path: Path) -> None:
    async with two_stoppable_and_a_waiter(tmp_path) as (lab, a, b, waiter):
        states = [(await lab.job(j.id)).state for j in (a, b)]
        assert sorted(states) == sorted([JobState.RUNNING, JobState.PREEMPTING])
        for _ in range(3):  # while its victim checkpoints, the waiter stops nobody else
            await lab.advance(5.0)
            assert sorted([(await lab.job(a.id)).state, (await lab.job(b.id)).state]) == sorted(states)
        assert (await lab.events(waiter.id)).count("preempts") == 1


def test_a_move_down_makes_room_for_a_job_that_gains_more_and_says_so() -> None:
    """The policy (the simulator's, tests/sim/test_checkpoint_policy.py) may move a job that checkpoints down to a
    free slower GPU so that a newcomer that gains far more gets the fast one: live, the mover stops with the slow
    GPU held for it, the newcomer waits for the fast one, and the move's event says why."""
    from hsched.config import SimulatedDevices
    from hsched.model import Job, JobSpec, Node, NodeState, Placement, Resources
    from hsched.sched.live import FleetView, Move, Running, Wait, schedule
    from hsched.sched.throughput import ThroughputModel
    from hsched.simulated import simulated_devices

    def node(name: str, model: str) -> Node:
        devices, links = simulated_devices(name, SimulatedDevices(model=model, count=1))
        return Node(name, "fake", NodeState.UP, cpus=16, memory_total_mib=64 << 10, devices=devices, links=links)

    fast, slow = node("fast", "NVIDIA H100 80GB HBM3"), node("slow", "NVIDIA A100-SXM4-80GB")
    # kind j runs nearly as fast on the A100; kind n ten times faster on the H100
    model = ThroughputModel({H100: {("j", 1): 10.0, ("n", 1): 100.0}, A100: {("j", 1): 9.0, ("n", 1): 10.0}})
    spec = JobSpec(command=("x",), resources=Resources(gpus=1), kind="j")
    j = Job(1, spec, "alice", JobState.RUNNING, "", 0.0, start_time=0.0,
            placement=(Placement("fast", (fast.devices[0].uuid,)),))
    n = Job(2, JobSpec(command=("y",), resources=Resources(gpus=1), kind="n"), "bob", JobState.PENDING, "", 50.0)
    fleet = FleetView((fast, slow), frozenset({fast.devices[0].uuid}), {}, running=(Running(j, 0.0),),
                      policy="hsched", throughput=model, movable={1: 30.0}, move_min_run_s=600.0)
    got = schedule(fleet, [n], 5000.0)
    (mv,) = [d for d in got if isinstance(d, Move)]
    assert (mv.job_id, mv.from_type, mv.to_type, mv.placements[0].node) == (1, H100, A100, "slow")
    assert "go to job 2, which gain more there" in mv.why
    assert [d for d in got if isinstance(d, Wait) and d.job_id == 2]  # it waits for the H100 to be released


async def test_a_restarted_controller_still_holds_the_moving_jobs_new_gpu(tmp_path: Path) -> None:
    """The devices a move promised were in the controller's memory only: a controller restarted while the job
    stopped gave the H100 to whoever came first. Now the `move` event holds them again."""
    async with Lab.open(tmp_path, nodes=FLEET, settings=SETTINGS) as lab:
        jid = await proven_on_slow(lab, total=200_000.0)
        for ex in lab.executors.values():
            ex.exit_on_signal.pop("TERM")
        await lab.round()
        assert (await lab.job(jid)).state is JobState.PREEMPTING
        # one that comes first for everything else (priority) arrives: the H100 is not its
        other = await lab.submit("python3", "other.py", gpus=1, kind="blocker", priority=100)
        await lab.round()
        assert (await lab.job(other.id)).state is JobState.PENDING
        await lab.finish(jid, 85)  # it checkpoints; the controller stops before it sees that
        clock = lab.clock
    # (without a policy the next controller serves by priority: the other job first, the H100 first in the fleet)
    async with Lab.open(tmp_path, nodes=FLEET, settings=replace(SETTINGS, policy=None), clock=clock) as lab:
        await lab.round()
        await lab.round()
        assert await node_of(lab, jid) == "fast"
        assert await node_of(lab, other.id) == "slow"
