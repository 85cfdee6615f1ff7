"""Workload class (issue 30) in the live round: an inference job takes the slowest GPU type that fits it, leaving
the fastest to training (hsched.sched.stages.eligibility.slowest_for_inference, Eligible.for_inference); when
those are full it still starts on a faster one rather than wait; the JSON forms carry the class."""

from __future__ import annotations

from pathlib import Path

from hsched.controller import commands
from hsched.model import JobSpec, JobState, Resources, workload_of
from hsched.serialize import job_to_dict, spec_from_dict, spec_to_dict
from hsched.testing import CannedNode, Lab

FLEET = (CannedNode("h100", "NVIDIA H100 80GB HBM3", 4), CannedNode("l4", "NVIDIA L4", 4))


async def _start(lab: Lab, workload: str, memory_mib: int | None = 10_000, service: str = "") -> str:
    spec = JobSpec(command=("python", "serve.py"), workload=workload, service=service,
                   resources=Resources(gpus=1, gpu_memory_mib=memory_mib))
    job = await commands.submit(lab.ctl, spec, "alice", None)
    await lab.round()
    job = await lab.job(job.id)
    assert job.state is JobState.RUNNING
    return job.placement[0].node


async def test_inference_takes_the_slowest_gpu_that_fits(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=FLEET) as lab:
        assert await _start(lab, "inference") == "l4"
        assert await _start(lab, "", service="llm") == "l4"  # a service's replica is inference
        assert await _start(lab, "inference", memory_mib=40_000) == "h100"  # an L4 (24 GB) does not fit it
        assert await _start(lab, "training") == "h100"
        assert await _start(lab, "") == "h100"  # unknown: as before, the fastest first


async def test_inference_starts_on_a_faster_gpu_rather_than_wait(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=FLEET) as lab:
        assert [await _start(lab, "inference") for _ in range(4)] == ["l4"] * 4
        assert await _start(lab, "inference") == "h100"


def test_the_workload_in_json_and_old_rows() -> None:
    spec = JobSpec(command=("x",), workload="preprocessing")
    assert spec_from_dict(spec_to_dict(spec)).workload == "preprocessing"
    old = spec_to_dict(JobSpec(command=("x",)))
    assert "workload" not in old and "service" not in old  # a job that says none is stored as before
    assert spec_from_dict(old) == JobSpec(command=("x",))
    replica = JobSpec(command=("x",), service="llm", replica=2)
    assert workload_of(replica) == "inference" and spec_from_dict(spec_to_dict(replica)) == replica
    from hsched.model import Job

    d = job_to_dict(Job(id=1, spec=replica, user="a", state=JobState.PENDING, reason="", submit_time=0.0))
    assert (d["workload"], d["service"], d["replica"]) == ("inference", "llm", 2)
