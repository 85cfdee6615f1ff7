"""Placement: choose K devices on one node for a job (pure code).

The objective is lexicographic (issue 3):

(a) the weakest link between any two chosen devices is as strong as possible
    (NV18 > NV12 > ... > NV1 > PIX > PXB > PHB > NODE > SYS > unknown; XGMI by weight);
(b) the total number of NVLinks (XGMI links) among the chosen devices is as large as possible;
(c) as few NUMA nodes as possible (a device without a NUMA id is grouped by its CPU affinity list);
(d) what stays free is left as well connected as possible: the sum of link ranks over the pairs of
    remaining free devices is maximised (fewer good pairs broken up = less fragmentation);
then the lowest device indices.

Exact search (nodes up to `EXACT_LIMIT` = 16 candidate devices) runs in two phases. Phase 1 finds the best
achievable weakest link (a) by asking, strongest threshold first, whether the threshold graph has a K-clique.
Phase 2 is a branch and bound over (b, c, d) restricted to that graph, with two prunings: an upper bound on (b)
(each device still to add contributes at most its links to the chosen ones plus half of its best K-1 links),
and symmetry breaking: devices whose rows are identical (same links to every other device, same NUMA group)
are interchangeable, so only the lowest-indexed members of such a class are ever taken.

Above the limit a documented greedy heuristic runs instead: from every candidate as a seed, repeatedly add
the device with the strongest weakest link to the set, then most links, then the set's NUMA group, then the
lowest index; score each full set with the exact objective, keep the best, and improve it by single swaps
until no swap helps.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hsched.errors import UserError
from hsched.model import DEVICE_FIXED
from hsched.topo.cliques import find_clique
from hsched.topo.inventory import device_name
from hsched.topo.links import LinkClass, estimate_bandwidth_gbps, fabric_links, link_class, link_strength
from hsched.topo.models import Catalog, lookup_model, parse_cc
from hsched.topo.topology import TopoDevice, TopoLink, Topology, format_cpulist

if TYPE_CHECKING:
    from hsched.model import Node, Resources

EXACT_LIMIT = 16


class NoPlacement(UserError):
    """No set of free devices satisfies the request; the message says why."""


@dataclass(frozen=True, slots=True)
class Constraints:
    gpu_types: tuple[str, ...] = ()
    """Case-insensitive substrings of the device model (`a100` matches "NVIDIA A100-SXM4-80GB")."""
    min_memory_mib: int | None = None
    min_compute_capability: str | None = None
    interconnect: str = "any"
    """"nvlink": every chosen pair must be joined by NVLink (or XGMI); a hard requirement."""
    cpus: int | None = None
    """How many CPU cores to pick from the NUMA nodes local to the chosen devices (None: all local)."""

    @classmethod
    def from_resources(cls, resources: Resources) -> Constraints:
        return cls(
            gpu_types=tuple(resources.gpu_types),
            min_memory_mib=resources.gpu_memory_mib,
            interconnect=str(resources.interconnect),
            cpus=resources.cpus,
        )


@dataclass(frozen=True, slots=True)
class PlacementResult:
    devices: tuple[str, ...]
    """Device names (GPU0...), or UUIDs when produced by `place_on_node`."""
    score: float
    """Estimated GB/s (per direction) of the weakest chosen pair; 0 for a single device or unknown links."""
    explanation: str
    cpus: tuple[int, ...] = ()
    weakest: str | None = None
    nvlinks: int = 0
    numa_nodes: tuple[int, ...] = ()
    nics: tuple[str, ...] = ()
    exact: bool = True
    objective: tuple[Any, ...] = field(default=(), repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "devices": list(self.devices),
            "score": self.score,
            "explanation": self.explanation,
            "weakest_link": self.weakest,
            "nvlinks": self.nvlinks,
            "numa_nodes": list(self.numa_nodes),
            "nics": list(self.nics),
            "cpus": format_cpulist(self.cpus),
            "exact": self.exact,
        }


# ---- problem set-up --------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Problem:
    free: list[TopoDevice]
    cand: list[int]  # indices into `free`
    R: list[list[int]]  # dense strength rank per free pair (0 = unknown)
    C: list[list[int]]  # fabric links per free pair
    numa: list[Any]
    row_r: list[int]  # sum of R over free for each device (for objective d)
    total_r: int
    k: int
    min_rank: int  # pairs below this rank are forbidden (interconnect = nvlink)


def _numa_key(d: TopoDevice) -> Any:
    if d.numa_node is not None:
        return d.numa_node
    if d.cpu_affinity:
        return ("cpus", d.cpu_affinity)
    return None


def _device_ok(d: TopoDevice, c: Constraints, catalog: Catalog | None) -> str | None:
    """None if `d` satisfies the constraints, else the reason it does not."""
    model = d.model or ""
    if c.gpu_types and not any(t.lower() in model.lower() for t in c.gpu_types):
        return "model"
    known = lookup_model(d.model, catalog) if (c.min_memory_mib or c.min_compute_capability) else None
    if c.min_memory_mib:
        mem = d.memory_mib if d.memory_mib is not None else (known.memory_mib if known else None)
        if mem is None or mem < c.min_memory_mib:
            return "memory"
    if c.min_compute_capability:
        want = parse_cc(c.min_compute_capability)
        have = parse_cc(d.compute_capability) or (known.cc_tuple() if known else None)
        if want is None:
            raise UserError(f"min compute capability {c.min_compute_capability!r} is not like '8.0'")
        if have is None or have < want:
            return "compute capability"
    return None


def _setup(topo: Topology, k: int, busy: Collection[str], c: Constraints, catalog: Catalog | None) -> _Problem:
    names = {d.name for d in topo.devices}
    unknown = sorted(set(busy) - names)
    if unknown:
        raise UserError(
            f"busy device(s) {', '.join(unknown)} not in the topology (devices: "
            f"{', '.join(d.name for d in topo.devices)})"
        )
    if k < 1:
        raise UserError(f"--gpus must be at least 1 (got {k})")
    free = [d for d in sorted(topo.devices, key=lambda d: d.index) if d.name not in busy]
    reasons: dict[str, int] = {}
    cand: list[int] = []
    for i, d in enumerate(free):
        why = _device_ok(d, c, catalog)
        if why is None:
            cand.append(i)
        else:
            reasons[why] = reasons.get(why, 0) + 1
    if len(cand) < k:
        parts = [f"{len(topo.devices)} devices", f"{len(topo.devices) - len(free)} busy"]
        parts += [f"{n} fail the {why} constraint" for why, n in sorted(reasons.items())]
        raise NoPlacement(f"need {k} devices but only {len(cand)} qualify ({', '.join(parts)})")

    lmap = topo.link_map()
    n = len(free)
    strengths: dict[tuple[int, int], tuple[int, int]] = {}
    C = [[0] * n for _ in range(n)]
    for i, j in itertools.combinations(range(n), 2):
        lk = lmap.get(frozenset((free[i].name, free[j].name)))
        if lk is not None:
            strengths[(i, j)] = lk.strength
            C[i][j] = C[j][i] = lk.fabric_links
    ranks = {s: r for r, s in enumerate(sorted(set(strengths.values())), start=1)}
    R = [[0] * n for _ in range(n)]
    for (i, j), s in strengths.items():
        R[i][j] = R[j][i] = ranks[s]
    min_rank = 0
    if c.interconnect == "nvlink" and k > 1:
        fabric = [r for s, r in ranks.items() if s[0] == int(LinkClass.FABRIC)]
        if not fabric:
            raise NoPlacement(
                f"interconnect = nvlink but no two free devices are joined by NVLink/XGMI "
                f"(links here: {', '.join(sorted({lk.kind for lk in topo.device_links()})) or 'none'})"
            )
        min_rank = min(fabric)
    row_r = [sum(R[i]) for i in range(n)]
    return _Problem(
        free=free,
        cand=cand,
        R=R,
        C=C,
        numa=[_numa_key(d) for d in free],
        row_r=row_r,
        total_r=sum(row_r) // 2,
        k=k,
        min_rank=min_rank,
    )


def _objective(p: _Problem, S: Sequence[int]) -> tuple[int, int, int, int]:
    R, C = p.R, p.C
    weakest = min((R[u][v] for u, v in itertools.combinations(S, 2)), default=1 << 30)
    links = sum(C[u][v] for u, v in itertools.combinations(S, 2))
    numa = len({p.numa[u] for u in S})
    inner = sum(R[u][v] for u, v in itertools.combinations(S, 2))
    remaining = p.total_r - sum(p.row_r[u] for u in S) + inner
    return (weakest, links, -numa, remaining)


# ---- exact search ----------------------------------------------------------------------------------------


def _has_clique(p: _Problem, t: int) -> bool:
    """Is there a K-clique among candidates whose pairs all have rank >= t? (hsched.topo.cliques: the search
    the topology graph uses for its NVLink domains too)"""
    R = p.R
    adj = {u: {v for v in p.cand if v != u and R[u][v] >= t} for u in p.cand}
    return find_clique(p.cand, adj, p.k) is not None


def _classes(p: _Problem) -> dict[int, int]:
    """Interchangeable candidates: same NUMA group and identical links to every other free device."""
    n = len(p.free)
    cls: dict[int, int] = {}
    for u in p.cand:
        for rep in sorted(set(cls.values())):
            if p.numa[u] == p.numa[rep] and all(
                p.R[u][w] == p.R[rep][w] and p.C[u][w] == p.C[rep][w] for w in range(n) if w not in (u, rep)
            ):
                cls[u] = rep
                break
        else:
            cls[u] = u
    return cls


def _exact(p: _Problem) -> tuple[int, ...]:
    k = p.k
    if k == 1:
        # a lone device: leave the rest best connected, then the lowest index
        return (max(p.cand, key=lambda u: (_objective(p, (u,))[2:], -u)),)
    levels = sorted({p.R[u][v] for u, v in itertools.combinations(p.cand, 2)}, reverse=True)
    best_t = next((t for t in levels if t >= p.min_rank and _has_clique(p, t)), None)
    if best_t is None:
        raise NoPlacement(f"no {k} free devices are all pairwise joined by NVLink/XGMI")
    R, C = p.R, p.C
    cand = [u for u in p.cand if sum(1 for v in p.cand if v != u and R[u][v] >= best_t) >= k - 1]
    cls = _classes(p)
    # who may be chosen with whom (every pair at least best_t); and prefix sums of each candidate's strongest
    # links (NVLink counts, ranks) to those: what it can add to a set at most, for the bounds below
    ok = {u: frozenset(v for v in cand if v != u and R[u][v] >= best_t) for u in cand}
    top_links = {u: _prefix(sorted((C[u][v] for v in ok[u]), reverse=True), k) for u in cand}
    top_ranks = {u: _prefix(sorted((R[u][v] for v in ok[u]), reverse=True), k) for u in cand}
    row_r, total_r, numa_of = p.row_r, p.total_r, p.numa
    best: list[Any] = [None, ()]  # objective, set

    def dfs(pool: list[int], chosen: list[int], links: int, inner: int, rows: int, numa: frozenset[Any],
            skipped: frozenset[int], to_c: list[int], to_r: list[int]) -> None:
        """`pool`: the candidates after the last chosen one (in `cand` order) that may join every chosen one;
        `links`/`inner`/`rows`: the chosen pairs' NVLinks and ranks, their rows' ranks; `to_c`/`to_r`: each
        device's NVLinks and ranks to the chosen."""
        if len(chosen) == k:
            obj = _objective(p, chosen)
            if best[0] is None or obj > best[0]:
                best[0], best[1] = obj, tuple(chosen)
            return
        rest = [v for v in pool if cls[v] not in skipped]
        need = k - len(chosen)
        if need > len(rest):
            return
        if best[0] is not None:
            # every set here has the best weakest link (best_t), so (b, c, d) decide; a bound below the best so
            # far cannot beat it, nor can one equal to it (ties keep the first found: the lowest indices)
            gains = sorted([to_c[v] + top_links[v][need - 1] / 2 for v in rest], reverse=True)
            ub = (links + int(sum(gains[:need])), -len(numa))
            if ub < (best[0][1], best[0][2]):
                return
            if ub == (best[0][1], best[0][2]):
                # (d) at most: what the chosen leave, less each added device's row, plus its ranks to the chosen
                # and half its strongest ranks to the others (each pair of added devices counted once)
                gains = sorted([to_r[v] - row_r[v] + top_ranks[v][need - 1] / 2 for v in rest], reverse=True)
                if total_r - rows + inner + sum(gains[:need]) <= best[0][3]:
                    return
        for i, v in enumerate(pool):
            if cls[v] in skipped:
                continue
            if len(chosen) + (len(pool) - i) < k:
                return
            mates = ok[v]
            dfs([w for w in pool[i + 1:] if w in mates], [*chosen, v], links + to_c[v], inner + to_r[v],
                rows + row_r[v], numa | {numa_of[v]}, skipped,
                [a + b for a, b in zip(to_c, C[v], strict=True)], [a + b for a, b in zip(to_r, R[v], strict=True)])
            # not taking v: later members of v's class are interchangeable with it, so skip them too
            skipped = skipped | {cls[v]}

    n = len(p.free)
    dfs(cand, [], 0, 0, 0, frozenset(), frozenset(), [0] * n, [0] * n)
    return best[1]


def _prefix(values: Sequence[int], length: int) -> list[int]:
    """[0, v0, v0+v1, ...], at least `length` long (the whole sum repeated): the sum of the first m is out[m]."""
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    out += [out[-1]] * (length - len(out))
    return out


# ---- heuristic ------------------------------------------------------------------------------------------


def _greedy(p: _Problem) -> tuple[int, ...]:
    k, R, C = p.k, p.R, p.C

    def feasible(S: Iterable[int]) -> bool:
        return all(R[u][v] >= p.min_rank for u, v in itertools.combinations(S, 2))

    best: tuple[Any, tuple[int, ...]] | None = None
    for seed in p.cand:
        S = [seed]
        while len(S) < k:
            numa = {p.numa[u] for u in S}
            options = [v for v in p.cand if v not in S and all(R[u][v] >= p.min_rank for u in S)]
            if not options:
                break
            S.append(
                max(options, key=lambda v: (min(R[u][v] for u in S), sum(C[u][v] for u in S), p.numa[v] in numa, -v))
            )
        if len(S) < k:
            continue
        key = (_objective(p, S), tuple(-x for x in sorted(S)))  # lowest indices break ties
        if best is None or key > best[0]:
            best = (key, tuple(sorted(S)))
    if best is None:
        raise NoPlacement(f"no {k} free devices are all pairwise joined by NVLink/XGMI")
    S = list(best[1])
    # 1-swap local search: the greedy's blind spot is an early choice that blocks a better partner
    improved = True
    while improved:
        improved = False
        cur_obj = _objective(p, S)
        for i in range(len(S)):
            for v in p.cand:
                if v in S:
                    continue
                T = [*S[:i], v, *S[i + 1 :]]
                if feasible(T) and _objective(p, T) > cur_obj:
                    S, improved = sorted(T), True
                    break
            if improved:
                break
    return tuple(sorted(S))


# ---- public ---------------------------------------------------------------------------------------------


def place(
    topology: Topology,
    k: int,
    busy: Collection[str] = (),
    constraints: Constraints | None = None,
    *,
    catalog: Catalog | None = None,
    exact_limit: int = EXACT_LIMIT,
) -> PlacementResult:
    """The best K free devices of `topology` (names as in the topology, e.g. GPU0).

    Raises NoPlacement (a UserError) with the reason when no set qualifies, UserError for bad arguments.
    """
    c = constraints or Constraints()
    p = _setup(topology, k, set(busy), c, catalog)
    exact = len(p.cand) <= exact_limit
    chosen = _exact(p) if exact else _greedy(p)
    return _result(topology, p, chosen, c, exact)


def greedy_place(
    topology: Topology, k: int, busy: Collection[str] = (), constraints: Constraints | None = None
) -> PlacementResult:
    """The heuristic alone (for the benchmark and for very large nodes)."""
    return place(topology, k, busy, constraints, exact_limit=-1)


def _result(topo: Topology, p: _Problem, chosen: tuple[int, ...], c: Constraints, exact: bool) -> PlacementResult:
    devs = [p.free[i] for i in chosen]
    lmap = topo.link_map()
    pair_links: list[TopoLink | None] = [
        lmap.get(frozenset((a.name, b.name))) for a, b in itertools.combinations(devs, 2)
    ]
    weakest_link = None
    if pair_links and all(pair_links):
        weakest_link = min(pair_links, key=lambda lk: link_strength(lk.kind, lk.weight, lk.links))  # type: ignore[union-attr]
    kinds = sorted({lk.kind for lk in pair_links if lk}, key=lambda s: link_strength(s), reverse=True)
    nv = sum(fabric_links(lk.kind, lk.links) for lk in pair_links if lk)
    numa_nodes = tuple(sorted({d.numa_node for d in devs if d.numa_node is not None}))
    nics = _local_nics(topo, devs)
    cpus = _pick_cpus(topo, devs, c.cpus)
    score = 0.0
    if weakest_link is not None:
        bw = weakest_link.bandwidth_gbps or estimate_bandwidth_gbps(
            weakest_link.kind, model=devs[0].model, weight=weakest_link.weight
        )
        score = float(bw or 0.0)
    return PlacementResult(
        devices=tuple(d.name for d in devs),
        score=score,
        explanation=_explain(devs, pair_links, kinds, weakest_link, nv, numa_nodes, nics, exact),
        cpus=cpus,
        weakest=weakest_link.kind if weakest_link else None,
        nvlinks=nv,
        numa_nodes=numa_nodes,
        nics=nics,
        exact=exact,
        objective=_objective(p, chosen),
    )


def _local_nics(topo: Topology, devs: Sequence[TopoDevice]) -> tuple[str, ...]:
    """NICs behind the same PCIe switch as a chosen device (PIX/PXB), best first."""
    found: dict[str, tuple[int, int]] = {}
    names = {d.name for d in devs}
    for lk in topo.links:
        nic = lk.b if lk.a in names else lk.a if lk.b in names else None
        if nic is None or nic in names or link_class(lk.kind) not in (LinkClass.PIX, LinkClass.PXB):
            continue
        s = lk.strength
        if nic not in found or s > found[nic]:
            found[nic] = s
    labels = {n.name: n.label for n in topo.nics}
    if not found:
        return ()
    top = max(found.values())  # only the closest class (PIX over PXB): those are the NICs to use
    order = sorted((n for n in found if found[n] == top), key=_natural)
    return tuple(labels.get(n, n) for n in order)


def _natural(name: str) -> int:
    digits = "".join(ch for ch in name if ch.isdigit())
    return int(digits) if digits else 0


def _pick_cpus(topo: Topology, devs: Sequence[TopoDevice], want: int | None) -> tuple[int, ...]:
    """CPU cores local to the chosen devices: their affinity lists, else their NUMA nodes' CPUs."""
    pool: list[int] = []
    seen: set[int] = set()
    numa = {n.id: n for n in topo.numa}
    for d in devs:
        cpus = d.cpu_affinity or (numa[d.numa_node].cpus if d.numa_node in numa else ())
        for cpu in cpus:
            if cpu not in seen:
                seen.add(cpu)
                pool.append(cpu)
    pool.sort()
    if want is not None and len(devs) > 1 and want < len(pool):
        # spread the request over the devices' affinity sets so every GPU has local cores
        per: list[list[int]] = [sorted(d.cpu_affinity) for d in devs]
        out: list[int] = []
        taken: set[int] = set()
        while len(out) < want and any(per):
            for lst in per:
                while lst and lst[0] in taken:
                    lst.pop(0)
                if lst and len(out) < want:
                    taken.add(lst[0])
                    out.append(lst.pop(0))
        if len(out) == want:
            return tuple(sorted(out))
    return tuple(pool[:want] if want is not None else pool)


def format_device_range(names: Sequence[str]) -> str:
    """["GPU0", "GPU1", "GPU2", "GPU3"] -> "GPU0-3"; ["GPU0", "GPU2", "GPU3"] -> "GPU0,2-3"."""
    if not names:
        return "-"
    prefix = names[0].rstrip("0123456789")
    if not all(n.startswith(prefix) and n[len(prefix) :].isdigit() for n in names):
        return ",".join(names)
    # the same compaction as a Linux CPU list
    return prefix + format_cpulist(int(n[len(prefix) :]) for n in names)


def _explain(
    devs: Sequence[TopoDevice],
    pair_links: Sequence[TopoLink | None],
    kinds: Sequence[str],
    weakest: TopoLink | None,
    nv: int,
    numa: Sequence[int],
    nics: Sequence[str],
    exact: bool,
) -> str:
    head = format_device_range([d.name for d in devs])
    bits: list[str] = []
    if len(devs) == 1:
        bits.append("single device")
    elif not any(pair_links):
        bits.append("links unknown")
    elif len(kinds) == 1 and all(pair_links):
        bits.append(f"all pairs {kinds[0]}")
    else:
        w = weakest.kind if weakest else "unknown"
        bits.append(f"weakest link {w} ({'/'.join(kinds)} mix)" + (f", {nv} NVLinks" if nv else ""))
    if numa:
        bits.append(f"NUMA {','.join(str(n) for n in numa)}")
    if nics:
        bits.append(f"NIC {nics[0]} local" if len(nics) == 1 else f"NICs {','.join(nics[:4])} local")
    if not exact:
        bits.append("heuristic")
    return f"{head}: {', '.join(bits)}"


# ---- the controller's entry point -----------------------------------------------------------------------


_Answers = dict[tuple[int, frozenset[str], Constraints], PlacementResult | None]
_TOPOLOGIES: dict[tuple[tuple[object, ...], int], tuple[object, Topology, _Answers]] = {}
"""`topology_of_node`'s answers by what a node's devices are (`DEVICE_FIXED`: not their readings) and the `id` of its
links, with the very links (kept here, so an id is never another live tuple's), and `place_on_node`'s answers on that
topology (`_kept`)."""
_TOPOLOGIES_AT_MOST = 1024
_ANSWERS_AT_MOST = 512


def _kept(node: Node) -> tuple[object, Topology, _Answers]:
    """The node's topology, kept while its devices are the same as a topology sees them and its links the very same
    (a heartbeat makes new devices with new readings, and keeps the links), with the placements asked of it: a
    placement is a function of the topology, the count, the busy devices and the constraints alone, and a node's busy
    sets recur (a 1-GPU job placed where one GPU is free, or a head reserved on the GPU that frees first, is one of
    eight questions on an eight-GPU node). Made afresh, the topology was most of placing a one-GPU job on an eight-GPU
    node (~140 of ~190 us), and a placement asked afresh cost ~0.2-0.5 ms (the exact search, the NICs and CPUs near
    the chosen devices, the explanation), several times a churning live round (issue 33)."""
    key = (tuple(map(DEVICE_FIXED, node.devices)), id(node.links))
    hit = _TOPOLOGIES.get(key)
    if hit is not None and hit[0] is node.links:
        return hit
    if len(_TOPOLOGIES) >= _TOPOLOGIES_AT_MOST:
        _TOPOLOGIES.clear()  # (nodes come and go: a bound, not an eviction policy)
    got = _TOPOLOGIES[key] = (node.links, _topology_of(node), {})
    return got


def topology_of_node(node: Node) -> Topology:
    """A `hsched.model.Node` (devices by UUID, `links` by UUID) as a Topology named GPU<index> (kept: `_kept`)."""
    return _kept(node)[1]


def _topology_of(node: Node) -> Topology:
    devices = tuple(
        TopoDevice(
            name=device_name(d),  # a MIG instance under its GPU's name: GPU0.1 is the second slice of GPU 0
            index=d.index,
            uuid=d.uuid,
            model=d.model,
            pci_bus_id=d.pci_bus_id,
            numa_node=d.numa_node,
            numa_nodes=(d.numa_node,) if d.numa_node is not None else (),
            memory_mib=d.memory_total_mib,
            compute_capability=d.compute_capability,
            cpu_affinity=tuple(d.cpu_affinity),
        )
        for d in sorted(node.devices, key=lambda d: d.index)
    )
    by_uuid = {d.uuid: d.name for d in devices}
    links = tuple(
        TopoLink(by_uuid[lk.a], by_uuid[lk.b], lk.kind, bandwidth_gbps=lk.bandwidth_gbps)
        for lk in node.links
        if lk.a in by_uuid and lk.b in by_uuid and lk.a != lk.b
    )
    return Topology(devices=devices, links=links, source_format="node")


def place_on_node(
    node: Node,
    k: int,
    free_uuids: Collection[str],
    resources: Resources | None = None,
    *,
    catalog: Catalog | None = None,
) -> PlacementResult | None:
    """The best K of `free_uuids` on `node` for a job asking `resources`; devices in the result are UUIDs.

    Returns None when the node cannot host the job (not enough matching free devices, or
    interconnect = "nvlink" impossible). A node without links treats every pair alike: lowest indices win.
    """
    _links, topo, answers = _kept(node)
    free = set(free_uuids)
    busy = frozenset(d.name for d in topo.devices if d.uuid not in free)
    c = Constraints.from_resources(resources) if resources is not None else Constraints()
    if catalog is not None:  # (another catalog's answers are not kept)
        return _place_on(topo, k, busy, c, catalog)
    key = (k, busy, c)
    if key in answers:
        return answers[key]
    if len(answers) >= _ANSWERS_AT_MOST:
        answers.clear()  # (a bound, not an eviction policy)
    got = answers[key] = _place_on(topo, k, busy, c, None)
    return got


def _place_on(topo: Topology, k: int, busy: frozenset[str], c: Constraints,
              catalog: Catalog | None) -> PlacementResult | None:
    try:
        res = place(topo, k, busy, c, catalog=catalog)
    except NoPlacement:
        return None
    uuid_of = {d.name: d.uuid or d.name for d in topo.devices}
    return PlacementResult(
        devices=tuple(uuid_of[n] for n in res.devices),
        score=res.score,
        explanation=res.explanation,
        cpus=res.cpus,
        weakest=res.weakest,
        nvlinks=res.nvlinks,
        numa_nodes=res.numa_nodes,
        nics=res.nics,
        exact=res.exact,
        objective=res.objective,
    )


def why_not_on_node(node: Node, k: int, free_uuids: Collection[str], resources: Resources | None = None) -> str:
    """The one-line reason `place_on_node` returned None ("" if it would succeed)."""
    topo = topology_of_node(node)
    busy = {d.name for d in topo.devices if d.uuid not in set(free_uuids)}
    try:
        place(topo, k, busy, Constraints.from_resources(resources) if resources else Constraints())
    except UserError as e:
        return f"{node.name}: {e}"
    return ""
