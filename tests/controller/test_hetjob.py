"""Heterogeneous jobs (issue 31: sbatch's hetjobs) in-process on the fake clock: every component placed and started
together or none, each told the others' hosts and ports, ended as one with the failing component named."""

from __future__ import annotations

from pathlib import Path

import pytest

from hsched.config import Settings, job_spec_from_table
from hsched.controller import commands
from hsched.errors import UserError
from hsched.model import EndReason, Job, JobState
from hsched.serialize import job_to_dict
from hsched.testing import CannedNode, Lab
from tests.controller.test_lab_scheduling import capped

# one L40S node, one node of two H100s, and a node with no GPU at all
FLEET = (CannedNode("l", "NVIDIA L40S", 1), CannedNode("h", "NVIDIA H100 80GB HBM3", 2),
         CannedNode("c", "NVIDIA L40S", 0, topology=None, cpus=16))

PIPELINE = {"name": "pipe", "component": [
    {"command": ["python", "prep.py"], "resources": {"gpus": 1, "gpu_types": ["l40s"]}},
    {"command": ["python", "train.py"], "resources": {"gpus": 2, "gpu_types": ["h100"]}, "env": {"STAGE": "train"}},
    {"command": ["python", "fuse.py"], "resources": {"cpus": 4}},
]}


async def submit(lab: Lab, table: dict[str, object] = PIPELINE) -> Job:
    return await commands.submit(lab.ctl, job_spec_from_table(table, "<test>"), "alice", None)


def envs(lab: Lab, job: Job) -> list[dict[str, str]]:
    """The environment each run of the job was launched with, in rank order (the fake nodes' records)."""
    out = {}
    for ex in lab.executors.values():
        for fake in ex.runs.values():
            e = dict(fake.request.env)
            if e.get("HSCHED_JOB_ID") == str(job.id):
                out[int(e["HSCHED_COMPONENT"])] = e | {"_command": " ".join(fake.request.command)}
    return [out[i] for i in sorted(out)]


async def test_a_three_component_pipeline_starts_at_once_and_each_sees_the_others(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=FLEET) as lab:
        job = await submit(lab)
        await lab.round()
        job = await lab.job(job.id)
        assert job.state is JobState.RUNNING
        runs = await lab.runs(job.id)
        assert len(runs) == 3 and {r.attempt for r in runs} == {1}
        # each component where its request fits: l40s, two h100s, the CPU-only one on a node with CPUs
        assert [(r.node, len(r.devices)) for r in sorted(runs, key=lambda r: r.rank)][:2] == [("l", 1), ("h", 2)]
        e = envs(lab, job)
        assert [x["_command"] for x in e] == ["python prep.py", "python train.py", "python fuse.py"]
        for i, x in enumerate(e):
            assert (x["HSCHED_COMPONENT"], x["HSCHED_COMPONENTS"], x["SLURM_HET_SIZE"]) == (str(i), "3", "3")
            assert x["SLURM_HET_JOB_ID"] == str(job.id) and x["SLURM_HET_JOB_OFFSET"] == str(i)
            # every component is told where every component runs, and the same ports
            assert x["SLURM_JOB_NODELIST_HET_GROUP_0"] == "l" and x["SLURM_JOB_NODELIST_HET_GROUP_1"] == "h"
            assert x["HSCHED_COMPONENT_1_NODES"] == "h" and x["HSCHED_COMPONENT_0_HOSTS"]
            assert {x[f"HSCHED_COMPONENT_{k}_PORT"] for k in range(3)} == {e[0][f"HSCHED_COMPONENT_{k}_PORT"]
                                                                          for k in range(3)}
            assert (x["WORLD_SIZE"], x["RANK"]) == ("1", "0")  # its own gang: one run each here
        assert len({e[0][f"HSCHED_COMPONENT_{k}_PORT"] for k in range(3)}) == 3
        assert len(e[1]["CUDA_VISIBLE_DEVICES"].split(",")) == 2 and e[2]["CUDA_VISIBLE_DEVICES"] == ""
        assert e[1]["STAGE"] == "train" and "STAGE" not in e[0]
        # the contract's JSON: one entry per component, as squeue names them
        comps = job_to_dict(job)["components"]
        assert [c["display_id"] for c in comps] == [f"{job.id}+0", f"{job.id}+1", f"{job.id}+2"]
        assert [c["placement"][0]["node"] for c in comps][:2] == ["l", "h"] and comps[2]["gpus"] == 0
        # all succeed: the job completes
        await lab.finish(job.id, 0)
        await lab.round()
        assert (await lab.job(job.id)).state is JobState.COMPLETED


async def test_none_starts_while_one_component_cannot_fit_and_the_wait_names_it(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=FLEET) as lab:
        blocker = await lab.submit("python", "other.py", gpus=1)  # takes the L40S or an H100
        await lab.round()
        blocker = await lab.job(blocker.id)
        job = await submit(lab)
        await lab.round()
        job = await lab.job(job.id)
        assert job.state is JobState.PENDING and await lab.runs(job.id) == []
        busy = blocker.placement[0].node
        missing = 0 if busy == "l" else 1
        assert f"component {missing} (" in job.reason and "does not fit" in job.reason
        # nothing of it was started, so nothing holds GPUs: another job may use what the others left
        assert all(ex.runs == {} or all(f.request.env.get("HSCHED_JOB_ID") != str(job.id) for f in ex.runs.values())
                   for ex in lab.executors.values())
        await lab.finish(blocker.id, 0)
        await lab.round()
        job = await lab.job(job.id)
        assert job.state is JobState.RUNNING and len(await lab.runs(job.id)) == 3


async def test_a_component_no_node_can_run_is_refused_at_submit(tmp_path: Path) -> None:
    table = {"component": [PIPELINE["component"][0],  # type: ignore[index]
                           {"command": ["python", "train.py"], "resources": {"gpus": 4, "gpu_types": ["h100"]}}]}
    async with Lab.open(tmp_path, nodes=FLEET) as lab:
        with pytest.raises(UserError, match=r"component 1 \(train.py\)"):
            await submit(lab, table)


async def test_a_failure_of_one_component_ends_all_three_naming_it(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=FLEET) as lab:
        job = await submit(lab)
        await lab.round()
        runs = sorted(await lab.runs(job.id), key=lambda r: r.rank)
        for ex in lab.executors.values():
            ex.exit_on_signal = {"KILL": 137}
        await lab.finish(job.id, 3, rank=1)  # train.py fails
        await lab.round()
        assert (await lab.job(job.id)).state is JobState.COMPLETING
        others = [f for f in await lab.fake_runs(job.id) if f.exit_code is None]
        assert len(others) == 2 and all(f.signals == ["TERM"] for f in others)
        await lab.advance(60.0)
        assert all(f.signals[-1] == "KILL" for f in others)
        await lab.round()
        job = await lab.job(job.id)
        assert (job.state, job.reason, job.exit_code) == (JobState.FAILED, EndReason.RANK_FAILED, 3)
        assert all(not r.state.is_live() for r in await lab.runs(job.id)) and len(runs) == 3
        messages = [e["message"] for e in await lab.ctl.db(lab.ctl.store.events, job.id)]
        assert any(m.startswith("component 1 (train.py) exited with code 3") for m in messages), messages
        assert any("component 1 (train.py)" in m and "stopping the other" in m for m in messages), messages


async def test_preemption_requeues_the_job_whole_and_cancel_stops_every_component(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=FLEET) as lab:
        job = await submit(lab)
        await lab.round()
        first = await lab.runs(job.id)
        await commands.preempt(lab.ctl, job.id)  # every component is asked to stop (the fake exits 143 on TERM)
        await lab.round()
        assert all(f.signals[:1] == ["TERM"] for f in await lab.fake_runs(job.id) if f.request.run_dir in
                   {r.run_dir for r in first})
        await lab.round()
        job = await lab.job(job.id)
        # requeued as one and started again, every component together
        assert (job.state, job.restarts) == (JobState.RUNNING, 1)
        again = [r for r in await lab.runs(job.id) if r.attempt == 2]
        assert len(first) == 3 and len(again) == 3 and all(r.state.is_live() for r in again)
        assert {e["HSCHED_RESTART_COUNT"] for e in envs(lab, job)} == {"1"}
        await commands.cancel(lab.ctl, job.id)
        await lab.round()
        assert all(f.signals == ["TERM"] for f in await lab.fake_runs(job.id) if f.request.run_dir in
                   {r.run_dir for r in again})
        await lab.round()
        job = await lab.job(job.id)
        assert job.state is JobState.CANCELLED
        assert all(not r.state.is_live() for r in await lab.runs(job.id))


async def test_queue_show_and_acct_show_each_component(tmp_path: Path) -> None:
    import os

    from hsched.cli.acct import component_rows
    from hsched.cli.listing import component_lines, format_queue
    from hsched.controller.api import Api

    me = os.getuid()
    async with Lab.open(tmp_path, nodes=FLEET) as lab:
        api = Api(lab.ctl)
        job = await api.handle("submit", {"spec": PIPELINE, "source": "<test>"}, me)
        await lab.round()
        queued = await api.handle("queue", {}, me)
        [j] = [q for q in queued if q["id"] == job["id"]]
        assert [c["display_id"] for c in j["components"]] == [f"{job['id']}+{i}" for i in range(3)]
        # squeue's rows: one per component, each with its own GPUs and nodes
        lines = format_queue(queued, "%i %b %R")
        fuse = j["components"][2]["placement"][0]["node"]
        assert lines[1:] == [f"{job['id']}+0 1 l", f"{job['id']}+1 2 h", f"{job['id']}+2 0 {fuse}"]
        for ex in lab.executors.values():
            ex.exit_on_signal = {"TERM": 143}
        await lab.finish(job["id"], 3, rank=1)
        await lab.round()
        await lab.round()
        shown = await api.handle("show", {"id": job["id"]}, me)
        assert shown["state"] == "FAILED"
        states = [(c["display_id"], c["state"], c["exit_code"]) for c in shown["components"]]
        assert states == [(f"{job['id']}+0", "CANCELLED", 143), (f"{job['id']}+1", "FAILED", 3),
                          (f"{job['id']}+2", "CANCELLED", 143)]
        assert "FAILED" in component_lines(shown["components"])[1] and "train.py" in component_lines(
            shown["components"])[1]
        acct = await api.handle("acct", {}, me)
        rows = component_rows([a for a in acct["jobs"] if a["id"] == job["id"]])
        assert [(r["display_id"], r["state"], r["gpus"], len(r["runs"])) for r in rows] == [
            (f"{job['id']}+0", "CANCELLED", 1, 1), (f"{job['id']}+1", "FAILED", 2, 1),
            (f"{job['id']}+2", "CANCELLED", 0, 1)]


async def test_qos_caps_count_every_components_gpus(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=FLEET, settings=capped(max_gpus_per_user=2)) as lab:
        # 1 + 2 GPUs: over the cap of 2, though component 0 alone is within it
        with pytest.raises(UserError, match="asks for 3 GPU"):
            await submit(lab)
    async with Lab.open(tmp_path / "b", nodes=FLEET, settings=capped(max_gpus_per_user=3)) as lab:
        other = await lab.submit("python", "x.py", gpus=1)
        await lab.round()
        job = await submit(lab)
        await lab.round()
        job = await lab.job(job.id)
        assert (await lab.job(other.id)).state is JobState.RUNNING
        assert (job.state, job.reason) == (JobState.PENDING, EndReason.QOS_MAX_GPU_PER_USER.value)


async def test_a_node_lost_under_one_component_requeues_the_whole_job(tmp_path: Path) -> None:
    settings = Settings(heartbeat_timeout_s=15.0, lease_s=60.0)
    two_l40s = (CannedNode("l1", "NVIDIA L40S", 1), CannedNode("l2", "NVIDIA L40S", 1),
                CannedNode("h", "NVIDIA H100 80GB HBM3", 2))
    async with Lab.open(tmp_path, nodes=two_l40s, settings=settings) as lab:
        job = await submit(lab)
        await lab.round()
        first = sorted(await lab.runs(job.id), key=lambda r: r.rank)
        prep = first[0].node
        gone = lab.executors[prep]
        gone.unreachable = True
        await lab.advance(16.0)
        await lab.advance(40.0)
        assert (await lab.job(job.id)).state is JobState.RUNNING  # within the lease
        await lab.advance(30.0)  # lease over: the other components are stopped and the job requeued whole
        for _ in range(4):
            await lab.advance(5.0)
        job = await lab.job(job.id)
        assert (job.restarts, job.state) == (1, JobState.RUNNING)
        again = sorted((r for r in await lab.runs(job.id) if r.attempt == 2), key=lambda r: r.rank)
        assert len(again) == 3 and again[0].node != prep and all(r.state.is_live() for r in again)
        # the first attempt's runs that were not on the lost node were stopped, not left running beside the new ones
        stopped = [lab.executors[r.node].runs[r.run_dir] for r in first if r.node != prep]
        assert all(f.signals and f.exit_code is not None for f in stopped)
