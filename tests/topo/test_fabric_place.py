"""Issue 32's acceptance: gangs across nodes on a declared fabric (two leaves under a spine, mixed NIC rates, GPUs
near and far from NICs), placed through the real controller in-process, each checked against a brute-force oracle
of the stated cost (docs/scheduling.md, "Gangs across nodes"), written here from the statement, not from
hsched.topo.fabric; and the run's NCCL/UCX variables name the chosen NICs."""

from __future__ import annotations

import asyncio
import itertools
import random
from pathlib import Path

import pytest

from hsched.model import Nic, NicKind
from hsched.testing import CannedNode, Lab
from hsched.topo.fabric import Fabric, Switch

MODEL = "NVIDIA A100-SXM4-80GB"
LEAVES = {"L1": ("n1", "n2", "n3", "n4"), "L2": ("n5", "n6", "n7", "n8")}


def fleet(seed: int) -> tuple[list[CannedNode], Fabric]:
    """Eight 4-GPU nodes, each with one or two NICs of mixed kinds and rates, near GPUs 0-1 or 2-3, some down;
    leaf uplinks of mixed rates under one spine."""
    rng = random.Random(seed)
    nodes = []
    for leaf_nodes in LEAVES.values():
        for name in leaf_nodes:
            nics = []
            for k in range(rng.choice((1, 2))):
                kind = rng.choice((NicKind.IB, NicKind.IB, NicKind.ROCE, NicKind.ETHERNET))
                rate = rng.choice((100.0, 200.0, 400.0)) if kind != NicKind.ETHERNET else 25.0
                nics.append(Nic(name=f"mlx5_{k}" if kind != NicKind.ETHERNET else f"eth{k}", kind=kind,
                                rate_gbps=rate, active=rng.random() > 0.15,
                                netdev=f"ib{k}" if kind == NicKind.IB else f"ens{k}",
                                near=(0, 1) if k == 0 else (2, 3)))
            nodes.append(CannedNode(name, MODEL, 4, nics=tuple(nics)))
    fabric = Fabric(switches=(
        Switch("L1", nodes=LEAVES["L1"], rate_gbps=rng.choice((100.0, 200.0, 400.0))),
        Switch("L2", nodes=LEAVES["L2"], rate_gbps=rng.choice((100.0, 200.0, 400.0))),
        Switch("spine", switches=("L1", "L2")),
    ))
    return nodes, fabric


def node_best(nics: tuple[Nic, ...], free: set[int]) -> float:
    """The stated node bandwidth of the best share on these free GPUs: an active NIC in full where a free GPU is
    near it (a share can hold that GPU), else at half."""
    return max((x.rate_gbps if free & set(x.near) else x.rate_gbps / 2 for x in nics if x.active), default=0.0)


def oracle(nodes: list[CannedNode], fabric: Fabric, free: dict[str, set[int]], gpus: int, k: int
           ) -> tuple[float, int]:
    """The least cost (as (-bandwidth, hops)) over every k-subset of the nodes with room."""
    leaf = {n: s.name for s in fabric.switches for n in s.nodes}
    rate = {s.name: s.rate_gbps for s in fabric.switches}
    by = {n.name: n for n in nodes}
    room = [n for n in by if len(free[n]) >= gpus]
    best: tuple[float, int] | None = None
    for combo in itertools.combinations(room, k):
        bw = min(node_best(by[n].nics, free[n]) for n in combo)
        leaves = {leaf[n] for n in combo}
        if len(leaves) > 1:
            bw = min(bw, *(rate[x] or float("inf") for x in leaves))
            hops = 4
        else:
            hops = 2
        cost = (-bw, hops)
        if best is None or cost < best:
            best = cost
    assert best is not None
    return best


def chosen_cost(nodes: list[CannedNode], fabric: Fabric, shares: dict[str, set[int]]) -> tuple[float, int]:
    leaf = {n: s.name for s in fabric.switches for n in s.nodes}
    rate = {s.name: s.rate_gbps for s in fabric.switches}
    by = {n.name: n for n in nodes}
    bw = min(node_best(by[n].nics, devs) for n, devs in shares.items())
    leaves = {leaf[n] for n in shares}
    if len(leaves) > 1:
        bw = min(bw, *(rate[x] or float("inf") for x in leaves))
    return (-bw, 4 if len(leaves) > 1 else 2)


# (gpus per node, nodes, one-GPU fillers started first): ten gangs of differing shapes on differing fleets
CASES = [(1, 2, 0), (2, 2, 3), (4, 2, 0), (2, 3, 5), (1, 4, 6), (2, 4, 2), (4, 3, 4), (1, 3, 9), (3, 2, 7),
         (2, 2, 11)]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_gangs_on_a_declared_fabric_are_optimal(tmp_path: Path, case: int) -> None:
    gpus, k, fillers = CASES[case]
    nodes, fabric = fleet(1000 + case)

    async def go() -> None:
        async with Lab.open(tmp_path, nodes=nodes, fabric=fabric) as lab:
            for _ in range(fillers):
                await lab.submit("sleep", gpus=1)
            await lab.round()
            busy: dict[str, set[int]] = {n.name: set() for n in nodes}
            index = {d.uuid: (n, d.index) for n, rt in lab.ctl.nodes.items() for d in rt.node.devices}
            for j in range(1, fillers + 1):
                for run in await lab.runs(j):
                    for u in run.devices:
                        busy[index[u][0]].add(index[u][1])
            free = {n: {0, 1, 2, 3} - b for n, b in busy.items()}
            job = await lab.submit("train", gpus=gpus, nodes=k)
            await lab.round()
            runs = await lab.runs(job.id)
            assert len(runs) == k, f"case {case}: the gang did not start"
            shares = {r.node: {index[u][1] for u in r.devices} for r in runs}
            want = oracle(nodes, fabric, free, gpus, k)
            assert chosen_cost(nodes, fabric, shares) == want, (case, shares, want)
            # NCCL is told the NICs the placement chose: the node's best for its share
            by = {n.name: n for n in nodes}
            for fr in await lab.fake_runs(job.id):
                env = dict(fr.request.env)
                node = by[env["HSCHED_NODE"]]
                devs = shares[node.name]
                bw = node_best(node.nics, devs)
                if bw == 0:
                    assert "NCCL_IB_HCA" not in env and "NCCL_SOCKET_IFNAME" not in env
                    continue
                best = [x for x in node.nics if x.active
                        and (x.rate_gbps if devs & set(x.near) else x.rate_gbps / 2) == bw]
                rdma = [x for x in best if x.kind != NicKind.ETHERNET]
                if rdma:
                    assert env["NCCL_IB_HCA"] == "=" + ",".join(x.name for x in rdma)
                    assert env["UCX_NET_DEVICES"] == ",".join(f"{x.name}:1" for x in rdma)
                    assert env["NCCL_SOCKET_IFNAME"] == "=" + ",".join(x.netdev or "" for x in rdma)
                else:
                    assert env["NCCL_IB_DISABLE"] == "1"
                    assert env["NCCL_SOCKET_IFNAME"] == "=" + ",".join(x.netdev or x.name for x in best)

    asyncio.run(go())


def test_the_fabric_changes_the_choice(tmp_path: Path) -> None:
    """Not vacuous: where fleet order would take n1 and n2 (slow NICs, the 100 Gb/s leaf), the gang goes to
    the two 400 Gb/s nodes under one leaf."""
    slow = (Nic("mlx5_0", NicKind.IB, 100.0, netdev="ib0", near=(0, 1)),)
    fast = (Nic("mlx5_0", NicKind.IB, 400.0, netdev="ib0", near=(0, 1)),)
    nodes = [CannedNode("n1", MODEL, 4, nics=slow), CannedNode("n2", MODEL, 4, nics=slow),
             CannedNode("n3", MODEL, 4, nics=fast), CannedNode("n4", MODEL, 4, nics=slow),
             CannedNode("n5", MODEL, 4, nics=fast), CannedNode("n6", MODEL, 4, nics=fast)]
    fabric = Fabric(switches=(Switch("L1", nodes=("n1", "n2", "n3"), rate_gbps=100.0),
                              Switch("L2", nodes=("n4", "n5", "n6"), rate_gbps=100.0),
                              Switch("spine", switches=("L1", "L2"))))

    async def go() -> None:
        async with Lab.open(tmp_path, nodes=nodes, fabric=fabric) as lab:
            job = await lab.submit("train", gpus=1, nodes=2)
            await lab.round()
            runs = await lab.runs(job.id)
            assert sorted(r.node for r in runs) == ["n5", "n6"]
            # and the share sits on a GPU near the NIC
            index = {d.uuid: d.index for rt in lab.ctl.nodes.values() for d in rt.node.devices}
            assert all(index[u] in (0, 1) for r in runs for u in r.devices)
            # `hsched show`'s "why there" names the modelled bandwidth and the NICs
            shown = (await lab.job(job.id)).placement
            why = "; ".join(p.explanation for p in shown)
            assert "modelled inter-node bandwidth 400 Gb/s" in why and "under leaf L2" in why
            assert why.count("NIC mlx5_0") == 2

    asyncio.run(go())
