"""The round as stages over one state (issue 28): no hidden state in the scheduling core, the caller's cache changes no
decision, a Slurm group's hosts come from `Device.host` (no device name is decoded), and stages are what the
pipeline runs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hsched.model import Device, Job, JobSpec, JobState, Node, NodeState, Placement, Resources
from hsched.sched.cache import RoundCache
from hsched.sched.live import FleetView, Launch, Wait, schedule
from hsched.sched.pipeline import STAGES, backfill_stage
from hsched.serialize import device_from_dict, device_to_dict
from tests.sched.test_live_linear import plain, random_case

SCHED = Path(__file__).resolve().parents[2] / "hsched" / "sched"


def _modules() -> list[Path]:
    return sorted(SCHED.rglob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SCHED)))
def test_the_scheduling_core_keeps_no_state_of_its_own(path: Path) -> None:
    """No `global` statement, and no module-level dict, list or set that a function could fill between calls
    (read-only tables are tuples or frozensets; the exceptions are named in `allowed`)."""
    # the policy registry (filled at import time only), and two constant tables typed read-only (Mapping)
    allowed = {("registry.py", "_REGISTRY"), ("throughput.py", "BUILTIN_SPEED_PRIOR"), ("view.py", "QOS_RANK")}
    tree = ast.parse(path.read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Global)], f"{path.name}: a global statement"
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if not isinstance(target, ast.Name) or value is None or target.id == "__all__":
            continue
        mutable = isinstance(value, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp | ast.SetComp)
        assert not mutable or (path.name, target.id) in allowed, f"{path.name}: module-level mutable {target.id}"


def test_no_file_of_the_core_is_a_knot() -> None:
    sizes = {str(p.relative_to(SCHED)): len(p.read_text().splitlines()) for p in _modules()}
    assert max(sizes.values()) <= 500, sizes
    assert sizes["live.py"] < 300


@pytest.mark.parametrize("seed", range(0, 400, 7))
def test_the_callers_cache_changes_no_decision(seed: int) -> None:
    """A round with the cache of earlier rounds (over other fleets, then the same) decides as one from scratch."""
    cache = RoundCache()
    other, other_queue, other_now = random_case(seed + 1)
    schedule(other, other_queue, other_now, cache=cache)
    view, queue, now = random_case(seed)
    fresh = plain(schedule(view, queue, now))
    assert plain(schedule(view, queue, now, cache=cache)) == fresh
    assert plain(schedule(view, queue, now, cache=cache)) == fresh  # (now from the kept views, keys and waits)


def _job(jid: int, gpus: int, nodes: int = 1) -> Job:
    return Job(jid, JobSpec(command=("x",), resources=Resources(gpus=gpus, nodes=nodes)), "alice", JobState.PENDING,
               "", float(jid))


def _group(hosts: dict[str, str]) -> Node:
    """A Slurm group whose devices have opaque names: only `Device.host` says which Slurm node each is on."""
    return Node("cluster", "slurm", NodeState.UP, cpus=64, memory_total_mib=64000,
                devices=tuple(Device(uuid, i, "a100", host=host) for i, (uuid, host) in enumerate(hosts.items())))


@pytest.mark.parametrize("policy", [None, "hsched"])
def test_a_group_share_stays_on_one_host_by_device_host_not_by_name(policy: str | None) -> None:
    # named as if they were on one Slurm node ("slurm-cluster-n1-gpuN"): the host says otherwise, and wins
    g = _group({"slurm-cluster-n1-gpu0": "a", "slurm-cluster-n1-gpu1": "b",
                "slurm-cluster-n1-gpu2": "b", "slurm-cluster-n1-gpu3": "c"})
    got = schedule(FleetView((g,), frozenset(), {}, policy=policy), [_job(1, 2), _job(2, 2)], 0.0)
    by_id = {d.job_id: d for d in got}
    first = by_id[1]
    assert isinstance(first, Launch)
    assert set(first.placements[0].devices) == {"slurm-cluster-n1-gpu1", "slurm-cluster-n1-gpu2"}  # host b
    assert isinstance(by_id[2], Wait)  # two GPUs left, on two hosts: no share of two fits one host
    # a gang of two one-GPU shares goes whole to the group, one share per host
    gang = schedule(FleetView((g,), frozenset(), {}, policy=policy), [_job(3, 1, nodes=2)], 0.0)[0]
    assert isinstance(gang, Launch) and [p.node for p in gang.placements] == ["cluster", "cluster"]
    hosts = {d.uuid: d.host for d in g.devices}
    assert len({hosts[p.devices[0]] for p in gang.placements}) == 2


def test_a_device_keeps_its_host_when_stored_and_old_rows_still_load() -> None:
    d = Device("GPU-1", 0, "a100", host="n7")
    assert device_from_dict(device_to_dict(d)).host == "n7"
    old = device_to_dict(Device("GPU-1", 0, "a100"))
    old.pop("host")
    assert device_from_dict(old).host is None


def test_the_stages_are_what_the_round_runs() -> None:
    """A pipeline without the plan stage is the round without a policy's plan: the backfill alone still settles
    every job (what a stage adds, it adds as a stage)."""
    node = Node("n", "local", NodeState.UP, cpus=8, devices=tuple(Device(f"G{i}", i, "a100") for i in range(2)))
    view = FleetView((node,), frozenset({"G0"}), {}, policy="hsched")
    queue = [_job(1, 1), _job(2, 1)]
    full = schedule(view, queue, 0.0)
    alone = schedule(view, queue, 0.0, stages=(backfill_stage,))
    assert len(STAGES) >= 3 and backfill_stage in STAGES
    assert [type(d).__name__ for d in full] == [type(d).__name__ for d in alone] == ["Launch", "Wait"]
    launched = next(d for d in alone if isinstance(d, Launch))
    assert launched.placements == (Placement("n", ("G1",), launched.placements[0].explanation),)
