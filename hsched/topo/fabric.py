"""The network between nodes (issue 32): the fleet's switch layout and the cost of a gang across nodes.

The cost model (docs/scheduling.md, "Gangs across nodes"), stated so a brute-force oracle can check it:

- A node's bandwidth for a share of a gang (its chosen GPUs D) is the best of its *active* NICs, each counted at its
  rate when some GPU of D is PCIe-near it (GPUDirect RDMA), at half its rate when none is (the traffic is staged
  through host memory across the CPU). A node with no known NIC counts 0.
- The gang's modelled inter-node bandwidth is the bottleneck: the least of its nodes' bandwidths and, where its nodes
  sit under more than one leaf, of the uplink rates (`rate`) of every switch on the paths between them.
- Its hops: the switch-tree path between its two farthest nodes (node-leaf-node is 2, through a spine 4); a node
  outside the layout counts as a leaf of its own under an unknown root.
- The best placement maximises the bandwidth, then minimises the hops; the rest is the round's own order. The same
  number of GPUs per node holds by construction: `--gpus` is per node.

Pure: no I/O."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hsched.model import Nic, NicKind, Node

FAR_FACTOR = 0.5
"""A NIC no chosen GPU is PCIe-near counts this share of its rate (no GPUDirect RDMA: staged through the host)."""


@dataclass(frozen=True, slots=True)
class Switch:
    """One switch of the fleet file's `[[switch]]` table (or a topology.conf line): the nodes directly under it
    (a leaf), or the switches under it (a spine); `rate_gbps`: its uplink to its parent, None where unknown."""

    name: str
    nodes: tuple[str, ...] = ()
    switches: tuple[str, ...] = ()
    rate_gbps: float | None = None


@dataclass(frozen=True, slots=True)
class Fabric:
    """The fleet's switch layout; empty: none declared (nodes are placed by their NICs alone)."""

    switches: tuple[Switch, ...] = ()

    def parent_of(self) -> dict[str, str]:
        """Switch or node name -> the switch directly above it."""
        up: dict[str, str] = {}
        for s in self.switches:
            for child in (*s.nodes, *s.switches):
                up[child] = s.name
        return up

    def path_up(self, node: str) -> list[str]:
        """The switches from `node`'s leaf up to the root (empty: a node outside the layout)."""
        up, out = self.parent_of(), []
        cur = up.get(node)
        while cur is not None and cur not in out:
            out.append(cur)
            cur = up.get(cur)
        return out


@dataclass(frozen=True, slots=True)
class GangCost:
    """A gang's place on the fabric: its modelled inter-node bandwidth (Gb/s), its hops, and per node the NICs its
    share uses (what NCCL_IB_HCA / NCCL_SOCKET_IFNAME name)."""

    bandwidth_gbps: float
    hops: int
    nics: Mapping[str, tuple[Nic, ...]]

    def key(self) -> tuple[float, int]:
        """Smaller is better."""
        return (-self.bandwidth_gbps, self.hops)

    leaves: tuple[str, ...] = ()
    """The leaf switches the gang's nodes sit under (empty: no layout declared)."""

    def explain(self) -> str:
        where = f"under leaf {self.leaves[0]}" if len(self.leaves) == 1 else (
            f"across leaves {', '.join(self.leaves)}" if self.leaves else "no switch layout")
        return (f"gang of {len(self.nics)} nodes: modelled inter-node bandwidth {self.bandwidth_gbps:g} Gb/s "
                f"(the least of the NIC rates and switch uplinks), {self.hops} switch hops, {where}")


def node_nics(node: Node, devices: Iterable[int]) -> tuple[float, tuple[Nic, ...]]:
    """A node's bandwidth for a share on the GPUs with these indices, and the NICs reaching it."""
    chosen = set(devices)
    best, out = 0.0, []
    for nic in node.nics:
        if not nic.active:
            continue
        rate = nic.rate_gbps if chosen & set(nic.near) else nic.rate_gbps * FAR_FACTOR
        if rate > best:
            best, out = rate, [nic]
        elif rate == best and rate > 0:
            out.append(nic)
    return best, tuple(out)


def gang_cost(fabric: Fabric, shares: Sequence[tuple[Node, Sequence[int]]]) -> GangCost:
    """The stated cost of a gang with these shares (each a node and its GPUs' indices)."""
    bw = float("inf")
    nics: dict[str, tuple[Nic, ...]] = {}
    for node, devs in shares:
        b, used = node_nics(node, devs)
        bw = min(bw, b)
        nics[node.name] = used
    paths = [fabric.path_up(n.name) for n, _ in shares]
    rates = {s.name: s.rate_gbps for s in fabric.switches}
    hops = 0
    crossed: set[str] = set()
    for a, b in itertools.combinations(range(len(shares)), 2):
        pa, pb = paths[a], paths[b]
        common = next((s for s in pa if s in pb), None)
        if common is None:
            # outside the layout, or in trees with no common root: the worst the layout knows, plus one
            h = len(pa) + len(pb) + 2
            crossed.update(pa)
            crossed.update(pb)
        else:
            ia, ib = pa.index(common), pb.index(common)
            h = 2 * max(ia, ib) + 2
            crossed.update(pa[:ia])
            crossed.update(pb[:ib])
        hops = max(hops, h)
    for s in crossed:
        r = rates.get(s)
        if r is not None:
            bw = min(bw, r)
    if bw == float("inf"):
        bw = 0.0
    leaves = tuple(dict.fromkeys(p[0] for p in paths if p))
    return GangCost(bandwidth_gbps=bw, hops=hops, nics=nics, leaves=leaves)


def best_gang(fabric: Fabric, candidates: Sequence[tuple[Node, Sequence[int]]], k: int
              ) -> tuple[tuple[int, ...], GangCost] | None:
    """The positions in `candidates` (each a node and the GPUs its share would get, in the round's order) of the k
    nodes of least cost, the earliest in order among equals; None: fewer than k candidates.

    Exact for a leaf/spine layout: the best set under one leaf is that leaf's k best nodes; the best set across
    leaves with bandwidth >= t is among the k earliest of the nodes with bandwidth >= t under leaves whose path
    rates are >= t, for t each distinct node bandwidth and switch rate. Each such set is scored by `gang_cost`."""
    if len(candidates) < k:
        return None
    own = [node_nics(n, d)[0] for n, d in candidates]
    order = sorted(range(len(candidates)), key=lambda i: (-own[i], i))
    sets: list[tuple[int, ...]] = []
    by_leaf: dict[str | None, list[int]] = {}
    for i in order:
        path = fabric.path_up(candidates[i][0].name)
        by_leaf.setdefault(path[0] if path else None, []).append(i)
    for leaf, members in by_leaf.items():
        if leaf is not None and len(members) >= k:
            sets.append(tuple(sorted(members[:k])))
    rates = {s.name: s.rate_gbps for s in fabric.switches}

    def path_rate(i: int) -> float:
        path = fabric.path_up(candidates[i][0].name)
        got = [r for s in path if (r := rates.get(s)) is not None]
        return min(got, default=float("inf"))

    caps = [path_rate(i) for i in range(len(candidates))]
    for t in sorted({*own, *(c for c in caps if c != float("inf"))}, reverse=True):
        ok = [i for i in range(len(candidates)) if own[i] >= t and caps[i] >= t]
        if len(ok) >= k:
            # (the earliest k in the round's order: ties keep the round's preference)
            sets.append(tuple(ok[:k]))
    sets.append(tuple(sorted(order[:k])))
    sets.append(tuple(range(k)))
    best: tuple[tuple[int, ...], GangCost] | None = None
    for s in dict.fromkeys(sets):
        cost = gang_cost(fabric, [candidates[i] for i in s])
        if best is None or (cost.key(), s) < (best[1].key(), best[0]):
            best = (s, cost)
    return best


# ------------------------------------------------------------------------------------ Slurm's topology.conf

_HOSTLIST = re.compile(r"^([^\[\],]*)\[([0-9,\-]+)\](.*)$")


def expand_hostlist(text: str) -> list[str]:
    """Slurm's hostlist ("n[1-4,7],gpu01") as names."""
    out: list[str] = []
    # split on commas outside brackets
    parts, depth, cur = [], 0, ""
    for c in text:
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    for part in (p.strip() for p in parts):
        if not part:
            continue
        m = _HOSTLIST.match(part)
        if m is None:
            if "[" in part or "]" in part:
                raise ValueError(f"unbalanced brackets in {part!r}")
            out.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise ValueError(f"bad range {r!r} in {part!r}")
            width = len(lo)
            for v in range(int(lo), int(hi or lo) + 1):
                out.append(f"{prefix}{v:0{width}d}{suffix}")
    return out


def parse_topology_conf(text: str) -> list[Switch]:
    """Slurm's topology.conf (tree plugin): `SwitchName=s1 Nodes=n[1-4]`, `SwitchName=top Switches=s[1-2]`, and
    `LinkSpeed=` (Slurm's own unitless figure, taken here as the uplink's Gb/s). Raises ValueError with the line."""
    out: list[Switch] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields: dict[str, str] = {}
        for word in line.split():
            k, eq, v = word.partition("=")
            if not eq:
                raise ValueError(f"line {lineno}: expected Key=Value, found {word!r}")
            fields[k.lower()] = v
        name = fields.pop("switchname", None)
        if not name:
            raise ValueError(f"line {lineno}: expected SwitchName=... first")
        try:
            nodes = tuple(expand_hostlist(fields.pop("nodes", "")))
            switches = tuple(expand_hostlist(fields.pop("switches", "")))
            speed = fields.pop("linkspeed", None)
            rate = float(speed) if speed is not None else None
        except ValueError as e:
            raise ValueError(f"line {lineno}: {e}") from None
        if fields:
            raise ValueError(f"line {lineno}: unknown key(s) {', '.join(sorted(fields))}; "
                             "expected SwitchName, Nodes, Switches, LinkSpeed")
        out.append(Switch(name=name, nodes=nodes, switches=switches, rate_gbps=rate))
    return out


def layout_problem(switches: Sequence[Switch]) -> str | None:
    """Why a switch layout cannot be a tree, or None: duplicate names, a node or switch under two parents, a
    switch naming an unknown one, a cycle."""
    names = [s.name for s in switches]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        return f"switch {dup!r} is declared twice"
    parent: dict[str, str] = {}
    for s in switches:
        for child in (*s.nodes, *s.switches):
            if child in parent:
                return f"{child!r} is under both {parent[child]!r} and {s.name!r}; each has one parent switch"
            parent[child] = s.name
        for child in s.switches:
            if child not in names:
                return f"switch {s.name!r} names unknown switch {child!r}"
    for name in names:
        seen: set[str] = set()
        cur = name
        while cur in parent:
            if cur in seen:
                return f"switch {name!r} is in a cycle"
            seen.add(cur)
            cur = parent[cur]
    return None


def nic_kind(text: str) -> NicKind | None:
    low = text.strip().lower()
    return {"ib": NicKind.IB, "infiniband": NicKind.IB, "roce": NicKind.ROCE,
            "ethernet": NicKind.ETHERNET, "eth": NicKind.ETHERNET}.get(low)


def network_env(node: Node, devices: Iterable[int]) -> dict[str, str]:
    """What tells NCCL (and RCCL, which reads the same names) and UCX to use the NICs chosen for a share on these
    GPUs (`node_nics`): `NCCL_IB_HCA` the RDMA devices ("=" for exact names: NCCL matches prefixes otherwise),
    `NCCL_SOCKET_IFNAME` their interfaces (bootstrap and the socket transport), `UCX_NET_DEVICES` device:port;
    plain Ethernet only: the interfaces, and `NCCL_IB_DISABLE=1`. Empty where the node has no active NIC."""
    _bw, nics = node_nics(node, devices)
    if not nics:
        return {}
    rdma = [x for x in nics if x.kind in (NicKind.IB, NicKind.ROCE)]
    ifaces = [x.netdev for x in nics if x.netdev] if rdma else [x.netdev or x.name for x in nics]
    env: dict[str, str] = {}
    if rdma:
        env["NCCL_IB_HCA"] = "=" + ",".join(x.name for x in rdma)
        env["UCX_NET_DEVICES"] = ",".join(f"{x.name}:1" for x in rdma)
    else:
        env["NCCL_IB_DISABLE"] = "1"
        env["UCX_NET_DEVICES"] = ",".join(ifaces)
    if ifaces:
        env["NCCL_SOCKET_IFNAME"] = "=" + ",".join(ifaces)
    return env
