"""A time-sharing stop holds the stopped job's GPUs for the job it makes room for (issue 33): the simulator's stop and
start are one instant, but live the victim takes a while to checkpoint, and rounds run meanwhile. Before, the freed
GPUs went to whoever the next round ranked first, and the waiting job stopped a second and a third job for itself
(77 of a 60-job replay's 117 time-sharing stops). In-process, on a fake clock."""

from __future__ import annotations

from pathlib import Path

from hsched.controller import moves
from hsched.model import JobState
from hsched.testing import CannedNode, Lab
from tests.controller.test_moves import SETTINGS


async def test_the_stopped_jobs_gpu_goes_to_the_job_that_stopped_it(tmp_path: Path) -> None:
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
