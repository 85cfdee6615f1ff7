"""A gang across nodes placed by the network between them (issue 32): each node's share as the round's placer gives
it, moved onto GPUs PCIe-near a faster NIC where that raises the node's bandwidth, then the nodes of least cost
(hsched.topo.fabric: the bottleneck of NIC rates and switch uplinks, then switch hops; the round's order among
equals). Used by the plan's placer and by backfill alike. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import replace

from hsched.model import Node, Placement
from hsched.topo.fabric import Fabric, best_gang, node_nics

ShareFit = Callable[[Node, Collection[str] | None], Placement | None]
"""A node's share on its free devices (or only among the given ones), or None."""


def on_fabric(fabric: Fabric, nodes: Sequence[Node]) -> bool:
    """Whether the network between these nodes is known at all (else gangs keep the plain order). Not where a
    Slurm node group is among them: a gang goes whole to the first group in order that takes it (Slurm places
    it inside), and that order stays as it was."""
    if any(n.executor == "slurm" for n in nodes):
        return False
    return bool(fabric.switches) or any(n.nics for n in nodes)


def indices(node: Node, p: Placement) -> list[int]:
    """The device indices of a share (what a NIC's `near` names)."""
    return [d.index for u in p.devices if (d := node.device(u)) is not None]


def nearer_share(node: Node, gpus: int, free: Sequence[str], fit: ShareFit, plain: Placement) -> Placement:
    """`plain`, or a share that reaches a NIC giving the node more bandwidth (a NIC counts in full when some GPU of
    the share is PCIe-near it): the placer asked again among that NIC's free near GPUs and just g-1 others, so
    that whatever it picks holds a near one."""
    best, best_bw = plain, node_nics(node, indices(node, plain))[0]
    index = {d.uuid: d.index for d in node.devices}
    for nic in sorted((x for x in node.nics if x.active and x.near), key=lambda x: -x.rate_gbps):
        if nic.rate_gbps <= best_bw:
            break
        near = [u for u in free if index.get(u) in nic.near]
        if not near:
            continue
        others = [u for u in free if u in index and index[u] not in nic.near][:max(gpus - 1, 0)]
        p = fit(node, frozenset(near + others))
        if p is not None and (bw := node_nics(node, indices(node, p))[0]) > best_bw:
            best, best_bw = p, bw
    return best


def gang_on_fabric(fabric: Fabric, need: int, gpus: int, nodes: Sequence[Node], fit: ShareFit,
                   free_of: Callable[[Node], Sequence[str]], keep: Callable[[Placement], bool] | None = None
                   ) -> tuple[Placement, ...] | None:
    """The gang's shares on `need` of `nodes` (in the round's order; Slurm groups are left out: a gang goes whole
    to one of those), or None when fewer than `need` have room. `keep`: a further check of a share."""
    shares: list[tuple[Node, Placement]] = []
    for node in nodes:
        if node.executor == "slurm":
            continue
        p = fit(node, None)
        if p is None:
            continue
        if node.nics:
            p = nearer_share(node, gpus, free_of(node), fit, p)
        if keep is not None and not keep(p):
            continue
        shares.append((node, p))
    picked = best_gang(fabric, [(n, indices(n, p)) for n, p in shares], need)
    if picked is None:
        return None
    chosen, cost = picked
    # `hsched show` joins the shares' explanations: the gang's cost once (on the first), each node's NICs on its own
    out = []
    for k, i in enumerate(chosen):
        node, p = shares[i]
        nics = cost.nics.get(node.name, ())
        note = f"NIC {','.join(x.name for x in nics)}" if nics else "no active NIC"
        if k == 0:
            note = f"{cost.explain()}; {note}"
        out.append(replace(p, explanation=f"{p.explanation}; {note}" if p.explanation else note))
    return tuple(out)
