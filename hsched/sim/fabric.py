"""The network between the simulator's servers (issue 32): a two-level switch layout, what a gang's speed loses when
its ranks span slower links, and a communication-aware placer, so the live rule (hsched.sched.stages.fabric) is
measured before it runs.

The model, stated: a gang spread over servers moves its gradients over the slowest link between them. Within one
leaf that is a server's NIC (`nic_gbps`); across leaves it is the leaf's uplink share per server (`uplink_gbps`,
an oversubscribed tree: below the NIC rate). A share `comm_share` of a step is communication at NIC speed, so over a
bottleneck B the step takes (1 - comm_share) + comm_share x nic_gbps / B of its time at full speed, and the speed
is its inverse. A gang on one server uses no network (factor 1). No fabric declared: nothing changes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hsched.model import Placement
from hsched.sched.placement import PackingPlacer, Placer
from hsched.sched.view import JobView, ServerView


@dataclass(frozen=True, slots=True)
class SimFabric:
    leaf_of: Mapping[str, str] = field(default_factory=dict)
    """Server name -> its leaf switch."""
    nic_gbps: float = 200.0
    uplink_gbps: float = 100.0
    """Each server's share of its leaf's uplink (2:1 oversubscribed by default)."""
    comm_share: float = 0.3
    """The share of a step spent communicating when the links run at `nic_gbps`."""

    def bandwidth(self, nodes: Sequence[str]) -> float:
        """The modelled inter-node bandwidth of a gang on these servers (inf: one server, no network)."""
        if len(set(nodes)) <= 1:
            return float("inf")
        leaves = {self.leaf_of.get(n, n) for n in nodes}
        return self.nic_gbps if len(leaves) == 1 else min(self.nic_gbps, self.uplink_gbps)

    def speed(self, nodes: Sequence[str]) -> float:
        """The gang's throughput multiplier over these servers (1: one server or full NIC speed)."""
        bw = self.bandwidth(nodes)
        if bw == float("inf"):
            return 1.0
        return 1.0 / ((1.0 - self.comm_share) + self.comm_share * self.nic_gbps / bw)


def two_leaves(servers: Sequence[ServerView], interleaved: bool = False, **kw: float) -> SimFabric:
    """Each GPU type's servers split in two: the first half under leaf1, the rest under leaf2 (`interleaved`:
    alternately, as cabling by rack position rather than by name would; a blind placer's name order then no longer
    happens to follow the leaves)."""
    leaf: dict[str, str] = {}
    by_type: dict[str, list[str]] = {}
    for s in servers:
        by_type.setdefault(s.gpu_type, []).append(s.name)
    for names in by_type.values():
        for i, n in enumerate(names):
            first = i % 2 == 0 if interleaved else i < (len(names) + 1) // 2
            leaf[n] = "leaf1" if first else "leaf2"
    return SimFabric(leaf_of=leaf, **kw)


class FabricPlacer:
    """Communication-aware: a gang that must span servers goes under one leaf where one leaf's free GPUs hold it
    (the leaf with the fewest free GPUs that does: best fit, leaving roomier leaves whole), else as `base` places
    it; on one server exactly as `base`."""

    def __init__(self, fabric: SimFabric, base: Placer | None = None) -> None:
        self.fabric = fabric
        self.base = base or PackingPlacer()

    def place(self, gpus: int, servers: Sequence[ServerView], free: Mapping[str, Sequence[str]],
              max_servers: int | None, job: JobView | None = None) -> tuple[Placement, ...] | None:
        one = self.base.place(gpus, servers, free, 1, job=job)
        if one is not None or max_servers == 1:
            return one
        leaves: dict[str, list[ServerView]] = {}
        for s in servers:
            leaves.setdefault(self.fabric.leaf_of.get(s.name, s.name), []).append(s)
        room = sorted((sum(len(free.get(s.name, ())) for s in ss), name) for name, ss in leaves.items())
        for have, name in room:
            if have >= gpus:
                got = self.base.place(gpus, leaves[name], free, max_servers, job=job)
                if got is not None:
                    return got
        return self.base.place(gpus, servers, free, max_servers, job=job)
