"""Retries, end times from the node's exit record, OOM, dirty GPUs and the reach of signals, in-process
(hsched.testing.Lab): a real store, fake nodes, a fake clock."""

from __future__ import annotations

from pathlib import Path

from hsched.config import Settings
from hsched.model import EndReason, GpuHolder, JobState, RunState
from hsched.testing import CannedNode, Lab

ONE_NODE = (CannedNode("a", "NVIDIA A100-SXM4-80GB", 1),)


async def test_retries_2_on_a_job_that_exits_1_gives_exactly_3_runs_with_backoff_across_a_restart(
        tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("sh", "-c", "exit 1", retries=2)
        await lab.round()
        await lab.finish(job.id, 1)
        await lab.round()
        j = await lab.job(job.id)
        assert (j.state, j.reason, j.failures) == (JobState.PENDING, EndReason.RETRY_BACKOFF, 1)
        assert j.begin_time == lab.clock.time() + 10.0
        # the backoff holds it: a round 9 s later considers it and leaves it waiting
        await lab.advance(9.0)
        assert len(await lab.runs(job.id)) == 1 and (await lab.job(job.id)).reason == EndReason.RETRY_BACKOFF
        await lab.advance(1.0)
        assert len(await lab.runs(job.id)) == 2
        await lab.finish(job.id, 1)
        await lab.round()
        second_wait = (await lab.job(job.id)).begin_time
        assert second_wait == lab.clock.time() + 20.0
    # a new controller over the same store: the count and the backoff survive
    async with Lab.open(tmp_path, clock=lab.clock) as lab:
        j = await lab.job(job.id)
        assert (j.state, j.failures, j.begin_time) == (JobState.PENDING, 2, second_wait)
        await lab.advance(19.0)
        assert len(await lab.runs(job.id)) == 2
        await lab.advance(1.0)
        assert len(await lab.runs(job.id)) == 3
        await lab.finish(job.id, 1)
        await lab.round()
        j = await lab.job(job.id)
        assert (j.state, j.reason, j.exit_code) == (JobState.FAILED, EndReason.NONZERO_EXIT, 1)
        events = await lab.ctl.db(lab.ctl.store.events, job.id)
        retries = [e for e in events if e["kind"] == "retry"]
        assert [e["message"].split("; ")[-1] for e in retries] == ["retry 1 of 2 in 10 s", "retry 2 of 2 in 20 s"]
        assert "no retries left (2 used)" in events[-1]["message"]
        assert len(await lab.runs(job.id)) == 3


async def test_a_fatal_exit_code_and_a_checkpoint_loop_end_the_job(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, settings=Settings(retries=5, max_restarts=1)) as lab:
        job = await lab.submit("nosuchprogram")
        await lab.round()
        await lab.finish(job.id, 127)
        await lab.round()
        assert (await lab.job(job.id)).state is JobState.FAILED and len(await lab.runs(job.id)) == 1
        loop = await lab.submit("train")
        for _ in range(2):
            await lab.round()
            await lab.finish(loop.id, 85)
        await lab.round()
        j = await lab.job(loop.id)
        assert (j.state, j.reason, j.checkpoints) == (JobState.FAILED, EndReason.MAX_RESTARTS, 1)


async def test_a_run_lost_on_its_node_is_retried_under_the_same_budget(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("train", retries=1)
        await lab.round()
        [run] = await lab.runs(job.id)
        del lab.executors[run.node].runs[run.run_dir]  # the node no longer knows it: lost on reattach
        await lab.round()
        j = await lab.job(job.id)
        assert (j.state, j.reason, j.failures) == (JobState.PENDING, EndReason.RETRY_BACKOFF, 1)
        assert (await lab.runs(job.id))[0].state is RunState.LOST


async def test_end_time_and_exit_code_come_from_the_exit_record_not_from_noticing(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("train")
        await lab.round()
        started = (await lab.job(job.id)).start_time
        assert started is not None
        ended = lab.clock.time() + 5.0
        await lab.finish(job.id, 3, end_time=ended)
        lab.clock.advance(60.0)  # the controller was away for a minute
        await lab.round()
        j = await lab.job(job.id)
        [run] = await lab.runs(job.id)
        assert (j.state, j.exit_code, j.end_time, run.end_time) == (JobState.FAILED, 3, ended, ended)
        # a node clock ahead of ours cannot put an end in the future
        job2 = await lab.submit("train")
        await lab.round()
        await lab.finish(job2.id, 0, end_time=lab.clock.time() + 3600)
        await lab.round()
        assert (await lab.job(job2.id)).end_time == lab.clock.time()


async def test_an_oom_kill_is_reason_oom(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("train", memory_mib=1024, cpus=2)
        await lab.round()
        [fake] = await lab.fake_runs(job.id)
        assert (fake.request.memory_mib, fake.request.cpu_limit) == (1024, 2.0)
        await lab.finish(job.id, 137, oom=True)
        await lab.round()
        j = await lab.job(job.id)
        [run] = await lab.runs(job.id)
        assert (j.state, j.reason, run.reason) == (JobState.FAILED, EndReason.OOM, EndReason.OOM)


async def test_a_gpu_still_used_after_a_run_is_dirty_until_the_process_is_gone(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=ONE_NODE) as lab:
        first = await lab.submit("train", gpus=1)
        await lab.round()
        [run] = await lab.runs(first.id)
        [uuid] = run.devices
        ex = lab.executors["a"]
        ex.processes = [{"uuid": uuid, "pid": 4242, "name": "python3", "job_run_dir": run.run_dir}]
        await lab.finish(first.id, 0, gpu_left=[GpuHolder(uuid, 4242, "python3")])
        second = await lab.submit("train", gpus=1)
        await lab.round()
        assert (await lab.job(second.id)).state is JobState.PENDING
        events = await lab.ctl.db(lab.ctl.store.events)
        [dirty] = [e for e in events if e["kind"] == "gpu_dirty"]
        assert "pid 4242 (python3)" in dirty["message"] and dirty["node"] == "a"
        await lab.advance(30.0)
        assert (await lab.job(second.id)).state is JobState.PENDING  # still there: still dirty
        ex.processes = []
        await lab.round()
        assert (await lab.job(second.id)).state is JobState.RUNNING
        assert "gpu_clean" in [e["kind"] for e in await lab.ctl.db(lab.ctl.store.events)]


async def test_signals_reach_every_process_unless_batch_only(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        tree = await lab.submit("bash", "-c", "python3 train.py; true", checkpoint_signal="USR1@60")
        batch = await lab.submit("bash", "-c", "python3 train.py; true", checkpoint_signal="B:USR1@60")
        await lab.round()
        from hsched.controller import commands

        await commands.preempt(lab.ctl, tree.id)
        await commands.preempt(lab.ctl, batch.id)
        [t] = await lab.fake_runs(tree.id)
        [b] = await lab.fake_runs(batch.id)
        assert (t.signalled_all, t.signalled_batch) == (["USR1"], [])
        assert (b.signalled_all, b.signalled_batch) == ([], ["USR1"])
        await lab.advance(61.0)
        assert b.signalled_all[:1] == ["TERM"]  # the escalation reaches everything
