"""One topology graph, one clique search (issue 19): the NVLink/XGMI domains of hsched.topo.graph and placement's
`interconnect = nvlink` come from the same search (hsched.topo.cliques), so what `topo show` and the dashboard
say a domain offers is what placement can get there."""

from __future__ import annotations

import pytest

from hsched.topo.cliques import find_clique, largest_clique
from hsched.topo.graph import build_graph, tree_lines
from hsched.topo.parse import parse_topology
from hsched.topo.place import Constraints, NoPlacement, place
from hsched.topo.topology import TopoDevice, TopoLink, Topology, TopoNic
from tests.topo.captures import capture

NVLINK = Constraints(interconnect="nvlink")


def test_find_clique_takes_the_first_in_order_and_says_none_when_there_is_none() -> None:
    # a square with one diagonal: triangles a-b-c and a-c-d, no four
    adj = {"a": {"b", "c", "d"}, "b": {"a", "c"}, "c": {"a", "b", "d"}, "d": {"a", "c"}}
    assert find_clique(["a", "b", "c", "d"], adj, 3) == ("a", "b", "c")
    assert find_clique(["d", "c", "b", "a"], adj, 3) == ("d", "c", "a")
    assert find_clique(["a", "b", "c", "d"], adj, 4) is None
    assert find_clique(["a"], adj, 0) == ()
    assert largest_clique(["b", "d", "a", "c"], adj) == ("b", "a", "c")
    assert largest_clique(["x"], {"x": set()}) == ("x",)


@pytest.mark.parametrize("name", [
    "nvidia-smi-topo__dgx1-v100-4nic-oldlegend.txt",  # hybrid cube mesh: 8 in the domain, 4 all-to-all
    "nvidia-smi-topo__h100-sxm-8gpu-11nic-ansi.txt",  # NVSwitch: all 8
    "nvidia-smi-topo__2gpu-nv2-workstation.txt",
    "amd-smi-xgmi__mi300x-8gpu.txt",
])
def test_a_domains_all_to_all_set_is_what_nvlink_placement_gets(name: str) -> None:
    topo = parse_topology(capture(name))
    g = build_graph(topo)
    (domain,) = [n for n, t in g.nodes(data="type") if t in ("nvlink", "xgmi")]
    clique = g.nodes[domain]["clique"]
    assert set(clique) <= set(g.nodes[domain]["members"])
    assert {m for m in g.neighbors(domain) if g.edges[domain, m]["relation"] == "domain"} == set(
        g.nodes[domain]["members"]
    )
    got = place(topo, len(clique), constraints=NVLINK)
    assert len(got.devices) == len(clique)
    with pytest.raises(NoPlacement):
        place(topo, len(clique) + 1, constraints=NVLINK)


def test_dgx1_domain_spans_the_switches_and_says_how_far_all_pairs_reach() -> None:
    topo = parse_topology(capture("nvidia-smi-topo__dgx1-v100-4nic-oldlegend.txt"))
    g = build_graph(topo)
    assert g.nodes["nvlink0"]["members"] == tuple(f"GPU{i}" for i in range(8))
    assert g.nodes["nvlink0"]["clique"] == ("GPU0", "GPU1", "GPU2", "GPU3")
    assert tree_lines(topo)[-1] == "  nvlink0: GPU0-7 (NV2/NV1, all pairs within GPU0-3)"


def test_nvlink_pairs_are_separate_domains_across_a_pcie_switch() -> None:
    # two NVLink bridges (GPU0-1, GPU2-3), GPU1 and GPU2 behind one PCIe switch: the pairs stay two domains,
    # and the switch stays in the PCIe tree
    devs = tuple(TopoDevice(f"GPU{i}", i, numa_node=0) for i in range(4))
    kinds = {(0, 1): "NV4", (2, 3): "NV4", (1, 2): "PIX", (0, 2): "PHB", (0, 3): "PHB", (1, 3): "PHB"}
    topo = Topology(devices=devs, links=tuple(TopoLink(f"GPU{a}", f"GPU{b}", k) for (a, b), k in kinds.items()))
    assert tree_lines(topo) == [
        "machine",
        "  numa0",
        "    hostbridge0",
        "      GPU0",
        "      GPU3",
        "      switch0",
        "        GPU1",
        "        GPU2",
        "  nvlink0: GPU0-1 (NV4, all pairs)",
        "  nvlink1: GPU2-3 (NV4, all pairs)",
    ]


def test_a_nic_without_a_numa_node_takes_its_gpus() -> None:
    # as the dashboard gives it: NICs known only as link ends
    devs = (TopoDevice("GPU0", 0, numa_node=1),)
    topo = Topology(devices=devs, nics=(TopoNic("NIC0"),), links=(TopoLink("GPU0", "NIC0", "NODE"),))
    assert tree_lines(topo) == ["machine", "  numa1", "    GPU0", "    NIC0"]
