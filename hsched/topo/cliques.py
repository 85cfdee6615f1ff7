"""The one clique search of hsched.topo: K devices all pairwise joined (by NVLink/XGMI, or by links at least
as strong as a threshold).

Placement asks it whether the graph of pairs at or above a link rank holds K devices (phase 1 of
`hsched.topo.place`), and the topology graph asks it for the largest all-to-all set of each NVLink domain
(`hsched.topo.graph`), which `topo show` and the dashboard print: one search, so what the tree says a domain
offers is what `--interconnect nvlink` can get there.

Pure code on plain mappings (no networkx): placement calls it in its inner loop.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping, Sequence
from typing import TypeVar

T = TypeVar("T", bound=Hashable)


def find_clique(nodes: Sequence[T], adj: Mapping[T, Collection[T]], k: int) -> tuple[T, ...] | None:
    """The first K of `nodes` (in their order) that are pairwise adjacent in `adj`, or None.

    `adj[u]` holds u's neighbours and must be symmetric. Depth first, each branch extended only by nodes after
    the last one taken that are adjacent to all taken so far; a node with fewer than K-1 neighbours is never
    tried, and a branch that cannot reach K with what is left is cut."""
    if k <= 0:
        return ()
    pool0 = [u for u in nodes if len(adj[u]) >= k - 1]

    def grow(chosen: list[T], pool: list[T]) -> tuple[T, ...] | None:
        size = len(chosen)
        if size == k:
            return tuple(chosen)
        if size + len(pool) < k:
            return None
        for i, v in enumerate(pool):
            if size + len(pool) - i < k:
                return None
            mates = adj[v]
            found = grow([*chosen, v], [w for w in pool[i + 1 :] if w in mates])
            if found is not None:
                return found
        return None

    return grow([], pool0)


def largest_clique(nodes: Sequence[T], adj: Mapping[T, Collection[T]]) -> tuple[T, ...]:
    """The largest set of `nodes` all pairwise adjacent (the first in `nodes` order among the largest)."""
    for k in range(len(nodes), 0, -1):
        found = find_clique(nodes, adj, k)
        if found is not None:
            return found
    return ()
