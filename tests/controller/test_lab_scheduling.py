"""Lab scheduling in the controller (issue 13), in-process on a fake clock (hsched.testing.Lab): fair share from
the store between people, QoS caps with their reasons, --constraint over node labels (and its refusal at
submit), GPU model aliases, and users that do not exist on a node."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hsched.cli.jobs import format_queue
from hsched.config import DEFAULT_QOS_TABLE, QosClass, Settings, job_spec_from_table
from hsched.controller import commands
from hsched.controller.api import Api
from hsched.controller.launching import fleet_view
from hsched.errors import ConfigError, UserError
from hsched.model import Job, JobState
from hsched.testing import CannedNode, Lab

FOUR = (CannedNode("a", "NVIDIA A100-SXM4-80GB", 4),)
TWO_BY_TWO = (CannedNode("a", "NVIDIA A100-SXM4-80GB", 2), CannedNode("b", "NVIDIA A100-SXM4-80GB", 2))


async def submit(lab: Lab, user: str, **table: Any) -> Job:
    """A job as `hsched submit` sends it (the spec table checked as the API checks it), from `user`."""
    spec = job_spec_from_table({"command": ["train"], **table}, "<test>", lab.ctl.settings.qos_names)
    return await commands.submit(lab.ctl, spec, user, None)


def capped(**limits: int) -> Settings:
    normal = QosClass("normal", preempts=("scavenger",), **limits)
    return Settings(qos={**DEFAULT_QOS_TABLE, "normal": normal})


def label(lab: Lab, node: str, *labels: str) -> None:
    """The fleet file's `labels` for a node (hsched.testing's canned fleet has none)."""
    rt = lab.ctl.nodes[node]
    rt.config = replace(rt.config, labels=labels)


async def state(lab: Lab, job: Job) -> tuple[JobState, str]:
    j = await lab.job(job.id)
    return j.state, j.reason


# ---------------------------------------------------------------- fair share


async def test_fair_share_lab2s_first_job_takes_the_next_free_gpu_and_share_shows_both(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=FOUR) as lab:
        first = [await submit(lab, "lab1", resources={"gpus": 1}) for _ in range(20)]
        await lab.round()
        assert [(await lab.job(j.id)).state for j in first[:5]] == [JobState.RUNNING] * 4 + [JobState.PENDING]
        await lab.advance(600.0)
        second = [await submit(lab, "lab2", resources={"gpus": 1}) for _ in range(5)]
        await lab.advance(60.0)
        assert [(await lab.job(j.id)).state for j in second] == [JobState.PENDING] * 5
        # one of lab1's jobs ends: the GPU goes to lab2, not to lab1's 16 jobs submitted before
        await lab.finish(first[0].id)
        await lab.round()
        assert (await lab.job(second[0].id)).state is JobState.RUNNING
        assert (await lab.job(first[4].id)).state is JobState.PENDING
        # and the next one too: lab1 still holds three GPUs and far more usage
        await lab.advance(60.0)
        await lab.finish(first[1].id)
        await lab.round()
        assert (await lab.job(second[1].id)).state is JobState.RUNNING
        assert (await lab.job(first[4].id)).state is JobState.PENDING
        await lab.advance(600.0)
        share = await Api(lab.ctl).op_share({}, 0)
        rows = {r["user"]: r for r in share["users"]}
        assert set(rows) == {"lab1", "lab2"} and share["half_life_s"] == 7 * 86400
        # lab1: 4 GPUs for 660 s, then 3 for 60, 2 since (600): 2640 + 180 + 1200 GPU-seconds
        assert rows["lab1"]["raw_usage_gpu_hours"] == pytest.approx((2640 + 180 + 1200) / 3600, rel=1e-3)
        # lab2: one GPU for 660 s, another for 600 s
        assert rows["lab2"]["raw_usage_gpu_hours"] == pytest.approx(1260 / 3600, rel=1e-3)
        assert 0 < rows["lab2"]["decayed_usage_gpu_hours"] <= rows["lab2"]["raw_usage_gpu_hours"]
        assert rows["lab2"]["fairshare"] > rows["lab1"]["fairshare"]
        assert rows["lab1"]["norm_shares"] == rows["lab2"]["norm_shares"] == 0.5


async def test_past_usage_from_the_store_counts_after_the_jobs_ended(tmp_path: Path) -> None:
    """Fair share is history, not only what runs now: lab1 used the fleet yesterday, nothing runs now, and
    lab2's later job still goes first."""
    async with Lab.open(tmp_path, nodes=(CannedNode("a", "NVIDIA A100-SXM4-80GB", 1),)) as lab:
        old = await submit(lab, "lab1", resources={"gpus": 1})
        await lab.round()
        await lab.advance(4 * 3600.0)
        await lab.finish(old.id)
        await lab.round()
        await lab.advance(86400.0)
        blocker = await submit(lab, "lab3", resources={"gpus": 1})  # holds the GPU while both queue
        await lab.round()
        mine = await submit(lab, "lab1", resources={"gpus": 1})
        theirs = await submit(lab, "lab2", resources={"gpus": 1})
        await lab.advance(10.0)
        await lab.finish(blocker.id)
        await lab.round()
        assert (await lab.job(theirs.id)).state is JobState.RUNNING
        assert (await lab.job(mine.id)).state is JobState.PENDING
        rows = {r["user"]: r for r in (await Api(lab.ctl).op_share({}, 0))["users"]}
        # a day old, with a 7-day half-life: 4 GPU-hours weigh 4 * 2^(-1/7) (less the decay within the run)
        assert rows["lab1"]["raw_usage_gpu_hours"] == pytest.approx(4.0, rel=1e-3)
        assert 3.5 < rows["lab1"]["decayed_usage_gpu_hours"] < 4 * 2 ** (-1 / 7)


# ---------------------------------------------------------------- QoS caps


async def test_max_gpus_per_user_third_concurrent_gpu_waits_with_the_limits_reason(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=FOUR, settings=capped(max_gpus_per_user=2)) as lab:
        jobs = [await submit(lab, "lab1", resources={"gpus": 1}) for _ in range(3)]
        other = await submit(lab, "lab2", resources={"gpus": 1})
        await lab.round()
        assert [await state(lab, j) for j in jobs[:2]] == [(JobState.RUNNING, "")] * 2
        assert await state(lab, jobs[2]) == (JobState.PENDING, "QOSMaxGpuPerUserLimit")
        assert (await lab.job(other.id)).state is JobState.RUNNING  # one user's cap holds no one else back
        # `hsched queue` shows it where it shows every reason
        api = Api(lab.ctl)
        queue = await api.op_queue({}, 0)
        line = [x for x in format_queue(queue, "%i %R") if x.startswith(f"{jobs[2].id} ")]
        assert line == [f"{jobs[2].id} (QOSMaxGpuPerUserLimit)"]
        assert (await api.op_show({"id": jobs[2].id}, 0))["reason"] == "QOSMaxGpuPerUserLimit"
        # a request larger than the cap itself is refused at submit, not queued for ever
        with pytest.raises(UserError, match="allows 2 per user \\(max_gpus_per_user\\)"):
            await submit(lab, "lab1", resources={"gpus": 4})
        await lab.finish(jobs[0].id)
        await lab.round()
        assert await state(lab, jobs[2]) == (JobState.RUNNING, "")


async def test_max_gpus_for_the_class_and_max_jobs_per_user(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=FOUR, settings=capped(max_gpus=3)) as lab:
        jobs = [await submit(lab, u, resources={"gpus": 1}) for u in ("lab1", "lab2", "lab3", "lab4")]
        await lab.round()
        states = [await state(lab, j) for j in jobs]
        assert states.count((JobState.RUNNING, "")) == 3
        assert (JobState.PENDING, "QOSGrpGpuLimit") in states
        # scavenger is not capped: the fourth GPU is free for it
        scav = await submit(lab, "lab4", qos="scavenger", resources={"gpus": 1})
        await lab.round()
        assert (await lab.job(scav.id)).state is JobState.RUNNING
    async with Lab.open(tmp_path / "2", nodes=FOUR, settings=capped(max_jobs_per_user=1)) as lab:
        a, b = [await submit(lab, "lab1", resources={"gpus": 1}) for _ in range(2)]
        await lab.round()
        assert await state(lab, b) == (JobState.PENDING, "QOSMaxJobsPerUserLimit")
        await lab.finish(a.id)
        await lab.round()
        assert (await lab.job(b.id)).state is JobState.RUNNING


async def test_a_capped_prod_job_does_not_preempt(tmp_path: Path) -> None:
    prod = QosClass("prod", preempts=("normal", "scavenger"), max_gpus_per_user=1)
    settings = Settings(qos={**DEFAULT_QOS_TABLE, "prod": prod})
    async with Lab.open(tmp_path, nodes=FOUR, settings=settings) as lab:
        low = [await submit(lab, "lab2", qos="scavenger", resources={"gpus": 1}) for _ in range(4)]
        await lab.round()
        assert [(await lab.job(j.id)).state for j in low] == [JobState.RUNNING] * 4
        p1 = await submit(lab, "lab1", qos="prod", resources={"gpus": 1})
        p2 = await submit(lab, "lab1", qos="prod", resources={"gpus": 1})
        await lab.round()
        stopping = [j for j in low if (await lab.job(j.id)).state is JobState.PREEMPTING]
        assert len(stopping) == 1  # for p1 only
        assert await state(lab, p2) == (JobState.PENDING, "QOSMaxGpuPerUserLimit")
        for _ in range(3):
            await lab.advance(40.0)  # the victim's grace runs out, it stops, p1 starts
        assert (await lab.job(p1.id)).state is JobState.RUNNING
        assert await state(lab, p2) == (JobState.PENDING, "QOSMaxGpuPerUserLimit")
        assert [(await lab.job(j.id)).state for j in low].count(JobState.RUNNING) == 3


# ---------------------------------------------------------------- constraints and aliases


async def test_constraints_and_or_and_the_refusal_at_submit(tmp_path: Path) -> None:
    nodes = (*TWO_BY_TWO, CannedNode("c", "NVIDIA A100-SXM4-80GB", 2))
    async with Lab.open(tmp_path, nodes=nodes) as lab:
        label(lab, "a", "nvme")
        label(lab, "b", "nvme", "ib")
        label(lab, "c", "bigmem")
        both = [await submit(lab, "lab1", constraint="nvme&ib", resources={"gpus": 1}) for _ in range(3)]
        either = await submit(lab, "lab1", constraint="ib|bigmem", resources={"gpus": 2})
        await lab.round()
        placed = {}
        for j in [*both, either]:
            placed[j.id] = [p.node for p in (await lab.job(j.id)).placement]
        assert placed[both[0].id] == placed[both[1].id] == ["b"]
        assert placed[either.id] == ["c"]  # b has the most labels: left for the job that needs them
        # b is full: the third waits though a has free GPUs (a lacks ib)
        assert await state(lab, both[2]) == (JobState.PENDING, "Resources")
        assert (await lab.job(both[2].id)).spec.resources.constraint == "nvme&ib"
        # a constraint no node satisfies is refused, naming it and the labels there are
        with pytest.raises(UserError) as e:
            await submit(lab, "lab1", constraint="nvme&bigmem", resources={"gpus": 1})
        assert str(e.value) == (
            "job request cannot be satisfied by this fleet (<hsched.testing canned fleet>): no node has the labels "
            "of --constraint 'nvme&bigmem' (labels in this fleet: bigmem, ib, nvme); change --constraint or add "
            "labels to the nodes in the fleet file")
        with pytest.raises(ConfigError, match="constraint: 'nvme\\|' is not a constraint"):
            await submit(lab, "lab1", constraint="nvme|", resources={"gpus": 1})


async def test_gpu_model_aliases_apply_to_gpu_type(tmp_path: Path) -> None:
    nodes = (CannedNode("sxm", "NVIDIA A100-SXM4-80GB", 1, topology=None),
             CannedNode("pcie", "NVIDIA A100-PCIE-40GB", 1, topology=None),
             CannedNode("h", "NVIDIA H100 80GB HBM3", 1, topology=None))
    settings = Settings(gpu_aliases={"big": ("A100-SXM4-80GB", "H100"), "a100": ("A100-PCIE-40GB",)})
    async with Lab.open(tmp_path, nodes=nodes, settings=settings) as lab:
        big = [await submit(lab, "lab1", resources={"gpus": 1, "gpu_types": ["big"]}) for _ in range(3)]
        await lab.round()
        nodes_of = []
        for j in big:
            nodes_of += [p.node for p in (await lab.job(j.id)).placement]
        assert sorted(nodes_of) == ["h", "sxm"]
        assert (await lab.job(big[2].id)).state is JobState.PENDING
        # "a100" is the alias, not the substring: only the PCIe card
        small = await submit(lab, "lab1", resources={"gpus": 1, "gpu_types": ["A100"]})
        await lab.round()
        assert [p.node for p in (await lab.job(small.id)).placement] == ["pcie"]
        assert (await lab.job(small.id)).spec.resources.gpu_types == ("A100",)  # stored as asked
    async with Lab.open(tmp_path / "2", nodes=nodes) as lab:
        with pytest.raises(UserError, match="of type big on one node"):
            await submit(lab, "lab1", resources={"gpus": 1, "gpu_types": ["big"]})


# ---------------------------------------------------------------- users absent on a node


async def test_a_user_absent_on_a_node_never_lands_there_and_the_reason_says_so(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=TWO_BY_TWO) as lab:
        lab.ctl.nodes["a"].users = {"lab2": False, "lab1": True}
        assert fleet_view(lab.ctl, []).absent_users == {"a": frozenset({"lab2"})}
        jobs = [await submit(lab, "lab2", resources={"gpus": 1}) for _ in range(3)]
        await lab.round()
        assert [(await lab.job(j.id)).placement[0].node for j in jobs[:2]] == ["b", "b"]
        assert await state(lab, jobs[2]) == (JobState.PENDING, "user lab2 does not exist on node a")
        shown = await Api(lab.ctl).op_queue({}, 0)
        assert [x for x in format_queue(shown, "%i %R") if x.startswith(f"{jobs[2].id} ")] == [
            f"{jobs[2].id} (user lab2 does not exist on node a)"]
        # lab1 exists there: a is theirs to use; then a is full and lab2's job waits like anyone's
        mine = [await submit(lab, "lab1", resources={"gpus": 1}) for _ in range(2)]
        await lab.round()
        assert [(await lab.job(j.id)).placement[0].node for j in mine] == ["a", "a"]
        await lab.round()  # (in the round before, lab2's job was looked at while a was still free)
        assert (await lab.job(jobs[2].id)).reason in ("Resources", "Priority")  # the usual reasons


async def test_usage_counts_each_gpu_once_and_survives_a_restart(tmp_path: Path) -> None:
    """Two ranks on one node share its devices (--tasks-per-node): the job's GPUs count once. A new controller
    over the same store reads the history again and finds the same usage."""
    async with Lab.open(tmp_path, nodes=FOUR) as lab:
        gang = await submit(lab, "lab1", resources={"gpus": 2, "tasks_per_node": 2})
        await lab.round()
        assert len(await lab.runs(gang.id)) == 2
        await lab.advance(1800.0)
        half_life = lab.ctl.settings.fairshare_half_life_s
        running = await lab.ctl.db(lab.ctl.store.user_usage, lab.clock.time(), half_life)
        assert running["lab1"].raw_s == pytest.approx(2 * 1800.0)
        await lab.finish(gang.id)
        await lab.round()
        assert (await lab.job(gang.id)).state is JobState.COMPLETED
        await lab.advance(1800.0)
        ended = await lab.ctl.db(lab.ctl.store.user_usage, lab.clock.time(), half_life)
        assert ended["lab1"].raw_s == pytest.approx(2 * 1800.0)
        assert ended["lab1"].decayed_s < running["lab1"].decayed_s  # older now
    async with Lab.open(tmp_path, nodes=FOUR, clock=lab.clock) as again:
        fresh = await again.ctl.db(again.ctl.store.user_usage, lab.clock.time(), half_life)
        assert fresh["lab1"].raw_s == pytest.approx(ended["lab1"].raw_s)
        assert fresh["lab1"].decayed_s == pytest.approx(ended["lab1"].decayed_s)
