"""AMD GPUs live (issue 32) through the real controller: a fleet of an MI300X node (amd-smi), an MI210 node
(rocm-smi) and an NVIDIA node. The AMD nodes' probe replies are what the node helper's probe returns with the stub
tools of tests/fixtures/amdbin on PATH (real captures); a 4-GPU job on the MI300X node gets an XGMI-connected set
and ROCR_VISIBLE_DEVICES/HIP_VISIBLE_DEVICES, the NVIDIA job CUDA_VISIBLE_DEVICES as before, by --gpu-type."""

from __future__ import annotations

import asyncio
import os
import sys
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest

from hsched.config import FleetConfig, NodeConfig
from hsched.controller import commands
from hsched.controller.health import check_health, record_sample
from hsched.controller.loops import one_round
from hsched.model import JobSpec, JobState, NodeState, Resources
from hsched.node.probe import probe_gpus
from hsched.testing import FakeClock, FakeExecutor
from tests.controller.probed import probed_controller

pytestmark = pytest.mark.slow  # the stub tools are processes

AMDBIN = Path(__file__).resolve().parent.parent / "fixtures" / "amdbin"


class ProbedNode(FakeExecutor):
    """A node whose probe reports `gpus` (the real helper probe's reply), everything else faked."""

    def __init__(self, gpus: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gpus = gpus

    async def probe(self, *, gpu_timeout_s: float = 10.0) -> dict[str, Any]:
        reply = await super().probe(gpu_timeout_s=gpu_timeout_s)
        reply["gpus"] = self.gpus
        return reply


def helper_probe(monkeypatch: pytest.MonkeyPatch, machine: str) -> dict[str, Any]:
    with monkeypatch.context() as m:
        m.setenv("PATH", os.pathsep.join([str(AMDBIN / machine), os.path.dirname(sys.executable), "/usr/bin", "/bin"]))
        m.setitem(sys.modules, "pynvml", None)  # type: ignore[arg-type]
        return probe_gpus()


NVIDIA = {"source": "nvidia-smi", "devices": [
    {"uuid": f"GPU-h100-{i}", "index": i, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559,
     "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0", "numa_node": 0} for i in range(4)]}


async def test_a_mixed_fleet_places_amd_jobs_on_xgmi_sets_with_rocm_variables(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probes = {"mi300x": helper_probe(monkeypatch, "mi300x"), "mi210": helper_probe(monkeypatch, "mi210"),
              "h100": NVIDIA}
    cfg = FleetConfig(nodes=tuple(NodeConfig(name=n, executor="local") for n in probes), source="<test>")
    clock = FakeClock()
    executors = {n: ProbedNode(g, name=n, cpus=64, clock=clock.time, monotonic=clock.monotonic)
                 for n, g in probes.items()}
    async with probed_controller(tmp_path, cfg, executors, clock) as ctl:
        for rt in ctl.nodes.values():
            record_sample(rt, {"seq": 0, "gpus": {"devices": []}, "processes": []}, clock.time(),
                          seen=clock.monotonic())
        await check_health(ctl)
        mi300x, mi210 = ctl.nodes["mi300x"].node, ctl.nodes["mi210"].node
        assert mi300x.state is NodeState.UP and mi210.state is NodeState.UP
        assert [d.model for d in mi300x.devices] == ["MI300X-O"] * 8
        assert [d.numa_node for d in mi300x.devices] == [0] * 4 + [1] * 4
        assert len(mi300x.links) == 28 and {lk.kind for lk in mi300x.links} == {"XGMI"}
        assert [d.numa_node for d in mi210.devices] == [3, 2, 1, 0, 7, 6, 5, 4] and mi210.links == ()

        jobs = {}
        for name, gpu_type in (("amd4", "MI300X-O"), ("amd4b", "MI300X-O"), ("nv2", "NVIDIA H100 80GB HBM3"),
                               ("mi210", "Instinct MI210")):
            spec = JobSpec(command=("true",), name=name,
                           resources=Resources(gpus=4 if name.startswith("amd") else 2, gpu_types=(gpu_type,)))
            jobs[name] = await commands.submit(ctl, spec, "alice", None)
        await one_round(ctl)
        while ctl._tasks:
            await asyncio.gather(*list(ctl._tasks), return_exceptions=True)

        def launched(job_id: int) -> tuple[str, Any]:
            [(node, run)] = [(n, r) for n, ex in executors.items() for r in ex.runs.values()
                             if r.request.env.get("HSCHED_JOB_ID") == str(job_id)]
            return node, run.request

        xgmi = {frozenset((lk.a, lk.b)) for lk in mi300x.links if lk.kind == "XGMI"}
        index = {d.uuid: d.index for d in mi300x.devices}
        taken: set[str] = set()
        for name in ("amd4", "amd4b"):
            assert (await ctl.get(jobs[name].id)).state is JobState.RUNNING
            node, req = launched(jobs[name].id)
            assert node == "mi300x" and len(req.devices) == 4
            assert all(frozenset(p) in xgmi for p in combinations(req.devices, 2))  # an XGMI-connected set
            # one NUMA node's four: the hive is all-to-all, so the CPU side decides
            assert len({mi300x.device(u).numa_node for u in req.devices}) == 1  # type: ignore[union-attr]
            assert req.env["ROCR_VISIBLE_DEVICES"] == ",".join(str(index[u]) for u in req.devices)
            assert req.env["HIP_VISIBLE_DEVICES"] == "0,1,2,3"
            assert "CUDA_VISIBLE_DEVICES" not in req.env
            taken |= set(req.devices)
        assert len(taken) == 8
        node, req = launched(jobs["nv2"].id)
        assert node == "h100" and req.env["CUDA_VISIBLE_DEVICES"] == ",".join(req.devices)
        assert "ROCR_VISIBLE_DEVICES" not in req.env and "HIP_VISIBLE_DEVICES" not in req.env
        node, req = launched(jobs["mi210"].id)
        assert node == "mi210" and req.env["HIP_VISIBLE_DEVICES"] == "0,1"
        assert len(req.env["ROCR_VISIBLE_DEVICES"].split(",")) == 2


def helper_watch_sample(machine: str) -> dict[str, Any]:
    """One sample of the real node helper's watch on `machine`'s stub tools."""
    import json
    import subprocess

    env = dict(os.environ, PATH=os.pathsep.join([str(AMDBIN / machine), os.path.dirname(sys.executable),
                                                 "/usr/bin", "/bin"]))
    helper = Path(__file__).resolve().parents[2] / "hsched" / "node" / "nodehelper.py"
    out = subprocess.run([sys.executable, str(helper), "watch"], input=json.dumps({"interval_s": 0.2, "count": 1}),
                         capture_output=True, text=True, timeout=120, env=env, check=True)
    sample: dict[str, Any] = json.loads(out.stdout.splitlines()[0])
    return sample


async def test_a_process_the_watch_lists_on_an_amd_gpu_keeps_that_gpu_from_jobs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """amd-smi process (a real capture) says pid 2266127 is on the MI300X node's GPU 0: the controller takes it
    as a foreign process: a 4-GPU job gets four of the other seven, and a second one waits."""
    gpus = helper_probe(monkeypatch, "mi300x")
    sample = helper_watch_sample("mi300x")
    gpu0 = next(d["uuid"] for d in gpus["devices"] if d["index"] == 0)
    assert [(p["uuid"], p["pid"]) for p in sample["processes"]] == [(gpu0, 2266127)]
    cfg = FleetConfig(nodes=(NodeConfig(name="mi300x", executor="local"),), source="<test>")
    clock = FakeClock()
    ex = ProbedNode(gpus, name="mi300x", cpus=64, clock=clock.time, monotonic=clock.monotonic)
    async with probed_controller(tmp_path, cfg, {"mi300x": ex}, clock) as ctl:
        record_sample(ctl.nodes["mi300x"], sample, clock.time(), seen=clock.monotonic())
        await check_health(ctl)
        assert set(ctl.nodes["mi300x"].foreign) == {gpu0}
        four = await commands.submit(ctl, JobSpec(command=("true",), name="four", resources=Resources(gpus=4)),
                                     "alice", None)
        await one_round(ctl)
        while ctl._tasks:
            await asyncio.gather(*list(ctl._tasks), return_exceptions=True)
        assert (await ctl.get(four.id)).state is JobState.RUNNING
        [run] = list(ex.runs.values())
        assert len(run.request.devices) == 4 and gpu0 not in run.request.devices
        # three GPUs are left, GPU 0 among them: a 4-GPU job waits (it would run, were GPU 0 free)
        more = await commands.submit(ctl, JobSpec(command=("true",), name="more", resources=Resources(gpus=4)),
                                     "alice", None)
        await one_round(ctl)
        assert (await ctl.get(more.id)).state is JobState.PENDING
