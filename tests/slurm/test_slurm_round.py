"""The scheduling round over a Slurm node group (issue 17), in process: a gang goes whole to one group, each of its
shares on another Slurm node of the group (one `sbatch --nodes=N` starts it), never across a group and another
node; any job's share of a group is on one Slurm node (sbatch's --gpus-per-node is per Slurm node); and
`unsatisfiable` counts a group's Slurm nodes for a gang."""

from __future__ import annotations

import pytest

from hsched.model import Device, Job, JobSpec, JobState, Node, NodeState, Placement, Resources
from hsched.sched.live import FleetView, Launch, Wait, schedule, unsatisfiable

POLICIES = (None, "hsched")


def group(name: str = "cluster", slurm_nodes: tuple[str, ...] = ("n1", "n2"), gpus: int = 2,
          model: str = "a100", cpus: int = 8) -> Node:
    """A Slurm node group as the Slurm executor's probe makes it: one device per GPU of each Slurm node, named
    slurm-<group>-<slurm node>-gpu<index>."""
    devices = tuple(Device(f"slurm-{name}-{sn}-gpu{i}", k * gpus + i, model, host=sn)
                    for k, sn in enumerate(slurm_nodes) for i in range(gpus))
    return Node(name, "slurm", NodeState.UP, cpus=cpus * len(slurm_nodes), memory_total_mib=4000 * len(slurm_nodes),
                devices=devices)


def workstation(name: str, gpus: int = 1, model: str = "a100") -> Node:
    return Node(name, "ssh", NodeState.UP, cpus=8, memory_total_mib=4000,
                devices=tuple(Device(f"GPU-{name}-{i}", i, model) for i in range(gpus)))


def job(jid: int, gpus: int = 1, nodes: int = 1, cpus: int | None = None) -> Job:
    res = Resources(gpus=gpus, nodes=nodes, cpus=cpus)
    return Job(jid, JobSpec(command=("x",), resources=res), "alice", JobState.PENDING, "", float(jid))


def decide(nodes: tuple[Node, ...], jobs: list[Job], policy: str | None, busy: frozenset[str] = frozenset(),
           cpus_used: dict[str, int] | None = None) -> dict[int, Launch | Wait]:
    got = schedule(FleetView(nodes, busy, cpus_used or {}, policy=policy), jobs, 0.0)
    return {d.job_id: d for d in got if isinstance(d, Launch | Wait)}


def slurm_node(p: Placement) -> set[str]:
    return {u.split("-")[2] for u in p.devices}


@pytest.mark.parametrize("policy", POLICIES)
def test_a_gang_of_two_nodes_goes_whole_to_the_group_one_share_per_slurm_node(policy: str | None) -> None:
    g = group()
    got = decide((g, workstation("ws1")), [job(1, gpus=1, nodes=2)], policy)
    d = got[1]
    assert isinstance(d, Launch), got
    assert [p.node for p in d.placements] == ["cluster", "cluster"]
    assert [len(p.devices) for p in d.placements] == [1, 1]
    assert slurm_node(d.placements[0]) | slurm_node(d.placements[1]) == {"n1", "n2"}
    # two GPUs per share: each Slurm node's pair
    d2 = decide((g,), [job(2, gpus=2, nodes=2)], policy)[2]
    assert isinstance(d2, Launch) and sorted(sorted(p.devices) for p in d2.placements) == [
        ["slurm-cluster-n1-gpu0", "slurm-cluster-n1-gpu1"], ["slurm-cluster-n2-gpu0", "slurm-cluster-n2-gpu1"]]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_gang_never_spans_a_group_and_another_node(policy: str | None) -> None:
    g = group()
    # n2's GPUs are taken: the group has one Slurm node with room, the workstation another; no launch
    busy = frozenset({"slurm-cluster-n2-gpu0", "slurm-cluster-n2-gpu1"})
    got = decide((g, workstation("ws1")), [job(1, gpus=1, nodes=2)], policy, busy)
    assert isinstance(got[1], Wait), got
    # with a second workstation it goes to the two workstations, not to the group
    got = decide((g, workstation("ws1"), workstation("ws2")), [job(1, gpus=1, nodes=2)], policy, busy)
    d = got[1]
    assert isinstance(d, Launch) and [p.node for p in d.placements] == ["ws1", "ws2"], got
    # two free GPUs on ONE Slurm node are no room for a gang of two nodes
    busy = frozenset({"slurm-cluster-n2-gpu0", "slurm-cluster-n2-gpu1"})
    got = decide((group(gpus=2),), [job(1, gpus=1, nodes=2)], policy, busy)
    assert isinstance(got[1], Wait), got


@pytest.mark.parametrize("policy", POLICIES)
def test_a_gang_counts_its_cpus_once_per_share_on_the_group(policy: str | None) -> None:
    g = group(cpus=4)  # 8 CPUs in all
    assert isinstance(decide((g,), [job(1, gpus=1, nodes=2, cpus=4)], policy)[1], Launch)
    got = decide((g,), [job(1, gpus=1, nodes=2, cpus=4)], policy, cpus_used={"cluster": 1})
    assert isinstance(got[1], Wait), got


@pytest.mark.parametrize("policy", POLICIES)
def test_a_job_of_one_node_is_on_one_slurm_node_best_fit_first(policy: str | None) -> None:
    g = group()
    # n1 has one GPU free, n2 two: two GPUs go to n2 (never one of each), one GPU to n1 (n2 stays whole)
    busy = frozenset({"slurm-cluster-n1-gpu0"})
    got = decide((g,), [job(1, gpus=2)], policy, busy)
    d = got[1]
    assert isinstance(d, Launch) and slurm_node(d.placements[0]) == {"n2"}, got
    d = decide((g,), [job(2, gpus=1)], policy, busy)[2]
    assert isinstance(d, Launch) and d.placements[0].devices == ("slurm-cluster-n1-gpu1",)
    # three GPUs free over two Slurm nodes: no Slurm node has two
    busy = frozenset({"slurm-cluster-n1-gpu0"})
    got = decide((group(slurm_nodes=("n1", "n2"), gpus=2),), [job(3, gpus=2)],
                 policy, busy | {"slurm-cluster-n2-gpu1"})
    assert isinstance(got[3], Wait), got


def test_unsatisfiable_counts_a_groups_slurm_nodes_for_a_gang() -> None:
    g = group(slurm_nodes=("n1", "n2", "n3"))
    assert unsatisfiable(Resources(gpus=1, nodes=3), [g]) is None
    assert unsatisfiable(Resources(gpus=2, nodes=2), [g, workstation("ws1")]) is None
    assert unsatisfiable(Resources(gpus=4, nodes=3), [g]) == (
        "needs 3 nodes each with 4 GPU(s), but only 0 node(s) of the fleet qualify; lower --nodes/--gpus or add nodes")
    assert unsatisfiable(Resources(gpus=1, nodes=4), [g, workstation("ws1")]) == (
        "needs 4 nodes but the fleet has 3 that one job may use (its nodes are all on one Slurm node group or all "
        "elsewhere); lower --nodes or add nodes")
    # the group's nodes and a workstation never add up for one gang
    uneven = group(slurm_nodes=("n1", "n2"))
    uneven = Node(uneven.name, uneven.executor, uneven.state, devices=uneven.devices[:3])  # n2 has one GPU
    assert unsatisfiable(Resources(gpus=2, nodes=2), [uneven, workstation("ws1", 2)]) == (
        "needs 2 nodes each with 2 GPU(s), but only 1 node(s) of the fleet qualify (and 1 of Slurm group "
        "cluster's nodes: one job's nodes are all on one group); lower --nodes/--gpus or add nodes")
    # without a group: as ever
    assert unsatisfiable(Resources(gpus=1, nodes=2), [workstation("ws1")]) == (
        "needs 2 nodes but the fleet has 1; lower --nodes or add nodes")


def test_unsatisfiable_a_job_of_one_node_must_fit_one_slurm_node() -> None:
    g = group()  # 2 Slurm nodes of 2 GPUs: 4 GPUs, at most 2 on one
    assert unsatisfiable(Resources(gpus=2), [g]) is None
    assert unsatisfiable(Resources(gpus=3), [g]) == (
        "needs 3 GPU(s) on one node, but no node of the fleet has that (the most any node offers is 2); lower "
        "--gpus, change --gpu-type or add a node")


@pytest.mark.parametrize("policy", POLICIES)
def test_a_gang_only_a_group_can_hold_is_reserved_for_and_not_starved(policy: str | None) -> None:
    """n2 is full until t=1000 (a running job's predicted end); the gang of two needs a share on n1 and on n2: it is
    reserved for (one GPU of each), so of two one-GPU jobs behind it with no known end, one takes n1's other GPU and
    the other waits, rather than both taking n1 and the gang waiting for ever."""
    from hsched.sched.live import Running

    g = group()
    n2 = ("slurm-cluster-n2-gpu0", "slurm-cluster-n2-gpu1")
    held = Job(9, JobSpec(command=("x",), resources=Resources(gpus=2)), "bob", JobState.RUNNING, "", 0.0,
               start_time=0.0, placement=(Placement("cluster", n2),))
    view = FleetView((g,), frozenset(n2), {}, running=(Running(held, 0.0),), policy=policy, ends={9: 1000.0})
    got = {d.job_id: d for d in schedule(view, [job(1, gpus=1, nodes=2), job(2), job(3)], 0.0)}
    gang = got[1]
    assert isinstance(gang, Wait) and gang.reason.startswith("Resources (reserved on cluster from"), got
    assert isinstance(got[2], Launch) and isinstance(got[3], Wait), got
