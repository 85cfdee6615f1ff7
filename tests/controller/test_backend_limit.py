"""A backend with a time limit of its own (Slurm's --time) gets the job's limit past hsched's whole stop, so
hsched's signal, grace and kill always come first; a job without a limit gives none."""

from __future__ import annotations

from pathlib import Path

from hsched.config import Settings
from hsched.testing import Lab


async def test_the_limit_handed_to_a_backend_is_past_hscheds_own_stop(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, settings=Settings(kill_after_s=10.0)) as lab:
        limited = await lab.submit("train", time_limit_s=600.0, checkpoint_signal="USR1@45")
        free = await lab.submit("serve")
        await lab.round()
        reqs = {}
        for job in (limited, free):
            run = (await lab.runs(job.id))[0]
            reqs[job.id] = lab.executors[run.node].runs[run.run_dir].request
        assert reqs[limited.id].time_limit_s == 600.0 + 45.0 + 10.0 + 60.0
        assert reqs[free.id].time_limit_s is None
