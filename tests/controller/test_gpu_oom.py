"""A run that dies of CUDA out-of-memory (issue 15, item 3): recognised in its log's tail by the node
helper, reported as `gpu_oom` (the job's reason and the run's), and retried on a GPU with more memory when
the fleet has one. In-process on a fake clock; the helper's recognition on real files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hsched.controller.api import Api
from hsched.node import gpucheck, status
from hsched.testing import CannedNode, Lab

TORCH = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
         "39.39 GiB of which 1.06 GiB is free.")


@pytest.mark.parametrize(("tail", "found"), [
    (f"step 10\n{TORCH}\n", TORCH),
    ("RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported\n",
     "RuntimeError: CUDA error: out of memory"),
    ("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.2GiB\n",
     "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.2GiB"),
    ("Traceback...\nValueError: bad shape\n", None),
    ("the memory of the model is fine\n", None),
])
def test_the_helper_finds_a_gpu_oom_in_the_log_tail(tmp_path: Path, tail: str, found: str | None) -> None:
    log = tmp_path / "output.log"
    log.write_text("x" * 100_000 + "\n" + tail)
    assert gpucheck.gpu_oom_line(str(log)) == found
    report = status.exited({"exit_code": 1, "gpu_oom": found is not None, "gpu_oom_line": found}, {})
    assert report["gpu_oom"] is (found is not None)


FLEET = (CannedNode("small", "NVIDIA A100-SXM4-40GB", 1), CannedNode("big", "NVIDIA A100-SXM4-80GB", 1))


async def test_a_gpu_oom_is_retried_on_a_bigger_gpu(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=FLEET) as lab:
        filler = await lab.submit("sleep", "600", gpus=1)
        await lab.round()
        assert (await lab.job(filler.id)).placement[0].node == "big"  # the faster A100 first
        job = await lab.submit("python3", "train.py", gpus=1, retries=1)
        await lab.round()
        assert (await lab.job(job.id)).placement[0].node == "small"
        (run,) = await lab.runs(job.id)
        lab.executors["small"].finish(run.run_dir, 1, gpu_oom=TORCH)
        await lab.round()
        j = await lab.job(job.id)
        assert j.state.value == "PENDING" and j.reason == "BeginTime"
        small_mib = lab.ctl.nodes["small"].node.devices[0].memory_total_mib
        assert j.spec.resources.gpu_memory_mib == small_mib + 1
        events = await lab.ctl.db(lab.ctl.store.events, job.id)
        assert [e for e in events if e["kind"] == "gpu_oom"]
        (ended,) = await lab.runs(job.id)
        assert ended.reason == "gpu_oom"
        # the backoff over, it waits for the big GPU though the small one is free
        lab.clock.advance(60.0)
        await lab.round()
        assert (await lab.job(job.id)).state.value == "PENDING"
        await lab.finish(filler.id, 0)
        await lab.round()
        await lab.round()
        j = await lab.job(job.id)
        assert j.state.value in ("LAUNCHING", "RUNNING") and j.placement[0].node == "big"
        shown = await Api(lab.ctl).handle("show", {"id": job.id}, os.getuid())
        assert "out of GPU memory" in json.dumps(shown["events"])


async def test_without_retries_it_fails_as_gpu_oom(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=FLEET[1:]) as lab:
        job = await lab.submit("python3", "train.py", gpus=1)
        await lab.round()
        (run,) = await lab.runs(job.id)
        lab.executors["big"].finish(run.run_dir, 1, gpu_oom=TORCH)
        await lab.round()
        j = await lab.job(job.id)
        assert (j.state.value, j.reason) == ("FAILED", "gpu_oom")


async def test_a_job_without_a_request_gets_its_kinds_learned_peak(tmp_path: Path) -> None:
    """The kind's runs peaked at 30 GiB of GPU memory: its next job asks for that plus a margin, so it is never
    given a GPU too small; a job that names its own request keeps it."""
    import dataclasses

    from hsched.controller.health import record_sample
    from hsched.controller.launching import job_cache
    from hsched.controller.usage import observe

    async with Lab.open(tmp_path, nodes=FLEET) as lab:
        api = Api(lab.ctl)
        spec = {"command": ["python3", "infer.py", "--model", "llm"], "resources": {"gpus": 1}}
        first = await api.handle("submit", {"spec": spec}, os.getuid())
        await lab.round()
        job = await lab.job(first["id"])
        node = job.placement[0].node
        (uuid,) = job.placement[0].devices
        rt = lab.ctl.nodes[node]
        rt.node = dataclasses.replace(rt.node, devices=tuple(dataclasses.replace(d, simulated=False)
                                                             for d in rt.node.devices))
        (run,) = await lab.runs(job.id)
        for used in (10_000, 30_720, 20_000):
            lab.clock.advance(1.0)
            s = {"seq": 1, "boot_id": "b", "gpus": {"source": "nvml", "devices": [
                {"uuid": uuid, "utilization_gpu": 50.0, "memory_used_mib": used}]}, "gpu_error": None,
                 "processes": [{"pid": 7, "uuid": uuid, "used_memory_mib": used, "name": "python3",
                                "run_dir": run.run_dir, "cpu_percent": 100.0, "rss_mib": 2000}]}
            await lab.ctl.db(job_cache(lab.ctl).read, lab.ctl.store)
            record_sample(rt, s, lab.clock.time())
            observe(lab.ctl, rt, s, lab.clock.time())
        await lab.finish(job.id, 0)
        await lab.round()
        await lab.settle_tasks()
        second = await api.handle("submit", {"spec": spec}, os.getuid())
        j2 = await lab.job(second["id"])
        assert j2.spec.resources.gpu_memory_mib == int(30_720 * 1.1) + 1
        own = await api.handle("submit", {"spec": {**spec, "resources": {"gpus": 1, "gpu_memory": "20GiB"}}},
                               os.getuid())
        assert (await lab.job(own["id"])).spec.resources.gpu_memory_mib == 20 * 1024


async def test_a_retry_never_asks_for_more_than_the_gpus_it_may_use(tmp_path: Path) -> None:
    # issue 29: a 4090 job's retry asked for 1 MiB more than any 4090 (an H100 has more, but not one it may use) and
    # waited PENDING (Resources) for ever; the raise is checked as a submit is, and the retry runs on the same size
    nodes = (CannedNode("ws", "NVIDIA GeForce RTX 4090", 1), CannedNode("big", "NVIDIA H100 80GB HBM3", 1))
    async with Lab.open(tmp_path, nodes=nodes) as lab:
        spec = {"command": ["python3", "train.py"], "retries": 1, "resources": {"gpus": 1, "gpu_types": ["4090"]}}
        job_id = (await Api(lab.ctl).handle("submit", {"spec": spec}, os.getuid()))["id"]
        await lab.round()
        (run,) = await lab.runs(job_id)
        assert run.node == "ws"
        lab.executors["ws"].finish(run.run_dir, 1, gpu_oom=TORCH)
        await lab.round()
        j = await lab.job(job_id)
        assert j.reason == "BeginTime" and j.spec.resources.gpu_memory_mib is None  # not raised past any 4090
        events = [e["message"] for e in await lab.ctl.db(lab.ctl.store.events, job_id) if e["kind"] == "gpu_oom"]
        assert any("no GPU of the GPUs this job may use has more" in m for m in events), events
        lab.clock.advance(60.0)
        await lab.round()
        j = await lab.job(job_id)
        assert j.state.value in ("LAUNCHING", "RUNNING") and j.placement[0].node == "ws"
