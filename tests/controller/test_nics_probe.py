"""Issue 32: a node's NICs as the controller keeps them: from the probe's `nics` (nearness from nvidia-smi topo's
NIC columns where sysfs gave none), serialised with the node, and a node row stored before NICs loads."""

from __future__ import annotations

from hsched.controller.fleet import probe_nics
from hsched.model import Nic, NicKind, Node, NodeState
from hsched.serialize import node_from_dict, node_to_dict
from tests.topo.captures import capture


def test_probe_nics_with_nearness_from_the_topo_matrix() -> None:
    probe = {"nics": [{"name": "mlx5_0", "kind": "ib", "rate_gbps": 400.0, "active": True, "netdev": "ibp26s0",
                       "near": []},
                      {"name": "mlx5_4", "kind": "roce", "rate_gbps": 200.0, "active": False, "near": []},
                      {"name": "broken"}],
             "gpus": {"topo_matrix": capture("nvidia-smi-topo__h100-sxm-8gpu-11nic-ansi.txt")}}
    assert probe_nics(probe) == (Nic("mlx5_0", NicKind.IB, 400.0, True, "ibp26s0", (0, 1)),
                                 Nic("mlx5_4", NicKind.ROCE, 200.0, False, None, ()))
    assert probe_nics({"gpus": {}}) == ()  # an older helper reports none


def test_nics_round_trip_and_old_rows() -> None:
    node = Node("n1", "ssh", NodeState.UP, nics=(Nic("mlx5_0", NicKind.IB, 400.0, True, "ib0", (0, 1)),))
    d = node_to_dict(node)
    assert d["nics"] == [{"name": "mlx5_0", "kind": "ib", "rate_gbps": 400.0, "active": True, "netdev": "ib0",
                          "near": [0, 1]}]
    assert node_from_dict(d) == node
    del d["nics"]
    assert node_from_dict(d).nics == ()
