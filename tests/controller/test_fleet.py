"""The controller's fleet view: simulated nodes and real probes turned into Nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from hsched.config import load_fleet
from hsched.controller.fleet import build_fleet, node_from_probe
from hsched.model import NodeState, Resources
from hsched.sched.live import FleetView, Launch, Wait, schedule, unsatisfiable
from hsched.simulated import simulated_uuid

LAB = Path(__file__).resolve().parents[2] / "examples" / "lab" / "fleet.toml"


def test_lab_fleet_has_topology() -> None:
    nodes = build_fleet(load_fleet(LAB))
    dgx = nodes["dgx-h100"].node
    assert len(dgx.devices) == 8 and dgx.devices[0].uuid == simulated_uuid("dgx-h100", 0)
    assert {lk.kind for lk in dgx.links} == {"NV18"}
    assert [d.numa_node for d in dgx.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    a100 = nodes["a100-box"].node
    assert {lk.kind for lk in a100.links} >= {"PIX", "SYS"}


def test_real_probe_with_nvml_gives_uuids_memory_and_nvlinks() -> None:
    import sys

    from hsched.topo import nvml_probe

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "topo"))
    from test_topo_nvml import h100_fake  # the fake pynvml fed from the real H100 captures

    raw = nvml_probe.probe_nvml(h100_fake(), cpu_count=224)
    raw["source"] = "nvml"
    rt = next(iter(build_fleet(load_fleet(None)).values()))
    node = node_from_probe(rt, {"cpus": 224, "memory_total_mib": 2_000_000, "numa": [{}, {}], "gpus": raw})
    assert len(node.devices) == 8
    assert all(d.uuid.startswith("GPU-") for d in node.devices)
    assert node.devices[0].memory_total_mib and node.devices[0].memory_total_mib > 80_000
    assert {lk.kind for lk in node.links} == {"NV18"}
    assert len(node.links) == 28


def test_schedule_places_nvlink_jobs_on_nvlinked_gpus_and_waits_otherwise() -> None:
    from dataclasses import replace

    nodes = [replace(rt.node, state=NodeState.UP) for rt in build_fleet(load_fleet(LAB)).values()]
    from hsched.model import Interconnect, Job, JobSpec, JobState

    def job(i: int, **res: object) -> Job:
        return Job(id=i, spec=JobSpec(command=("x",), resources=Resources(**res)), user="u",  # type: ignore[arg-type]
                   state=JobState.PENDING, reason="", submit_time=float(i))

    view = FleetView(nodes=tuple(nodes), busy=frozenset(), cpus_used={})
    d = schedule(view, [job(1, gpus=4, interconnect=Interconnect.NVLINK), job(2, gpus=2, gpu_types=("a100",)),
                        job(3, gpus=8, interconnect=Interconnect.NVLINK)], 0.0)
    assert isinstance(d[0], Launch) and d[0].placements[0].node == "dgx-h100"
    assert "NV18" in d[0].placements[0].explanation
    assert isinstance(d[1], Launch) and d[1].placements[0].node == "a100-box"
    assert isinstance(d[2], Wait)  # 4 of the 8 NVLinked GPUs are taken by job 1
    assert unsatisfiable(Resources(gpus=4, interconnect=Interconnect.NVLINK, gpu_types=("a100",)), nodes)
    assert unsatisfiable(Resources(gpus=8, interconnect=Interconnect.NVLINK), nodes) is None


def test_live_policy_sends_jobs_to_their_fastest_gpu_type_and_honours_priority() -> None:
    from dataclasses import replace

    from hsched.model import Job, JobSpec, JobState

    nodes = [replace(rt.node, state=NodeState.UP) for rt in build_fleet(load_fleet(LAB)).values()]

    def job(i: int, prio: int = 0, **res: object) -> Job:
        return Job(id=i, spec=JobSpec(command=("x",), priority=prio, resources=Resources(**res)),  # type: ignore[arg-type]
                   user="u", state=JobState.PENDING, reason="", submit_time=float(i))

    view = FleetView(nodes=tuple(nodes), busy=frozenset(), cpus_used={}, policy="hsched")
    d = schedule(view, [job(1, gpus=1)], 0.0)
    assert isinstance(d[0], Launch) and d[0].placements[0].node == "dgx-h100"  # H100 is the fastest type here
    # with every H100 taken, a later job still goes to the next fastest type that is free
    busy = frozenset(dev.uuid for dev in nodes[0].devices)
    d = schedule(replace(view, busy=busy), [job(2, gpus=2)], 0.0)
    assert isinstance(d[0], Launch) and d[0].placements[0].node == "a100-box"
    # priority inside a class beats submit order
    d = schedule(replace(view, busy=busy), [job(3, gpus=4), job(4, prio=5, gpus=4)], 0.0)
    by_id = {x.job_id: x for x in d}
    assert isinstance(by_id[4], Launch) and isinstance(by_id[3], Wait)
    assert d[0].job_id == 4  # considered first


def test_a_resumed_job_goes_back_to_the_node_holding_its_checkpoint(tmp_path: Path) -> None:
    from dataclasses import replace

    from hsched.model import Job, JobSpec, JobState

    fleet = tmp_path / "fleet.toml"
    fleet.write_text("".join(f'[[node]]\nname = "{n}"\n[node.simulate]\nmodel = "NVIDIA A100-SXM4-80GB"\n'
                             'count = 4\ntopology = "nvswitch"\n' for n in ("a", "b")))
    nodes = [replace(rt.node, state=NodeState.UP) for rt in build_fleet(load_fleet(fleet)).values()]
    job = Job(id=1, spec=JobSpec(command=("x",), resources=Resources(gpus=2)), user="u", state=JobState.PENDING,
              reason="", submit_time=0.0, restarts=1)
    for policy in ("hsched", None):
        view = FleetView(nodes=tuple(nodes), busy=frozenset(), cpus_used={}, policy=policy)
        first = schedule(view, [job], 0.0)[0]
        assert isinstance(first, Launch) and first.placements[0].node == "a"
        back = schedule(replace(view, prefer={1: "b"}), [job], 0.0)[0]
        assert isinstance(back, Launch) and back.placements[0].node == "b"


@pytest.mark.parametrize(("res", "words"), [
    ({"gpus": 1, "memory_mib": 10 * 1024 * 1024}, "no node has 10T of memory (largest: "),
    ({"gpus": 1, "cpus": 500}, "no node has 500 CPUs (largest: "),
    ({"gpus": 1, "gpu_memory_mib": 1024 * 1024}, "no GPU has 1.1 TB of memory (largest: "),
    ({"gpus": 1, "nodes": 40}, "needs 40 nodes but the fleet has"),
])
def test_a_request_too_large_names_the_resource_and_the_largest(res: dict[str, int], words: str) -> None:
    from dataclasses import replace

    nodes = [replace(rt.node, state=NodeState.UP) for rt in build_fleet(load_fleet(LAB)).values()]
    why = unsatisfiable(Resources(**res), nodes)  # type: ignore[arg-type]
    assert why is not None and words in why and "GPU" not in why.split("(")[0].replace("no GPU has", "")
