"""sbatch's --dependency (issue 16): the pure rules, then in-process on the controller (hsched.testing.Lab)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hsched.errors import UserError
from hsched.model import DepKind, EndReason, Job, JobSpec, JobState
from hsched.spec.dependencies import DepState, parse_dependency, verdict
from hsched.testing import Lab


def job(jid: int, state: JobState, *, dep: str = "", name: str = "j", started: bool = False) -> Job:
    deps, any_of = parse_dependency(dep) if dep else ((), False)
    return Job(id=jid, spec=JobSpec(command=("x",), name=name, dependency=deps, dependency_any=any_of),
               user="u", state=state, reason="", submit_time=0.0, start_time=1.0 if started else None)


def test_parse() -> None:
    deps, any_of = parse_dependency("afterok:12:13,afterany:14,singleton")
    assert [(d.kind, d.job_ids) for d in deps] == [(DepKind.AFTEROK, (12, 13)), (DepKind.AFTERANY, (14,)),
                                                   (DepKind.SINGLETON, ())]
    assert not any_of and parse_dependency("afterok:1?afternotok:2")[1]
    for bad in ("", "afterok", "afterok:x", "before:1", "afterok:1,afterany:2?after:3"):
        with pytest.raises(ValueError):
            parse_dependency(bad)


@pytest.mark.parametrize(("dep", "other", "expect"), [
    ("afterok:1", JobState.RUNNING, DepState.WAITING),
    ("afterok:1", JobState.COMPLETED, DepState.SATISFIED),
    ("afterok:1", JobState.FAILED, DepState.NEVER),
    ("afternotok:1", JobState.FAILED, DepState.SATISFIED),
    ("afternotok:1", JobState.COMPLETED, DepState.NEVER),
    ("afternotok:1", JobState.PENDING, DepState.WAITING),
    ("afterany:1", JobState.CANCELLED, DepState.SATISFIED),
    ("afterany:1", JobState.RUNNING, DepState.WAITING),
    ("after:1", JobState.PENDING, DepState.WAITING),
    ("afterok:1?afternotok:1", JobState.FAILED, DepState.SATISFIED),
    ("afterok:1,afternotok:1", JobState.FAILED, DepState.NEVER),
    ("afterok:2", JobState.COMPLETED, DepState.NEVER),  # no job 2
])
def test_verdicts(dep: str, other: JobState, expect: DepState) -> None:
    assert verdict(job(9, JobState.PENDING, dep=dep), {1: job(1, other)}, set()).state is expect


def test_after_means_started_and_singleton_means_no_namesake_running() -> None:
    assert verdict(job(9, JobState.PENDING, dep="after:1"), {1: job(1, JobState.RUNNING, started=True)},
                   set()).state is DepState.SATISFIED
    me = job(9, JobState.PENDING, dep="singleton", name="sweep")
    assert verdict(me, {}, {("u", "sweep")}).state is DepState.WAITING
    assert verdict(me, {}, {("v", "sweep"), ("u", "other")}).state is DepState.SATISFIED


async def test_afterok_waits_then_starts_and_a_failed_dependency_is_never_satisfied(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        first = await lab.submit("prep")
        ok = await lab.submit("train", dependency=f"afterok:{first.id}")
        not_ok = await lab.submit("report", dependency=f"afternotok:{first.id}", kill_on_invalid_dep=True)
        await lab.round()
        assert (await lab.job(ok.id)).reason == EndReason.DEPENDENCY
        assert (await lab.job(ok.id)).state is JobState.PENDING
        await lab.finish(first.id, 0)
        await lab.round()
        await lab.round()
        assert (await lab.job(ok.id)).state is JobState.RUNNING
        gone = await lab.job(not_ok.id)
        assert (gone.state, gone.reason) == (JobState.CANCELLED, EndReason.DEPENDENCY_NEVER)
        after_ok = await lab.submit("eval", dependency=f"afterok:{not_ok.id}")
        await lab.round()
        j = await lab.job(after_ok.id)
        assert (j.state, j.reason) == (JobState.PENDING, EndReason.DEPENDENCY_NEVER)
        assert "dependency" in await lab.events(after_ok.id)


async def test_a_dependency_on_a_job_that_does_not_exist_is_refused_at_submit(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        with pytest.raises(UserError, match="dependency: job 99 does not exist"):
            await lab.submit("x", dependency="afterok:99")


async def test_an_array_is_one_job_per_index_with_at_most_n_running(tmp_path: Path) -> None:
    from hsched.spec.arrays import parse_array

    async with Lab.open(tmp_path) as lab:
        spec_job = await lab.submit("task")  # only for its spec's shape; the array is submitted below
        from dataclasses import replace

        from hsched.controller import commands

        spec = replace(spec_job.spec, array=parse_array("0-5%2"))
        first = await commands.submit(lab.ctl, spec, "alice", None)
        tasks = await lab.ctl.db(lab.ctl.store.array_tasks, first.id)
        assert [t.array_task for t in tasks] == [0, 1, 2, 3, 4, 5]
        assert {t.array_id for t in tasks} == {first.id} and [t.display_id for t in tasks][:2] == [
            f"{first.id}_0", f"{first.id}_1"]
        for _ in range(3):
            await lab.round()
            running = [t for t in await lab.ctl.db(lab.ctl.store.array_tasks, first.id)
                       if t.state is not JobState.PENDING and not t.state.is_terminal()]
            assert len(running) <= 2
        running = [t for t in await lab.ctl.db(lab.ctl.store.array_tasks, first.id) if t.state is JobState.RUNNING]
        assert [t.array_task for t in running] == [0, 1]
        [fake] = await lab.fake_runs(running[0].id)
        env = dict(fake.request.env)
        assert (env["HSCHED_ARRAY_TASK_ID"], env["SLURM_ARRAY_TASK_ID"], env["SLURM_ARRAY_JOB_ID"],
                env["SLURM_ARRAY_TASK_COUNT"]) == ("0", "0", str(first.id), "6")
        # a task ends: the next one takes its place, never a third at once
        await lab.finish(running[0].id, 0)
        await lab.round()
        await lab.round()
        now_running = sorted(t.array_task for t in await lab.ctl.db(lab.ctl.store.array_tasks, first.id)
                             if t.state is JobState.RUNNING)
        assert now_running == [1, 2]
        # afterok on the array waits for every task
        after = await lab.submit("report", dependency=f"afterok:{first.id}")
        await lab.round()
        assert (await lab.job(after.id)).reason == EndReason.DEPENDENCY


def test_parse_array() -> None:
    from hsched.indices import pending_label
    from hsched.spec.arrays import parse_array

    assert parse_array("0-99%8").indices == tuple(range(100)) and parse_array("0-99%8").max_running == 8
    assert parse_array("1,3,5-7").indices == (1, 3, 5, 6, 7)
    assert parse_array("0-15:4").indices == (0, 4, 8, 12)
    assert str(parse_array("1,3,5-7%2")) == "1,3,5-7%2"
    for bad in ("", "a-b", "5-1", "0-3%0", "0-3:0", "0-20000"):
        with pytest.raises(ValueError):
            parse_array(bad)
    assert pending_label(12, [3, 4, 5, 9], 8) == "12_[3-5,9%8]"


async def test_the_controller_honours_a_task_dependency_and_refuses_a_missing_task(tmp_path: Path) -> None:
    # issue 29: `afterok:5_3` was refused; sbatch waits for that task alone
    from dataclasses import replace

    from hsched.controller import commands
    from hsched.spec.arrays import parse_array

    async with Lab.open(tmp_path) as lab:
        shape = await lab.submit("task")
        await lab.finish(shape.id, 0)
        first = await commands.submit(lab.ctl, replace(shape.spec, array=parse_array("0-2")), "alice", None)
        tasks = await lab.ctl.db(lab.ctl.store.array_tasks, first.id)
        after_one = await lab.submit("one", dependency=f"afterok:{first.id}_1")
        after_all = await lab.submit("all", dependency=f"afterok:{first.id}")
        with pytest.raises(UserError, match=f"job {first.id}_7 does not exist"):
            await lab.submit("x", dependency=f"afterok:{first.id}_7")
        await lab.round()
        await lab.round()
        assert (await lab.job(after_one.id)).state is JobState.PENDING
        await lab.finish(tasks[1].id, 0)
        await lab.round()
        await lab.round()
        assert (await lab.job(after_one.id)).state is JobState.RUNNING  # task 1 alone was enough
        assert (await lab.job(after_all.id)).state is JobState.PENDING  # tasks 0 and 2 still run
