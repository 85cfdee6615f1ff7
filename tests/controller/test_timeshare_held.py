"""A time-sharing stop holds the stopped job's GPUs for the job it makes room for (issue 33): the simulator's stop and
start are one instant, but live the victim takes a while to checkpoint, and rounds run meanwhile. Before, the freed
GPUs went to whoever the next round ranked first, and the waiting job stopped a second and a third job for itself
(77 of a 60-job replay's 117 time-sharing stops). In-process, on a fake clock."""

from __future__ import annotations

from pathlib import Path

from hsched.controller import moves
from hsched.model import JobState
from tests.controller.test_moves import two_stoppable_and_a_waiter


async def test_the_stopped_jobs_gpu_goes_to_the_job_that_stopped_it(tmp_path: Path) -> None:
    async with two_stoppable_and_a_waiter(tmp_path) as (lab, a, b, waiter):
        (victim,) = [j for j in (a, b) if (await lab.job(j.id)).state is JobState.PREEMPTING]
        devices = (await lab.job(victim.id)).placement
        assert moves.moves_of(lab.ctl).held[waiter.id][0] == devices  # held for the waiter while the victim stops
        # a job its user ranks first arrives while the victim checkpoints: the victim's GPU is still the waiter's
        urgent = await lab.submit("python3", "u.py", gpus=1, kind="u", priority=5)
        await lab.advance(1.0)
        await lab.finish(victim.id, 85)
        await lab.round()
        await lab.round()
        started = await lab.job(waiter.id)
        assert started.state is JobState.RUNNING and started.placement == devices
        assert (await lab.job(urgent.id)).state is JobState.PENDING
        assert (await lab.events(waiter.id)).count("preempts") == 1
        assert waiter.id not in moves.moves_of(lab.ctl).held  # started: nothing held any more
