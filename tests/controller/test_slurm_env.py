"""What a batch script written for Slurm reads (issue 29, item 9): sbatch's variables beside hsched's own. In-process
on a fake clock: the launch request's environment."""

from __future__ import annotations

import os
from pathlib import Path

from hsched.controller.api import Api
from hsched.testing import Lab


async def test_a_run_gets_sbatchs_variables(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        spec = {"command": ["sh", "-c", 'cd "$SLURM_SUBMIT_DIR"'], "workdir": str(tmp_path),
                "resources": {"gpus": 2, "cpus": 4, "tasks_per_node": 2}}
        job = await Api(lab.ctl).handle("submit", {"spec": spec}, os.getuid())
        await lab.round()
        runs = await lab.fake_runs(job["id"])
        assert len(runs) == 2  # one per task
        env = dict(runs[0].request.env)
        node = (await lab.job(job["id"])).placement[0].node
        assert env["SLURM_SUBMIT_DIR"] == str(tmp_path)  # `cd $SLURM_SUBMIT_DIR` went to $HOME without it
        assert env["SLURM_JOBID"] == env["SLURM_JOB_ID"] == str(job["id"])
        assert env["SLURM_JOB_NODELIST"] == env["SLURM_NODELIST"] == node
        assert (env["SLURM_NNODES"], env["SLURM_GPUS_ON_NODE"], env["SLURM_CPUS_PER_TASK"]) == ("1", "2", "2")
        assert env["SLURM_JOB_USER"] == job["user"]
