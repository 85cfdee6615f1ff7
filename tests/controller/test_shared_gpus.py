"""GPUs shared by inference (issue 15, item 4): `--shared` jobs ask for a fraction of one GPU by memory and are
packed several to a GPU while their memory fits, with CUDA MPS's variables; an exclusive job never gets such a GPU;
a prod exclusive job preempts shared ones first, all of a GPU's; a shared job that does not fit waits. The pure
round, then the controller in-process on a fake clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from hsched.config import SimulatedDevices, job_spec_from_table
from hsched.controller import commands
from hsched.errors import UserError
from hsched.model import Job, JobSpec, JobState, Node, NodeState, Placement, Resources
from hsched.sched.live import FleetView, Launch, PreemptRule, Running, Wait, schedule
from hsched.sched.view import Preempt
from hsched.simulated import simulated_devices
from hsched.testing import CannedNode, Lab

GB = 1000**3 // (1 << 20)  # MiB in a vendor's GB


def node(gpus: int = 1) -> Node:
    devices, links = simulated_devices("n", SimulatedDevices(model="NVIDIA H100 80GB HBM3", count=gpus,
                                                             topology="pcie" if gpus > 1 else None))
    return Node("n", "fake", NodeState.UP, cpus=64, memory_total_mib=512 * 1024, devices=devices, links=links)


def job(jid: int, *, share_gb: int | None = None, qos: str = "normal", state: JobState = JobState.PENDING,
        where: Placement | None = None) -> Job:
    res = (Resources(gpus=1, gpu_memory_mib=share_gb * GB, shared=True) if share_gb else Resources(gpus=1))
    return Job(jid, JobSpec(command=("x",), resources=res, qos=qos), "alice", state, "", float(jid),
               start_time=0.0 if where else None, placement=(where,) if where else ())


@pytest.mark.parametrize("policy", [None, "hsched"])
def test_four_ten_gb_jobs_pack_onto_one_gpu_a_fifth_that_does_not_fit_waits(policy: str | None) -> None:
    n = node()
    queue = [job(1, share_gb=10), job(2, share_gb=10), job(3, share_gb=10), job(4, share_gb=10),
             job(5, share_gb=50), job(6)]
    got = schedule(FleetView((n,), frozenset(), {}, policy=policy), queue, 0.0)
    launched = {d.job_id: d.placements for d in got if isinstance(d, Launch)}
    assert sorted(launched) == [1, 2, 3, 4]
    assert {p[0].devices for p in launched.values()} == {(n.devices[0].uuid,)}
    assert launched[4][0].explanation == "GPU0 shared: 40 GB of 85.5 GB promised to shared jobs"
    waits = {d.job_id: d.reason for d in got if isinstance(d, Wait)}
    # 40 + 50 GB > the card's 85.5 GB (81,559 MiB); the exclusive job never gets a shared GPU
    assert set(waits) == {5, 6}


def test_a_shared_gpu_takes_more_while_memory_fits_and_a_prod_job_preempts_them_all() -> None:
    n = node(2)
    g0, g1 = (d.uuid for d in n.devices)
    on0 = [job(i, share_gb=10, state=JobState.RUNNING, where=Placement("n", (g0,))) for i in (1, 2, 3)]
    ex = job(9, state=JobState.RUNNING, where=Placement("n", (g1,)))
    running = (*on0, ex)
    fleet = FleetView((n,), frozenset({g0, g1}), {}, running=tuple(Running(j, 0.0) for j in running),
                      policy="hsched", shared_use={g0: 30 * GB},
                      rule=PreemptRule({"prod": frozenset({"normal"})}))
    # one more shared job fits the shared GPU, beside the three
    got = schedule(fleet, [job(20, share_gb=40)], 1.0)
    assert [(d.job_id, d.placements[0].devices) for d in got if isinstance(d, Launch)] == [(20, (g0,))]
    # a prod job that needs a whole GPU preempts the shared ones first, every one of them on that GPU
    got = schedule(fleet, [job(30, qos="prod")], 1.0)
    (pre,) = [d for d in got if isinstance(d, Preempt)]
    assert sorted(pre.victims) == [1, 2, 3]


def test_a_shared_job_must_say_its_share() -> None:
    for bad, what in (({"gpus": 1, "shared": True}, "give gpu_memory"),
                      ({"gpus": 2, "shared": True, "gpu_memory": "10G"}, "gpus = 1")):
        with pytest.raises(UserError, match=what):
            job_spec_from_table({"command": ["x"], "resources": bad}, "<t>")


async def test_shared_runs_get_their_gpu_and_mps_share(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=(CannedNode("n", "NVIDIA H100 80GB HBM3", 1),)) as lab:
        spec = JobSpec(command=("serve",), resources=Resources(gpus=1, gpu_memory_mib=20 * GB, shared=True))
        a = await commands.submit(lab.ctl, spec, "alice", None)
        b = await commands.submit(lab.ctl, spec, "alice", None)
        await lab.round()
        assert (await lab.job(a.id)).state is JobState.RUNNING and (await lab.job(b.id)).state is JobState.RUNNING
        envs = [r.request.env for j in (a, b) for r in await lab.fake_runs(j.id)]
        uuid = lab.ctl.nodes["n"].node.devices[0].uuid
        for env in envs:
            assert env["CUDA_VISIBLE_DEVICES"] == uuid and env["HSCHED_SHARED_GPU"] == uuid
            assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "24"  # 20 GB of an 80 GB card's 81,559 MiB
            assert env["CUDA_MPS_PIPE_DIRECTORY"].endswith(uuid)
        # an exclusive job waits for the GPU the shared ones hold
        ex = await commands.submit(lab.ctl, JobSpec(command=("train",), resources=Resources(gpus=1)), "bob", None)
        await lab.round()
        assert (await lab.job(ex.id)).state is JobState.PENDING
        # when one shared job ends, the GPU is not dirty (the other's processes are ours), and stays shared
        await lab.finish(a.id, 0)
        await lab.round()
        assert (await lab.job(b.id)).state is JobState.RUNNING
        assert (await lab.job(ex.id)).state is JobState.PENDING
        await lab.finish(b.id, 0)
        await lab.round()
        await lab.round()
        assert (await lab.job(ex.id)).state is JobState.RUNNING


def test_one_user_per_shared_gpu() -> None:
    """CUDA MPS serves one user's clients at a time on a GPU: another user's shared job goes to another GPU."""
    n = node(2)
    bob = job(2, share_gb=10)
    bob = Job(bob.id, bob.spec, "bob", bob.state, "", bob.submit_time)
    got = schedule(FleetView((n,), frozenset(), {}, policy="hsched"), [job(1, share_gb=10), bob, job(3, share_gb=10)],
                   0.0)
    where = {d.job_id: d.placements[0].devices[0] for d in got if isinstance(d, Launch)}
    assert where[1] == where[3] != where[2]
