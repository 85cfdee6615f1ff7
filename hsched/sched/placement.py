"""Where a gang goes once the policy has picked its GPU type: a small seam the topology engine can fill.

`PackingPlacer` consolidates: a gang that fits on one server goes to the server with the fewest free GPUs
that still fits it (best fit, which keeps whole servers free for the next big gang), on servers whose
internal link is NVLink before PCIe-only ones. A gang too big for any one server spans the servers with the
most free GPUs (fewest pieces), unless the job forbids spanning. A topology-aware placer (choosing the K
best-linked devices inside a server) can replace `pick_devices` without touching the policies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from hsched.model import Placement
from hsched.sched.view import JobView, ServerView


class Placer(Protocol):
    """Choose devices for a gang of `gpus` among `servers` (all of one GPU type), or None if impossible.

    `job` is the job being placed, for placers that weigh its constraints (the live controller's placer
    checks GPU memory, NVLink and CPUs); the simulator's placer ignores it.
    """

    def place(
        self,
        gpus: int,
        servers: Sequence[ServerView],
        free: Mapping[str, Sequence[str]],
        max_servers: int | None,
        job: JobView | None = None,
    ) -> tuple[Placement, ...] | None: ...


def best_fit_key(server: ServerView, free_count: int) -> tuple[int, int, str]:
    """NVLink servers first, then the one with the fewest free GPUs that still fits (best fit), then name."""
    return (0 if server.link == "nvlink" else 1, free_count, server.name)


class PackingPlacer:
    """Best-fit consolidation on one server; otherwise the fewest servers, largest free first."""

    def pick_devices(self, server: ServerView, free: Sequence[str], k: int) -> tuple[str, ...]:
        """The first k free devices in index order: neighbours share a switch on most boards."""
        return tuple(free[:k])

    def place(
        self,
        gpus: int,
        servers: Sequence[ServerView],
        free: Mapping[str, Sequence[str]],
        max_servers: int | None,
        job: JobView | None = None,
    ) -> tuple[Placement, ...] | None:
        best: ServerView | None = None
        best_key: tuple[int, int, str] | None = None
        for s in servers:
            n = len(free.get(s.name, ()))
            if n >= gpus:
                key = best_fit_key(s, n)
                if best_key is None or key < best_key:
                    best, best_key = s, key
        if best is not None:
            return (Placement(best.name, self.pick_devices(best, free[best.name], gpus)),)
        if max_servers == 1:
            return None
        by_free = sorted(servers, key=lambda s: (-len(free.get(s.name, ())), s.name))
        out: list[Placement] = []
        need = gpus
        for s in by_free:
            avail = free.get(s.name, ())
            if not avail:
                break
            take = min(need, len(avail))
            out.append(Placement(s.name, self.pick_devices(s, avail, take)))
            need -= take
            if need == 0:
                break
        if need > 0 or (max_servers is not None and len(out) > max_servers):
            return None
        return tuple(out)
