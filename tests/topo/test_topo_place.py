"""Placement: brute-force agreement on every real capture, properties under random busy sets, constraints,
the controller's `place_on_node`, and the heterogeneity table."""

from __future__ import annotations

import itertools

import pytest
from captures import capture
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hsched.errors import ConfigError, UserError
from hsched.model import Device, Interconnect, Link, Node, NodeState, Resources
from hsched.topo.models import DEFAULT_CATALOG, lookup_model
from hsched.topo.parse import parse_topology
from hsched.topo.place import (
    Constraints,
    NoPlacement,
    _objective,
    _setup,
    format_device_range,
    greedy_place,
    place,
    place_on_node,
    why_not_on_node,
)
from hsched.topo.synthetic import synthetic_topology, topology_to_links
from hsched.topo.topology import Topology

MATRIX_CAPTURES = [
    "nvidia-smi-topo__2gpu-nv2-workstation.txt",
    "nvidia-smi-topo__2gpu-phb-consumer.txt",
    "nvidia-smi-topo__a100-pcie-1gpu-ansi.txt",
    "nvidia-smi-topo__a100-sxm-8gpu-nv12-2numa.txt",
    "nvidia-smi-topo__dgx1-v100-4nic-oldlegend.txt",
    "nvidia-smi-topo__h100-4gpu-vm-ansi.txt",
    "nvidia-smi-topo__h100-sxm-8gpu-11nic-ansi.txt",
    "nvidia-smi-topo__h100-sxm-8gpu-nv18-2numa-narrow.txt",
    "nvidia-smi-topo__h100-sxm-8gpu-nv18-ht-affinity.txt",
    "amd-smi-topology__mi300x-8gpu.txt",
]


def brute_ab(topo: Topology, k: int, busy: set[str]) -> tuple:
    """Objective (a) then (b) by enumerating every set: weakest link strength, then total fabric links."""
    lmap = topo.link_map()
    free = [d.name for d in topo.devices if d.name not in busy]
    best = None
    for S in itertools.combinations(free, k):
        links = [lmap.get(frozenset(p)) for p in itertools.combinations(S, 2)]
        weakest = min((lk.strength if lk else (0, 0) for lk in links), default=(99, 0))
        total = sum(lk.fabric_links for lk in links if lk)
        if best is None or (weakest, total) > best:
            best = (weakest, total)
    return best


def result_ab(topo: Topology, devices) -> tuple:
    lmap = topo.link_map()
    links = [lmap.get(frozenset(p)) for p in itertools.combinations(devices, 2)]
    return (
        min((lk.strength if lk else (0, 0) for lk in links), default=(99, 0)),
        sum(lk.fabric_links for lk in links if lk),
    )


def brute_full(topo: Topology, k: int, busy: set[str]) -> tuple[str, ...]:
    """The full lexicographic objective (a, b, c, d, lowest indices) by enumeration."""
    p = _setup(topo, k, busy, Constraints(), None)
    best = max(itertools.combinations(p.cand, k), key=lambda S: (_objective(p, S), tuple(-x for x in S)))
    return tuple(p.free[i].name for i in best)


@pytest.mark.parametrize("name", MATRIX_CAPTURES)
def test_placement_equals_brute_force_on_every_capture(name):
    topo = parse_topology(capture(name))
    for k in range(1, len(topo.devices) + 1):
        res = place(topo, k)
        assert len(res.devices) == k and res.exact
        assert result_ab(topo, res.devices) == brute_ab(topo, k, set())
        assert res.devices == brute_full(topo, k, set())
        assert res.explanation.startswith(format_device_range(list(res.devices)))


def _topologies() -> list[Topology]:
    out = [
        synthetic_topology(kind, n)
        for kind, n in (
            ("nvswitch", 8),
            ("nvlink-pairs", 8),
            ("pcie", 8),
            ("dgx1", 8),
            ("nvlink-pairs", 6),
            ("none", 5),
        )
    ]
    out += [parse_topology(capture(n)) for n in MATRIX_CAPTURES if "1gpu" not in n]
    return out


TOPOLOGIES = _topologies()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_property_random_busy_sets_match_brute_force(data):
    topo = data.draw(st.sampled_from(TOPOLOGIES))
    names = [d.name for d in topo.devices]
    busy = set(data.draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names) - 1)))
    k = data.draw(st.integers(min_value=1, max_value=len(names) - len(busy)))
    res = place(topo, k, busy)
    assert not busy & set(res.devices)
    assert result_ab(topo, res.devices) == brute_ab(topo, k, busy)
    assert res.devices == brute_full(topo, k, busy)


def test_specific_choices():
    h100 = parse_topology(capture("nvidia-smi-topo__h100-sxm-8gpu-11nic-ansi.txt"))
    r = place(h100, 4, busy={"GPU0"})
    assert r.devices == ("GPU4", "GPU5", "GPU6", "GPU7")  # one NUMA node beats GPU1-3 + a far GPU
    assert r.explanation == "GPU4-7: all pairs NV18, NUMA 1, NICs mlx5_6,mlx5_7,mlx5_8 local"
    r2 = place(h100, 2)
    assert r2.devices == ("GPU0", "GPU1") and r2.score == 450.0 and r2.weakest == "NV18"
    assert r2.cpus == tuple(range(56)) + tuple(range(112, 168))
    a100 = parse_topology(capture("nvidia-smi-topo__a100-sxm-8gpu-nv12-2numa.txt"))
    r3 = place(a100, 4)
    assert r3.explanation == "GPU0-3: all pairs NV12, NUMA 0" and r3.score == 300.0
    dgx1 = parse_topology(capture("nvidia-smi-topo__dgx1-v100-4nic-oldlegend.txt"))
    r4 = place(dgx1, 2, busy={"GPU3", "GPU4"})
    assert r4.weakest == "NV2"
    r5 = place(dgx1, 4)
    assert r5.devices == ("GPU0", "GPU1", "GPU2", "GPU3") and r5.nvlinks == 9 and r5.weakest == "NV1"


def test_fragmentation_tie_break():
    # nvlink-pairs: a single GPU should come from a broken pair if one exists, not split a whole pair
    topo = synthetic_topology("nvlink-pairs", 8)
    assert place(topo, 1, busy={"GPU2"}).devices == ("GPU3",)
    assert place(topo, 2, busy={"GPU0"}).devices == ("GPU2", "GPU3")


def test_constraints():
    topo = synthetic_topology("pcie", 4, model="NVIDIA A40")
    with pytest.raises(NoPlacement, match="NVLink"):
        place(topo, 2, constraints=Constraints(interconnect="nvlink"))
    assert place(topo, 1, constraints=Constraints(interconnect="nvlink")).devices == ("GPU0",)
    dgx1 = synthetic_topology("dgx1", 8, model="Tesla V100-SXM2-16GB")
    assert place(dgx1, 4, constraints=Constraints(interconnect="nvlink")).weakest == "NV1"
    with pytest.raises(NoPlacement, match="pairwise"):
        place(dgx1, 5, constraints=Constraints(interconnect="nvlink"))
    with pytest.raises(NoPlacement, match="model"):
        place(dgx1, 1, constraints=Constraints(gpu_types=("a100",)))
    assert place(dgx1, 1, constraints=Constraints(gpu_types=("V100",))).devices == ("GPU0",)
    with pytest.raises(NoPlacement, match="memory"):
        place(dgx1, 1, constraints=Constraints(min_memory_mib=32768))  # V100 16 GB from the model table
    with pytest.raises(NoPlacement, match="compute capability"):
        place(dgx1, 1, constraints=Constraints(min_compute_capability="8.0"))
    assert place(dgx1, 2, constraints=Constraints(min_compute_capability="7.0")).devices
    with pytest.raises(UserError, match="GPU9"):
        place(dgx1, 1, busy={"GPU9"})
    with pytest.raises(UserError, match="at least 1"):
        place(dgx1, 0)
    with pytest.raises(NoPlacement, match="2 busy"):
        place(synthetic_topology("nvswitch", 2), 1, busy={"GPU0", "GPU1"})


def test_cpu_pick_is_local():
    topo = synthetic_topology("nvswitch", 8, cores_per_numa=16)
    r = place(topo, 2, busy={"GPU0", "GPU1", "GPU2", "GPU3"}, constraints=Constraints(cpus=4))
    assert r.devices == ("GPU4", "GPU5") and r.cpus == (16, 17, 18, 19)


def test_heuristic_above_the_exact_limit():
    topo = synthetic_topology("nvlink-pairs", 24)
    r = place(topo, 4)
    assert not r.exact and "heuristic" in r.explanation
    assert r.weakest == "NODE" and r.nvlinks == 8 and r.numa_nodes == (0,)
    g = greedy_place(synthetic_topology("nvswitch", 16), 8)
    assert g.devices == tuple(f"GPU{i}" for i in range(8))


def _node(links: tuple[Link, ...] = (), n: int = 4, numa: bool = True) -> Node:
    devs = tuple(
        Device(
            uuid=f"GPU-{i:04d}",
            index=i,
            model="NVIDIA A100-SXM4-80GB",
            memory_total_mib=81920,
            numa_node=i // 2 if numa else None,
        )
        for i in range(n)
    )
    return Node(name="gpu-a", executor="local", state=NodeState.UP, devices=devs, links=links)


def test_place_on_node_without_links_takes_lowest_indices():
    node = _node(numa=False)
    free = [d.uuid for d in node.devices]
    r = place_on_node(node, 2, free[1:], Resources(gpus=2))
    assert r is not None and r.devices == ("GPU-0001", "GPU-0002")
    assert r.explanation == "GPU1-2: links unknown"
    # with NUMA ids, one NUMA node wins over lower indices
    assert place_on_node(_node(), 2, free[1:], Resources(gpus=2)).devices == ("GPU-0002", "GPU-0003")


def test_place_on_node_with_links_and_resources():
    topo = synthetic_topology("nvlink-pairs", 4, model="NVIDIA A100-SXM4-80GB")
    uuids = [f"GPU-{i:04d}" for i in range(4)]
    node = _node(topology_to_links(topo, uuids))
    assert {lk.kind for lk in node.links} == {"NV4", "SYS"} and node.links[0].bandwidth_gbps == 100.0
    r = place_on_node(node, 2, uuids, Resources(gpus=2, interconnect=Interconnect.NVLINK))
    assert r is not None and r.devices == ("GPU-0000", "GPU-0001")
    r = place_on_node(node, 2, uuids[1:], Resources(gpus=2, interconnect=Interconnect.NVLINK))
    assert r.devices == ("GPU-0002", "GPU-0003")
    assert place_on_node(node, 2, uuids[1:3], Resources(gpus=2, interconnect=Interconnect.NVLINK)) is None
    assert "NVLink" in why_not_on_node(node, 2, uuids[1:3], Resources(gpus=2, interconnect=Interconnect.NVLINK))
    assert place_on_node(node, 1, uuids, Resources(gpus=1, gpu_types=("h100",))) is None
    assert place_on_node(node, 1, uuids, Resources(gpus=1, gpu_memory_mib=90000)) is None
    assert place_on_node(node, 5, uuids, Resources(gpus=5)) is None


def test_synthetic_kinds():
    with pytest.raises(UserError, match="unknown simulated"):
        synthetic_topology("torus", 4)
    a100 = synthetic_topology("nvswitch", 8, model="NVIDIA A100-SXM4-40GB", nics=True)
    assert {lk.kind for lk in a100.device_links()} == {"NV12"} and len(a100.nics) == 4
    assert place(a100, 2).explanation == "GPU0-1: all pairs NV12, NUMA 0, NIC mlx5_0 local"
    with pytest.raises(UserError, match="UUIDs"):
        topology_to_links(a100, ["a"])


@pytest.mark.parametrize(
    "name,key",
    [
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB PCIe"),
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
        ("NVIDIA A10G", "A10"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("Tesla V100-SXM2-32GB", "V100 32GB"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("Tesla K80", "K80"),
        ("Tesla T4", "T4"),
        ("Tesla P100-PCIE-16GB", "P100"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA GeForce RTX 3090", "RTX 3090"),
        ("NVIDIA A40", "A40"),
        ("AMD Instinct MI300X OAM", "MI300X"),
        ("MI300X-O", "MI300X"),
        ("Instinct MI210", "MI210"),
        ("AMD Instinct MI250X", "MI250X"),
    ],
)
def test_model_lookup(name, key):
    m = lookup_model(name)
    assert m is not None and m.key == key


def test_model_table_values_and_overrides():
    assert lookup_model("NVIDIA L40") is None and lookup_model("MI308X") is None and lookup_model(None) is None
    v100 = lookup_model("V100")
    assert v100.train == v100.inference == 1.0 and v100.compute_capability == "7.0"
    assert lookup_model("MI300X").gfx_target == "gfx942" and lookup_model("H100 NVL").memory_mib == 95830
    assert all(m.train > 0 and m.inference > 0 and m.memory_mib > 0 for m in DEFAULT_CATALOG.models)
    cat = DEFAULT_CATALOG.with_overrides(
        {
            "H100 SXM": {"train": 4.5},
            "RTX 6000 Ada": {
                "match": ["RTX 6000 Ada"],
                "memory_mib": 49140,
                "compute_capability": "8.9",
                "train": 1.8,
                "inference": 2.4,
            },
        }
    )
    assert cat.lookup("NVIDIA H100 80GB HBM3").train == 4.5 and lookup_model("H100 SXM").train == 5.0
    assert cat.lookup("NVIDIA RTX 6000 Ada Generation").memory_mib == 49140
    with pytest.raises(ConfigError, match="unknown field"):
        DEFAULT_CATALOG.with_overrides({"A40": {"speed": 2}})


def test_graph_infers_the_pcie_tree():
    from hsched.topo.graph import build_graph, tree_lines

    dgx1 = parse_topology(capture("nvidia-smi-topo__dgx1-v100-4nic-oldlegend.txt"))
    g = build_graph(dgx1)
    assert g.nodes["GPU0"]["type"] == "gpu" and g.nodes["mlx5_0"]["type"] == "nic"
    # GPU0, GPU1 and mlx5_0 are PIX to each other: one switch; switches 0/1 meet at a host bridge (PHB)
    sw = next(n for n in g.neighbors("GPU0") if g.edges["GPU0", n]["relation"] == "tree")
    assert {n for n in g.neighbors(sw) if g.nodes[n]["type"] in ("gpu", "nic")} == {"GPU0", "GPU1", "mlx5_0"}
    assert g.edges["GPU0", "GPU3"]["kind"] == "NV2" and g.edges["GPU0", "GPU3"]["bandwidth_gbps"] == 50.0
    assert g.edges["GPU0", "GPU5"]["kind"] == "SYS"
    h100 = parse_topology(capture("nvidia-smi-topo__h100-sxm-8gpu-11nic-ansi.txt"))
    lines = tree_lines(h100)
    assert lines[0] == "machine" and "  numa0" in lines and "  numa1" in lines
    assert build_graph(h100).edges["GPU0", "GPU7"]["bandwidth_gbps"] == 450.0


def test_a_nodes_topology_is_kept_while_its_devices_and_links_are_the_same() -> None:
    """`topology_of_node` answers again for a node whose devices are the same as a topology sees them (a heartbeat's new
    readings change nothing there) and whose links are the very same (a live round places several jobs a round on
    nodes that did not change), and afresh for a node whose devices or links are others."""
    from dataclasses import replace as _replace

    from hsched.config import SimulatedDevices
    from hsched.simulated import simulated_devices
    from hsched.topo.place import topology_of_node

    devices, links = simulated_devices("n0", SimulatedDevices(model="NVIDIA A100-SXM4-80GB", count=4,
                                                              topology="nvlink-pairs"))
    node = Node("n0", "fake", NodeState.UP, cpus=32, memory_total_mib=1 << 16, devices=devices, links=links)
    first = topology_of_node(node)
    assert topology_of_node(_replace(node, state=NodeState.DRAINED)) is first  # (another Node, the same devices)
    read = tuple(_replace(d, utilization_gpu=97.0, memory_used_mib=1234) for d in devices)
    assert topology_of_node(_replace(node, devices=read)) is first  # (new devices, new readings only)
    moved = (_replace(devices[0], numa_node=1), *devices[1:])
    assert topology_of_node(_replace(node, devices=moved)).devices[0].numa_node == 1
    fewer = topology_of_node(_replace(node, devices=devices[:2]))
    assert [d.uuid for d in fewer.devices] == [d.uuid for d in devices[:2]]
    unlinked = topology_of_node(_replace(node, links=()))
    assert unlinked.links == () and first.links


def test_a_nodes_placement_is_kept_for_the_same_free_devices_and_request() -> None:
    """`place_on_node` answers again for a node whose topology is the one kept, the same free devices and the same
    request (a churning live round asks the same few questions of a node round after round), and afresh otherwise:
    the answer always the one a fresh search gives."""
    import importlib
    from dataclasses import replace as _replace

    from hsched.config import SimulatedDevices
    from hsched.model import Interconnect, Resources
    from hsched.simulated import simulated_devices

    P = importlib.import_module("hsched.topo.place")  # (the package's `place` is the function)

    devices, links = simulated_devices("n1", SimulatedDevices(model="NVIDIA A100-SXM4-80GB", count=4,
                                                              topology="nvlink-pairs"))
    node = Node("n1", "fake", NodeState.UP, cpus=32, memory_total_mib=1 << 16, devices=devices, links=links)
    uuids = [d.uuid for d in devices]
    two = Resources(gpus=2)
    first = P.place_on_node(node, 2, uuids, two)
    assert first is not None and P.place_on_node(node, 2, list(reversed(uuids)), two) is first
    read = tuple(_replace(d, utilization_gpu=97.0) for d in devices)  # (a heartbeat's new readings)
    assert P.place_on_node(_replace(node, devices=read), 2, uuids, two) is first
    # other free devices, another count or request, another topology: asked afresh, and each what a fresh search says
    asked = [(node, 2, uuids[1:], two), (node, 1, uuids, Resources(gpus=1)),
             (node, 2, uuids, Resources(gpus=2, cpus=4)), (_replace(node, links=()), 2, uuids, two),
             (node, 3, uuids[:2], Resources(gpus=3)), (node, 2, uuids[1:3], two),
             (node, 2, uuids[1:3], Resources(gpus=2, interconnect=Interconnect.NVLINK))]  # (not a pair: none)
    for n, k, free, res in asked:
        kept = P.place_on_node(n, k, free, res)
        P._TOPOLOGIES.clear()
        fresh = P.place_on_node(n, k, free, res)
        assert kept == fresh and (kept is None or kept is not first), (k, free, res)
    assert P.place_on_node(node, 3, uuids[:2], Resources(gpus=3)) is None  # (no placement is an answer kept too)
