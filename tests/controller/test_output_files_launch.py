"""What the controller asks the node for a job with sbatch's -o/-e (issue 16): the patterns expanded for each
run, and the files emptied only at the job's first start of a single task (a requeued run appends)."""

from __future__ import annotations

from pathlib import Path

from hsched.executors.base import LaunchRequest

from hsched.controller import commands
from hsched.model import JobSpec, Resources
from hsched.testing import Lab


async def _request(lab: Lab, job_id: int, attempt: int = -1) -> LaunchRequest:
    run = (await lab.runs(job_id))[attempt]
    return lab.executors[run.node].runs[run.run_dir].request


async def test_the_node_gets_the_expanded_files_and_a_requeued_run_appends(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        spec = JobSpec(command=("true",), name="train", resources=Resources(gpus=1),
                       output="logs/%x-%j.%u.%N.out", error="%j.err")
        job = await commands.submit(lab.ctl, spec, "ada", None)
        plain = await lab.submit("true")
        await lab.round()
        first = await _request(lab, job.id)
        node = (await lab.runs(job.id))[0].node
        assert (first.output, first.error) == (f"logs/train-{job.id}.ada.{node}.out", f"{job.id}.err")
        assert first.truncate_output is True  # sbatch empties them at the start
        none = await _request(lab, plain.id)
        assert (none.output, none.error) == (None, None)  # no -o: the run folder's log only, as before
        await lab.finish(job.id, exit_code=0)
        await lab.round()
        await commands.requeue(lab.ctl, job.id)
        await lab.round()
        again = await _request(lab, job.id)
        assert again.run_dir != first.run_dir and again.output == first.output
        assert again.truncate_output is False  # the second attempt must not wipe the first one's output


async def test_ranks_sharing_a_file_never_empty_it(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        spec = JobSpec(command=("true",), resources=Resources(gpus=1, tasks_per_node=2), output="r%t-%j.out")
        job = await commands.submit(lab.ctl, spec, "ada", None)
        await lab.round()
        reqs = [lab.executors[r.node].runs[r.run_dir].request for r in await lab.runs(job.id)]
        assert sorted(r.output or "" for r in reqs) == [f"r0-{job.id}.out", f"r1-{job.id}.out"]
        assert not any(r.truncate_output for r in reqs)


async def test_open_mode_append_never_empties_them(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        spec = JobSpec(command=("true",), resources=Resources(gpus=1), output="%j.out", output_append=True)
        job = await commands.submit(lab.ctl, spec, "ada", None)
        await lab.round()
        req = await _request(lab, job.id)
        assert req.output == f"{job.id}.out" and req.truncate_output is False
