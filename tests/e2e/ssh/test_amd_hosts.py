"""Two alike AMD machines over SSH (issue 32's naming, found in issue 33's review): real sshd test hosts, each with a
host name of its own and the MI300X box's captured `amd-smi` on its PATH (tests/fixtures/amdbin/mi300x), probed by
the SSH executor and read by the controller as it reads any node. amd-smi gives these GPUs no Unique ID, so each is
named by its PCI address, the same on both machines: the names carry the machine's own host name, and a job holding
one machine's GPUs leaves the other's free."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hsched.config import NodeConfig
from hsched.controller.fleet import NodeRuntime, node_from_probe
from hsched.model import Job, JobSpec, JobState, Node, NodeState, Resources
from hsched.sched.live import FleetView, Launch, Running, schedule
from tests.e2e.ssh.conftest import run
from tests.e2e.ssh.hosts import TestHosts, sshd_available, uts_available

pytestmark = pytest.mark.slow  # real sshd hosts and processes

AMDBIN = Path(__file__).resolve().parents[2] / "fixtures" / "amdbin"


@pytest.fixture(scope="module")
def amd_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestHosts]:
    if not sshd_available() or not uts_available():
        pytest.skip("sshd, ssh-keygen and root (a host name per test host: unshare --uts) are needed")
    # the stub tools first, then this Python's folder (the helper's python3 and the stub's) and the basics: no
    # nvidia-smi, no GPU tool of this machine
    path = ":".join([str(AMDBIN / "mi300x"), str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    with TestHosts(tmp_path_factory.mktemp("amdhosts"), count=2, prefix="amdbox", session_env={"PATH": path},
                   own_hostname=True) as hosts:
        yield hosts


def probed_nodes(hosts: TestHosts) -> list[Node]:
    """Each host probed over SSH and made a node as the controller makes one from its probe."""
    async def main() -> list[dict]:  # type: ignore[type-arg]
        exs = [hosts.executor(h) for h in hosts]
        try:
            return list(await asyncio.gather(*(ex.probe() for ex in exs)))  # type: ignore[attr-defined]
        finally:
            for ex in exs:
                await ex.close()

    out = []
    for h, probe in zip(hosts, run(main()), strict=True):
        cfg = NodeConfig(name=h.name, executor="ssh", host=h.name)
        rt = NodeRuntime(config=cfg, executor=None,  # type: ignore[arg-type]  # (not asked again)
                         node=Node(h.name, "ssh", NodeState.PROBING, host=h.name))
        out.append(node_from_probe(rt, probe))
    return out


def job(i: int, gpus: int) -> Job:
    return Job(i, JobSpec(command=("train.py",), resources=Resources(gpus=gpus)), "alice", JobState.PENDING, "",
               float(i))


def test_two_alike_amd_machines_name_their_gpus_apart_and_a_job_on_one_leaves_the_others_free(
        amd_hosts: TestHosts) -> None:
    a, b = probed_nodes(amd_hosts)
    for node in (a, b):
        assert len(node.devices) == 8 and {d.model for d in node.devices} == {"MI300X-O"}
        # by PCI address, as the capture gives them, after the host's own name
        assert all(d.uuid.startswith(f"AMD-{node.name}-0000") for d in node.devices), [d.uuid for d in node.devices]
        assert len(node.links) == 28  # the XGMI hive, from the captured topology
    assert [d.pci_bus_id for d in a.devices] == [d.pci_bus_id for d in b.devices]  # alike machines
    assert not {d.uuid for d in a.devices} & {d.uuid for d in b.devices}

    up = [Node(n.name, "ssh", NodeState.UP, cpus=n.cpus, devices=n.devices, links=n.links, host=n.host)
          for n in (a, b)]
    first = schedule(FleetView(tuple(up), frozenset(), {}, ()), [job(1, 8)], 1.0)[0]
    assert isinstance(first, Launch) and [p.node for p in first.placements] == [a.name]
    holding = Running(Job(1, JobSpec(command=("train.py",), resources=Resources(gpus=8)), "bob", JobState.RUNNING, "",
                          0.0, placement=first.placements), 1.0)
    busy = frozenset(u for p in first.placements for u in p.devices)
    for policy in (None, "hsched"):
        got = schedule(FleetView(tuple(up), busy, {}, (holding,), policy=policy),
                       [job(10 + k, 1) for k in range(8)], 2.0)
        # all eight start, every one on the other machine: none waits behind its namesake's busy GPU
        assert all(isinstance(d, Launch) for d in got), (policy, got)
        assert {p.node for d in got for p in d.placements} == {b.name}, policy  # type: ignore[union-attr]
