"""Issue 32: the simulator's inter-node model (hsched.sim.fabric) and its comm-aware placer, on a small cluster."""

from __future__ import annotations

import pytest

from hsched.sim.cluster import parse_cluster
from hsched.sim.engine import SimCosts
from hsched.sim.fabric import FabricPlacer, two_leaves


def test_the_stated_speed() -> None:
    servers = parse_cluster("v100:16", 4)
    f = two_leaves(servers)
    assert [f.leaf_of[s.name] for s in servers] == ["leaf1", "leaf1", "leaf2", "leaf2"]
    assert [two_leaves(servers, interleaved=True).leaf_of[s.name] for s in servers] == ["leaf1", "leaf2"] * 2
    assert f.speed(["v100-0"]) == 1.0
    assert f.speed(["v100-0", "v100-1"]) == 1.0  # within a leaf: full NIC speed
    # across leaves: 100 Gb/s of 200: 1 / (0.7 + 0.3 x 2)
    assert f.speed(["v100-0", "v100-2"]) == pytest.approx(1 / 1.3)
    assert SimCosts().fabric is None  # no fabric unless declared: the default figures stand


def test_the_aware_placer_keeps_a_gang_under_one_leaf() -> None:
    servers = parse_cluster("v100:16", 4)
    f = two_leaves(servers)
    # 2 free on v100-0 and v100-1 (leaf1: 4), 3 on v100-2 and 1 on v100-3 (leaf2: 4); blind, the roomiest servers
    # first (v100-2, then a leaf1 server) cross leaves
    free = {"v100-0": ["a0", "a1"], "v100-1": ["b0", "b1"], "v100-2": ["c0", "c1", "c2"], "v100-3": ["d0"]}
    got = FabricPlacer(f).place(5, servers, free, None)
    assert got is not None and {f.leaf_of[p.node] for p in got} == {"leaf1", "leaf2"}  # no leaf holds 5
    got = FabricPlacer(f).place(4, servers, free, None)
    assert got is not None and {p.node for p in got} == {"v100-0", "v100-1"}  # leaf1 holds 4 (best fit)
    blind = FabricPlacer(f).base.place(4, servers, free, None)
    assert blind is not None and {f.leaf_of[p.node] for p in blind} == {"leaf1", "leaf2"}
