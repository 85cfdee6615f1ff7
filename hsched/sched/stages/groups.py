"""Node groups (a Slurm partition as one node, issue 17): a gang goes whole to one group, each share on another of
its hosts (`Device.host`), as one `sbatch --nodes=N --gpus-per-node=G` asks Slurm; a single share is placed on one
host by the ledger itself (hsched.sched.state: `RoundState.fit`). Pure: no I/O."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from hsched.model import Node, Placement, Resources
from hsched.sched.state import RoundState, by_host


def gang_on_group(st: RoundState, node: Node, res: Resources, busy: Collection[str]) -> tuple[Placement, ...] | None:
    """A gang whole on one Slurm node group: `res.nodes` placements on the group, each on another of its Slurm
    nodes (what `sbatch --nodes=N --gpus-per-node=G` asks Slurm for; Slurm still picks which), or None. CPUs and
    memory count once per share, as on distinct nodes."""
    n = res.nodes
    if res.cpus and node.cpus is not None and st.cpus_used.get(node.name, 0) + n * res.cpus > node.cpus:
        return None
    if (res.memory_mib and node.memory_total_mib is not None
            and st.memory_used.get(node.name, 0) + n * res.memory_mib > node.memory_total_mib):
        return None
    share = replace(res, nodes=1)
    if res.gpus == 0:
        p = st.fit(node, share, busy)
        return None if p is None else (p,) * n
    hosts = st.hosts(node) or {}
    free = [u for u in st.eligible(node, res) if u not in busy]
    out: list[Placement] = []
    for part in by_host(free, hosts, res.gpus):
        p = st.fit(node, share, busy, among=frozenset(part))
        if p is not None:
            out.append(p)
            if len(out) == n:
                return tuple(out)
    return None

