"""The live round's lab rules, pure (hsched.sched.live): node labels and --constraint, users absent on a node,
QoS caps (and that they bind preemption too), GPU model aliases, fair share from handed-in usage. Each rule is
checked with a policy (the core's round) and without (QoS/priority/FIFO with backfill), where both apply."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from hsched.config import DEFAULT_QOS_TABLE, SimulatedDevices
from hsched.model import EndReason, Job, JobSpec, JobState, Node, NodeState, Placement, Resources
from hsched.sched.limits import QosLimits, Tally, never_within
from hsched.sched.live import FleetView, Launch, PreemptRule, Running, Wait, schedule, unsatisfiable
from hsched.sched.view import Preempt
from hsched.simulated import simulated_devices

POLICIES = ("hsched", None)


def node(name: str, gpus: int = 4, model: str = "NVIDIA A100-SXM4-80GB") -> Node:
    devices, links = simulated_devices(name, SimulatedDevices(model=model, count=gpus, topology="nvswitch"))
    return Node(name, "fake", NodeState.UP, cpus=64, memory_total_mib=256 * 1024, devices=devices, links=links)


def job(i: int, user: str = "alice", gpus: int = 1, qos: str = "normal", t: float | None = None,
        **res: object) -> Job:
    return Job(i, JobSpec(command=("x",), qos=qos, resources=Resources(gpus=gpus, **res)),  # type: ignore[arg-type]
               user, JobState.PENDING, "", float(i) if t is None else t)


def running(j: Job, n: Node, devices: Sequence[int], started: float = 0.0) -> Running:
    placed = (Placement(n.name, tuple(n.devices[k].uuid for k in devices)),)
    return Running(replace(j, state=JobState.RUNNING, start_time=started, placement=placed), started)


def view(nodes: Sequence[Node], runs: Sequence[Running] = (), **kw: object) -> FleetView:
    busy = frozenset(u for r in runs for u in r.devices)
    return FleetView(tuple(nodes), busy, {}, tuple(runs), **kw)  # type: ignore[arg-type]


def by_id(decisions: Sequence[object]) -> dict[int, object]:
    return {d.job_id: d for d in decisions}  # type: ignore[attr-defined]


def where(d: object) -> list[str]:
    assert isinstance(d, Launch), d
    return [p.node for p in d.placements]


# ---------------------------------------------------------------- constraints


@pytest.mark.parametrize("policy", POLICIES)
def test_a_constraint_keeps_a_job_to_nodes_whose_labels_satisfy_it(policy: str | None) -> None:
    nodes = [node("a"), node("b"), node("c")]
    labels = {"a": frozenset({"nvme"}), "b": frozenset({"nvme", "ib"}), "c": frozenset({"bigmem"})}
    v = view(nodes, labels=labels, policy=policy)
    assert where(schedule(v, [job(1, constraint="nvme&ib")], 0.0)[0]) == ["b"]  # AND
    assert where(schedule(v, [job(1, constraint="nvme")], 0.0)[0]) in (["a"], ["b"])
    # OR: with b taken, the other labelled node
    b_busy = [running(job(8), nodes[1], range(4))]
    assert where(schedule(view(nodes, b_busy, labels=labels, policy=policy),
                          [job(2, constraint="ib|bigmem", gpus=4)], 0.0)[0]) == ["c"]
    assert where(schedule(view(nodes, labels=labels, policy=policy),
                          [job(2, constraint="(ib|bigmem)&nvme", gpus=4)], 0.0)[0]) == ["b"]
    # a node full of the constraint's nodes: the job waits though other nodes are free
    full = [running(job(9), nodes[1], range(4))]
    d = by_id(schedule(view(nodes, full, labels=labels, policy=policy), [job(4, constraint="nvme&ib")], 0.0))
    assert isinstance(d[4], Wait) and d[4].reason == EndReason.RESOURCES


@pytest.mark.parametrize("policy", POLICIES)
def test_without_labels_a_constraint_fits_nowhere_and_no_constraint_fits_anywhere(policy: str | None) -> None:
    nodes = [node("a", 1), node("b", 1)]
    d = by_id(schedule(view(nodes, policy=policy), [job(1, constraint="nvme"), job(2), job(3)], 0.0))
    assert isinstance(d[1], Wait) and sorted(where(d[2]) + where(d[3])) == ["a", "b"]


def test_a_gang_needs_every_node_to_satisfy_the_constraint() -> None:
    nodes = [node("a", 2), node("b", 2), node("c", 2)]
    labels = {"a": frozenset({"ib"}), "c": frozenset({"ib"})}
    d = schedule(view(nodes, labels=labels), [job(1, gpus=2, nodes=2, constraint="ib")], 0.0)
    assert sorted(where(d[0])) == ["a", "c"]
    d = schedule(view(nodes, labels={"a": frozenset({"ib"})}), [job(1, gpus=2, nodes=2, constraint="ib")], 0.0)
    assert isinstance(d[0], Wait)


def test_unsatisfiable_names_the_constraint_and_the_labels_there_are() -> None:
    nodes = [node("a"), node("b", 8)]
    labels = {"a": frozenset({"nvme"}), "b": frozenset({"ib"})}
    why = unsatisfiable(Resources(gpus=1, constraint="nvme&ib"), nodes, labels=labels)
    assert why is not None and "--constraint 'nvme&ib'" in why and "labels in this fleet: ib, nvme" in why
    assert unsatisfiable(Resources(gpus=1, constraint="nvme|ib"), nodes, labels=labels) is None
    # the labelled node exists but is too small: the usual message, about the matching nodes
    why = unsatisfiable(Resources(gpus=8, constraint="nvme"), nodes, labels=labels)
    assert why is not None and "the nodes matching --constraint 'nvme'" in why and "most any node offers is 4" in why
    why = unsatisfiable(Resources(gpus=1, constraint="x"), nodes)
    assert why is not None and "no node of this fleet has labels" in why


# ---------------------------------------------------------------- users absent on a node


@pytest.mark.parametrize("policy", POLICIES)
def test_a_job_never_lands_where_its_user_does_not_exist_and_says_so(policy: str | None) -> None:
    nodes = [node("gpu1", 2), node("gpu3", 2)]
    absent = {"gpu3": frozenset({"lab2"})}
    v = view(nodes, absent_users=absent, policy=policy)
    d = by_id(schedule(v, [job(i, "lab2") for i in (1, 2, 3)], 0.0))
    assert where(d[1]) == ["gpu1"] and where(d[2]) == ["gpu1"]
    # gpu3 is free: the only reason job 3 cannot start is that lab2 has no account there
    assert isinstance(d[3], Wait) and d[3].reason == "user lab2 does not exist on node gpu3"
    # another user is placed there as usual
    d = by_id(schedule(v, [job(1, "lab2"), job(2, "lab2"), job(3, "lab1")], 0.0))
    assert where(d[3]) == ["gpu3"]


@pytest.mark.parametrize("policy", POLICIES)
def test_the_absence_is_the_reason_only_when_it_is_why(policy: str | None) -> None:
    nodes = [node("gpu1", 2), node("gpu3", 2)]
    absent = {"gpu3": frozenset({"lab2"})}
    # every GPU taken: lab2's job waits for resources like anyone's, the absence is not why
    runs = [running(job(10, "lab1"), nodes[0], [0, 1]), running(job(11, "lab1"), nodes[1], [0, 1])]
    d = schedule(view(nodes, runs, absent_users=absent, policy=policy), [job(1, "lab2")], 0.0)
    assert isinstance(d[0], Wait) and d[0].reason in (EndReason.RESOURCES, EndReason.PRIORITY)
    # only the node lacking the user could ever hold the request (4 GPUs): that is why, busy or not
    big = [node("gpu1", 2), node("gpu3", 4)]
    runs = [running(job(11, "lab1"), big[1], [0])]
    d = schedule(view(big, runs, absent_users=absent, policy=policy), [job(2, "lab2", gpus=4)], 0.0)
    assert isinstance(d[0], Wait) and d[0].reason == "user lab2 does not exist on node gpu3"


def test_an_absent_user_does_not_preempt_on_that_node() -> None:
    nodes = [node("gpu3", 2)]
    runs = [running(job(10, "lab1", qos="scavenger"), nodes[0], [0, 1])]
    rule = PreemptRule.from_qos(DEFAULT_QOS_TABLE)
    d = schedule(view(nodes, runs, rule=rule, absent_users={"gpu3": frozenset({"lab2"})}),
                 [job(1, "lab2", qos="prod")], 0.0)
    assert isinstance(d[0], Wait) and d[0].reason == "user lab2 does not exist on node gpu3"
    d = schedule(view(nodes, runs, rule=rule), [job(1, "lab2", qos="prod")], 0.0)
    assert isinstance(d[0], Preempt)  # the same request preempts where the user exists


# ---------------------------------------------------------------- QoS caps

LIMITS = {"normal": QosLimits(max_gpus_per_user=2)}


@pytest.mark.parametrize("policy", POLICIES)
def test_max_gpus_per_user_holds_back_the_third_gpu(policy: str | None) -> None:
    nodes = [node("a", 4)]
    v = view(nodes, limits=LIMITS, policy=policy)
    d = by_id(schedule(v, [job(1, "lab1"), job(2, "lab1"), job(3, "lab1"), job(4, "lab2")], 0.0))
    assert isinstance(d[1], Launch) and isinstance(d[2], Launch) and isinstance(d[4], Launch)
    assert isinstance(d[3], Wait) and d[3].reason == "QOSMaxGpuPerUserLimit"
    # what they hold counts: with two running, a third waits even alone in the queue
    runs = [running(job(1, "lab1"), nodes[0], [0]), running(job(2, "lab1"), nodes[0], [1])]
    d = schedule(view(nodes, runs, limits=LIMITS, policy=policy), [job(3, "lab1")], 0.0)
    assert isinstance(d[0], Wait) and d[0].reason == "QOSMaxGpuPerUserLimit"
    # other classes are not capped
    d = schedule(view(nodes, runs, limits=LIMITS, policy=policy), [job(3, "lab1", qos="scavenger")], 0.0)
    assert isinstance(d[0], Launch)


@pytest.mark.parametrize("policy", POLICIES)
def test_max_gpus_and_max_jobs_per_user(policy: str | None) -> None:
    nodes = [node("a", 8)]
    limits = {"normal": QosLimits(max_gpus=3)}
    d = by_id(schedule(view(nodes, limits=limits, policy=policy),
                       [job(1, "lab1"), job(2, "lab2"), job(3, "lab1"), job(4, "lab2")], 0.0))
    assert sum(isinstance(x, Launch) for x in d.values()) == 3
    [waiting] = [x for x in d.values() if isinstance(x, Wait)]
    assert waiting.reason == "QOSGrpGpuLimit"
    limits = {"normal": QosLimits(max_jobs_per_user=1)}
    d = by_id(schedule(view(nodes, limits=limits, policy=policy),
                       [job(1, "lab1", gpus=2), job(2, "lab1", gpus=0), job(3, "lab2", gpus=2)], 0.0))
    assert isinstance(d[1], Launch) and isinstance(d[3], Launch)
    assert isinstance(d[2], Wait) and d[2].reason == "QOSMaxJobsPerUserLimit"  # CPU-only jobs count as jobs


def test_a_waiter_over_its_cap_does_not_preempt() -> None:
    nodes = [node("a", 2)]
    runs = [running(job(10, "lab2"), nodes[0], [0]), running(job(11, "lab2"), nodes[0], [1])]
    rule = PreemptRule.from_qos(DEFAULT_QOS_TABLE)
    limits = {"prod": QosLimits(max_gpus_per_user=1)}
    held = [*runs, running(job(12, "lab1", qos="prod"), node("b", 1), [0])]
    # lab1 already holds its one prod GPU (on another node): its next prod job may not preempt anyone
    d = schedule(view(nodes, held, rule=rule, limits=limits), [job(1, "lab1", qos="prod")], 0.0)
    assert isinstance(d[0], Wait) and d[0].reason == "QOSMaxGpuPerUserLimit"
    # two prod jobs in one round: the first preempts, the second is over the cap and does not
    d = by_id(schedule(view(nodes, runs, rule=rule, limits=limits),
                       [job(1, "lab1", qos="prod"), job(2, "lab1", qos="prod")], 0.0))
    assert isinstance(d[1], Preempt) and isinstance(d[2], Wait) and d[2].reason == "QOSMaxGpuPerUserLimit"


def test_holders_count_jobs_being_stopped_and_launching() -> None:
    nodes = [node("a", 4)]
    launching = replace(job(1, "lab1", gpus=2), state=JobState.LAUNCHING,
                        placement=(Placement("a", tuple(d.uuid for d in nodes[0].devices[:2])),))
    v = view(nodes, limits=LIMITS, holders=(launching,))
    d = schedule(replace(v, busy=frozenset(launching.placement[0].devices)), [job(2, "lab1")], 0.0)
    assert isinstance(d[0], Wait) and d[0].reason == "QOSMaxGpuPerUserLimit"


def test_tally_and_never_within() -> None:
    t = Tally({"normal": QosLimits(2, 1, 1)})
    assert t.blocked(job(1)) is None
    t.add(job(1))
    assert t.blocked(job(2)) == "QOSMaxJobsPerUserLimit" and t.blocked(job(3, "bob")) is None
    t.add(job(3, "bob"))
    assert t.blocked(job(4, "carol")) == "QOSGrpGpuLimit"
    assert t.blocked(job(5, qos="prod")) is None
    caps = QosLimits.from_qos({**DEFAULT_QOS_TABLE})
    assert caps == {}  # the built-in classes have none
    why = never_within(Resources(gpus=4), "normal", {"normal": QosLimits(max_gpus_per_user=2)})
    assert why is not None and "allows 2 per user (max_gpus_per_user)" in why
    assert never_within(Resources(gpus=2, nodes=2), "normal", {"normal": QosLimits(max_gpus=3)}) is not None
    assert never_within(Resources(gpus=2), "normal", {"normal": QosLimits(max_gpus=3)}) is None


# ---------------------------------------------------------------- GPU model aliases


@pytest.mark.parametrize("policy", POLICIES)
def test_an_alias_stands_for_its_models(policy: str | None) -> None:
    nodes = [node("sxm", 1, "NVIDIA A100-SXM4-80GB"), node("pcie", 1, "NVIDIA A100-PCIE-40GB"),
             node("h", 1, "NVIDIA H100 80GB HBM3")]
    aliases = {"big": ("A100-SXM4-80GB", "H100"), "A100": ("A100-PCIE-40GB",)}
    v = view(nodes, gpu_aliases=aliases, policy=policy)
    d = by_id(schedule(v, [job(1, gpu_types=("big",)), job(2, gpu_types=("big",)), job(3, gpu_types=("big",))],
                       0.0))
    assert sorted(where(d[1]) + where(d[2])) == ["h", "sxm"] and isinstance(d[3], Wait)
    # an alias replaces the plain substring meaning, case-insensitively: a100 is the PCIe card only here
    d = schedule(replace(v, busy=frozenset({nodes[1].devices[0].uuid})), [job(4, gpu_types=("a100",))], 0.0)
    assert isinstance(d[0], Wait)
    d = schedule(v, [job(4, gpu_types=("a100",))], 0.0)
    assert where(d[0]) == ["pcie"]
    # without aliases "big" is no model at all
    assert unsatisfiable(Resources(gpus=1, gpu_types=("big",)), nodes) is not None
    assert unsatisfiable(Resources(gpus=1, gpu_types=("big",)), nodes, aliases=aliases) is None
    assert unsatisfiable(Resources(gpus=2, gpu_types=("a100",)), nodes, aliases=aliases) is not None


# ---------------------------------------------------------------- fair share


def test_handed_in_usage_decides_between_users_and_a_user_with_nothing_running_counts() -> None:
    nodes = [node("a", 1)]
    queue = [job(1, "lab1", t=0.0), job(2, "lab1", t=1.0), job(3, "lab2", t=2.0)]
    # no usage handed in and nothing running: submit order
    d = schedule(view(nodes, policy="hsched"), queue, 10.0)
    assert isinstance(d[0], Launch) and d[0].job_id == 1
    # lab1's past usage (from the store, handed in) puts lab2 first
    d = schedule(view(nodes, policy="hsched", user_usage={"lab1": 3600.0}), queue, 10.0)
    assert isinstance(d[0], Launch) and d[0].job_id == 3
    # without history, a user with jobs running is compared with one who only waits
    a = node("a", 2)
    runs = [running(job(9, "lab1"), a, [0], started=0.0)]
    d = by_id(schedule(view([a], runs, policy="hsched"), queue, 3600.0))
    assert isinstance(d[3], Launch) and isinstance(d[1], Wait)
