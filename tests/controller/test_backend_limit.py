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


async def test_a_slurm_groups_jobs_outlive_a_long_slurmctld_outage(tmp_path: Path) -> None:
    """slurmctld away past the lease does not stop the jobs slurmd runs: nothing is requeued (it would run
    twice); Slurm's word on each job, once it answers, is what ends it."""
    from dataclasses import replace

    from hsched.model import JobState, NodeState, RunState
    from hsched.testing import CannedNode

    settings = Settings(heartbeat_timeout_s=15.0, lease_s=60.0)
    nodes = (CannedNode("a", "NVIDIA A100-SXM4-80GB", 4), CannedNode("b", "NVIDIA A100-SXM4-80GB", 4))
    async with Lab.open(tmp_path, nodes=nodes, settings=settings) as lab:
        for rt in lab.ctl.nodes.values():  # both Slurm groups (the transport stays the fake)
            rt.config = replace(rt.config, executor="slurm")
        job = await lab.submit("python", "train.py", gpus=4)
        await lab.round()
        [run] = await lab.runs(job.id)
        away = lab.executors[run.node]
        away.unreachable = True
        await lab.advance(16.0)
        assert lab.ctl.nodes[run.node].node.state is NodeState.UNREACHABLE
        await lab.advance(600.0)  # ten leases
        assert (await lab.job(job.id)).state is JobState.RUNNING
        assert [r.state for r in await lab.runs(job.id)] == [RunState.RUNNING]
        away.unreachable = False
        await lab.round()
        await lab.finish(job.id, 0)
        await lab.round()
        assert (await lab.job(job.id)).state is JobState.COMPLETED
