"""The controller's stages in-process (hsched.testing.Lab): a real store, fake nodes, a fake clock.

Stop escalation, time limits, gang teardown, leases and fencing, requeues and holds, each in milliseconds:
the clock moves only when a test says so, and every absence is proven by a round that considered the job.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from hsched.config import Settings
from hsched.model import EndReason, JobState, NodeState, RunState
from hsched.testing import CannedNode, Lab


async def test_a_job_runs_and_completes(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("python", "train.py", gpus=2)
        await lab.round()
        job = await lab.job(job.id)
        assert job.state is JobState.RUNNING
        assert len(job.placement) == 1 and len(job.placement[0].devices) == 2
        [run] = await lab.runs(job.id)
        assert run.state is RunState.RUNNING and run.handle is not None
        await lab.finish(job.id, 0)
        await lab.round()
        job = await lab.job(job.id)
        assert (job.state, job.exit_code, job.reason) == (JobState.COMPLETED, 0, EndReason.COMPLETED)
        [run] = await lab.runs(job.id)
        assert run.state is RunState.COMPLETED
        assert await lab.events(job.id) == ["submitted", "placed", "started", "ended"]


async def test_cancel_escalates_from_term_to_kill_after_kill_after_s(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, settings=Settings(kill_after_s=10.0)) as lab:
        job = await lab.submit("python", "train.py")
        await lab.round()
        for ex in lab.executors.values():
            ex.exit_on_signal = {"KILL": 137}  # the job ignores SIGTERM
        from hsched.controller import commands

        await commands.cancel(lab.ctl, job.id)
        [fake] = await lab.fake_runs(job.id)
        assert fake.signals == ["TERM"]
        assert (await lab.job(job.id)).state is JobState.COMPLETING
        await lab.advance(9.9)
        assert fake.signals == ["TERM"]  # the round at 9.9 s considered the stop and sent nothing more
        await lab.advance(0.1)
        assert fake.signals == ["TERM", "KILL"]
        await lab.round()
        job = await lab.job(job.id)
        assert (job.state, job.exit_code) == (JobState.CANCELLED, 137)
        [run] = await lab.runs(job.id)
        assert run.state is RunState.CANCELLED


async def test_qos_preemption_checkpoint_signal_grace_then_escalation_then_resume(tmp_path: Path) -> None:
    one = (CannedNode("a", "NVIDIA A100-SXM4-80GB", 4),)
    async with Lab.open(tmp_path, nodes=one) as lab:
        low = await lab.submit("python", "train.py", gpus=4, checkpoint_signal="USR1@60")
        await lab.round()
        assert (await lab.job(low.id)).state is JobState.RUNNING
        for ex in lab.executors.values():
            ex.exit_on_signal = {"KILL": 137}  # deaf to USR1 and TERM: only SIGKILL ends it
        prod = await lab.submit("python", "serve.py", gpus=4, qos="prod")
        await lab.round()
        [fake] = await lab.fake_runs(low.id)
        assert fake.signals == ["USR1"]
        assert (await lab.job(low.id)).state is JobState.PREEMPTING
        assert (await lab.job(prod.id)).state is JobState.PENDING
        await lab.advance(59.0)
        assert fake.signals == ["USR1"]
        await lab.advance(1.0)
        assert fake.signals == ["USR1", "TERM"]
        await lab.advance(1.0)
        assert fake.signals == ["USR1", "TERM", "KILL"]
        await lab.round()  # the victim's end is seen, the prod job takes its GPUs
        low_now = await lab.job(low.id)
        assert (low_now.state, low_now.restarts) == (JobState.PENDING, 1)
        assert (await lab.job(prod.id)).state is JobState.RUNNING
        assert (await lab.runs(low.id))[0].state is RunState.PREEMPTED
        assert "preempted" in await lab.events(low.id)
        # the prod job ends: the preempted job resumes (attempt 2, HSCHED_RESUME=1)
        await lab.finish(prod.id, 0)
        await lab.round()
        await lab.round()
        resumed = await lab.job(low.id)
        assert resumed.state is JobState.RUNNING
        runs = await lab.runs(low.id)
        assert [r.attempt for r in runs] == [1, 2] and runs[0].state is RunState.PREEMPTED
        second = lab.executors["a"].runs[runs[1].run_dir].request
        assert second.env["HSCHED_RESUME"] == "1" and second.env["HSCHED_RESTART_COUNT"] == "1"


async def test_time_limit_warns_then_stops_as_timeout(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("python", "train.py", time_limit_s=100.0, warn="USR1@10",
                               checkpoint_signal="USR2@5")
        await lab.round()
        [fake] = await lab.fake_runs(job.id)
        await lab.advance(89.0)
        assert fake.signals == []
        await lab.advance(1.0)
        assert fake.signals == ["USR1"]
        assert "warning" in await lab.events(job.id)
        await lab.advance(10.0)
        assert fake.signals[:2] == ["USR1", "USR2"]
        await lab.advance(5.0)  # grace over: SIGTERM ends it (the fake exits 143 on TERM)
        await lab.round()
        job = await lab.job(job.id)
        assert (job.state, job.reason, job.exit_code) == (JobState.TIMEOUT, EndReason.TIMEOUT, 143)


async def test_a_failed_rank_tears_the_gang_down(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("torchrun", "train.py", gpus=4, nodes=2)
        await lab.round()
        runs = await lab.runs(job.id)
        assert sorted(r.node for r in runs) == ["a", "b"] and {r.world for r in runs} == {2}
        for ex in lab.executors.values():
            ex.exit_on_signal = {"KILL": 137}
        await lab.finish(job.id, 3, rank=0)
        await lab.round()
        other = next(f for f in await lab.fake_runs(job.id) if f.exit_code is None)
        assert other.signals == ["TERM"]
        assert (await lab.job(job.id)).state is JobState.COMPLETING
        await lab.advance(2.0)
        assert other.signals == ["TERM", "KILL"]
        await lab.round()
        job = await lab.job(job.id)
        # the first failure is the gang's cause
        assert (job.state, job.reason, job.exit_code) == (JobState.FAILED, EndReason.RANK_FAILED, 3)


async def test_checkpoint_exit_code_requeues_and_a_failure_is_final(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("python", "train.py")
        await lab.round()
        await lab.finish(job.id, 85)
        await lab.round()  # requeued, and started again in the same round
        after = await lab.job(job.id)
        assert (after.state, after.restarts) == (JobState.RUNNING, 1)
        assert "requeued" in await lab.events(job.id)
        await lab.finish(job.id, 1)
        await lab.round()
        job = await lab.job(job.id)
        assert (job.state, job.reason, job.exit_code) == (JobState.FAILED, EndReason.NONZERO_EXIT, 1)
        assert [r.state for r in await lab.runs(job.id)] == [RunState.CHECKPOINTED, RunState.EXITED]


async def test_a_held_job_is_considered_and_left_alone_until_released(tmp_path: Path) -> None:
    from hsched.controller import commands

    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("python", "train.py", hold=True)
        other = await lab.submit("python", "other.py")
        await lab.round()
        # the round that started the other job is the event proving the held one was passed over
        assert (await lab.job(other.id)).state is JobState.RUNNING
        assert (await lab.job(job.id)).state is JobState.PENDING
        assert await lab.runs(job.id) == []
        await commands.hold(lab.ctl, [job.id], False)
        await lab.round()
        assert (await lab.job(job.id)).state is JobState.RUNNING


async def test_lease_requeues_and_fencing_kills_the_stale_copy_on_return(tmp_path: Path) -> None:
    settings = Settings(heartbeat_timeout_s=15.0, lease_s=60.0)
    one = (CannedNode("a", "NVIDIA A100-SXM4-80GB", 4), CannedNode("b", "NVIDIA A100-SXM4-80GB", 4))
    async with Lab.open(tmp_path, nodes=one, settings=settings) as lab:
        job = await lab.submit("python", "train.py", gpus=4)
        await lab.round()
        [run] = await lab.runs(job.id)
        gone = lab.executors[run.node]
        gone.unreachable = True
        await lab.advance(16.0)
        assert lab.ctl.nodes[run.node].node.state is NodeState.UNREACHABLE
        # within the lease: the run is left alone on the node, the job still RUNNING
        await lab.advance(40.0)
        assert (await lab.job(job.id)).state is JobState.RUNNING
        await lab.advance(30.0)  # lease over: requeued and placed on the other node
        await lab.round()
        job_now = await lab.job(job.id)
        assert job_now.restarts == 1 and job_now.state is JobState.RUNNING
        assert job_now.placement[0].node != run.node
        first = (await lab.runs(job.id))[0]
        assert first.state is RunState.FENCING and first.reason == EndReason.NODE_LOST
        # the node returns: the stale copy is killed there before the node gets new work
        gone.unreachable = False
        await lab.round()
        assert gone.runs[run.run_dir].signals[-1] == "KILL"
        assert (await lab.runs(job.id))[0].state is RunState.FENCED
        assert lab.ctl.nodes[run.node].node.state is NodeState.UP


async def test_restart_mid_stop_hurries_the_escalation(tmp_path: Path) -> None:
    """A controller that finds a stop it did not decide sends the escalation at once (lifecycle.resumed_plan)."""
    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("python", "train.py", checkpoint_signal="USR1@600")
        await lab.round()
        for ex in lab.executors.values():
            ex.exit_on_signal = {"KILL": 137}
        from hsched.controller import commands

        await commands.preempt(lab.ctl, job.id)
        lab.ctl.stops.clear()  # what a restarted controller knows of the plan: nothing
        await lab.round()
        [fake] = await lab.fake_runs(job.id)
        assert fake.signals == ["USR1", "TERM", "KILL"]  # not 600 s of grace again


async def test_logs_of_a_run_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    from hsched.controller.api import Api
    from hsched.errors import UserError

    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("python", "train.py")
        api = Api(lab.ctl)
        with pytest.raises(UserError, match="has no run 1 \\(its runs: none yet\\)"):
            await api.op_logs({"id": job.id, "run": 1}, 0)
        await lab.round()
        [run] = await lab.runs(job.id)
        lab.executors[run.node].write_log(run.run_dir, b"hello\n")
        got = await api.op_logs({"id": job.id, "run": 1}, 0)
        assert got["run"] == 1 and base64.b64decode(got["data"]) == b"hello\n"
        with pytest.raises(UserError, match="has no run 99 \\(its runs: 1\\)"):
            await api.op_logs({"id": job.id, "run": 99}, 0)


async def test_cancel_of_an_ended_job_says_so_and_changes_nothing(tmp_path: Path) -> None:
    from hsched.controller import commands
    from hsched.errors import HschedError, UserError

    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("python", "train.py")
        await lab.round()
        await lab.finish(job.id, 0)
        await lab.round()
        before = (await lab.job(job.id), await lab.events(job.id))
        with pytest.raises(HschedError, match="already ended \\(COMPLETED\\); nothing to cancel") as err:
            await commands.cancel(lab.ctl, job.id)
        assert not isinstance(err.value, UserError)  # a refused operation (exit 1), not bad usage (exit 2)
        assert (await lab.job(job.id), await lab.events(job.id)) == before
