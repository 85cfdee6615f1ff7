"""An array task sent to a Slurm node group sees its SLURM_ARRAY_TASK_ID (issue 29, item 9): the executor dropped
every SLURM_ variable (Slurm sets its own), and Slurm sets no array variable for a job that is no Slurm array, so
the task read an empty one. Through the real Slurm test cluster (tests/slurm/cluster.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hsched.executors.slurm.executor import _passed

from hsched.model import RunStatus
from tests.slurm.cluster import SlurmCluster
from tests.slurm.conftest import executor, run
from tests.slurm.test_slurm_executor import request, until

ARRAY = {"SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "4",
         "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "3"}


def test_the_passed_environment_keeps_hscheds_array_and_nothing_else_of_slurms() -> None:
    env = {**ARRAY, "SLURM_JOB_ID": "43", "SLURM_NODELIST": "grp", "CUDA_VISIBLE_DEVICES": "x", "HSCHED_JOB_ID": "43"}
    assert _passed(env, ()) == {**ARRAY, "HSCHED_JOB_ID": "43"}


@pytest.mark.slow  # a real Slurm cluster
def test_an_array_task_on_a_slurm_group_sees_its_index(slurm: SlurmCluster, runs: Path) -> None:
    script = 'echo "task=$SLURM_ARRAY_TASK_ID of=$SLURM_ARRAY_JOB_ID n=$SLURM_ARRAY_TASK_COUNT job=$SLURM_JOB_ID"'

    async def main() -> None:
        ex = executor(slurm)
        await ex.probe()
        rd = runs / "43-1-r0"
        h = await ex.launch(request(rd, ("sh", "-c", script), job="43", env=ARRAY))
        rep = await until(ex, str(rd), h, RunStatus.EXITED)
        assert rep.exit_code == 0
        fields = dict(f.split("=", 1) for f in (await ex.read_log(str(rd), 0)).decode().split())
        # hsched's array; Slurm's own job id (the Slurm job is no array of Slurm's)
        assert (fields["task"], fields["of"], fields["n"]) == ("3", "40", "4")
        assert fields["job"] == str(h.pid)

    run(main())
