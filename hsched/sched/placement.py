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


def fragmentation_key(link: str, size: int, free_count: int, gpus: int) -> tuple[int, int, int]:
    """Where a job of `gpus` GPUs (per server) leaves the fewest large free NVLink domains broken (issue 14, item
    6): the live controller's node choice among servers of the GPU type the policy picked, and among all nodes
    when it backfills. `link`: the server's weakest link ("nvlink"/"pcie", hsched.sched.servers.server_link),
    `size`: all its devices, `free_count`: those free now.

    A gang wants NVLink: NVLink servers first, then best fit (`best_fit_key`'s order). A single GPU needs no link,
    so best fit comes first: the server with the fewest free GPUs that still holds it (a partly used server before
    an empty one, a small one before a big one), then one without an NVLink domain to break, then the smaller.
    In the demo lab, four one-GPU jobs that went to the empty 8-GPU NVSwitch box (NVLink first) now fill the
    2-GPU workstations and the PCIe box, and an 8-GPU job after them still starts (tests/sched/
    test_fragmentation.py)."""
    nvlink = link == "nvlink" and size > 1  # (a one-device server has no domain to break)
    if gpus > 1:
        return (0 if link == "nvlink" else 1, free_count, size)
    return (free_count, 1 if nvlink else 0, size)


class PackingPlacer:
    """Best-fit consolidation on one server; otherwise the fewest servers, largest free first."""

    def __init__(self) -> None:
        self._ones: dict[tuple[str, tuple[str, ...]], Placement] = {}  # (server, (device,)) -> its placement

    def one(self, node: str, devices: tuple[str, ...]) -> Placement:
        """One server's placement, made once per (server, devices): a replay starts tens of thousands of one-GPU runs
        on a few dozen devices, and a Placement is frozen and compared by value, so one serves every start there."""
        key = (node, devices)
        made = self._ones.get(key)
        if made is None:
            made = self._ones[key] = Placement(node, devices)
        return made

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
        get = free.get
        for s in servers:
            n = len(get(s.name, ()))
            if n >= gpus:
                key = (0 if s.link == "nvlink" else 1, n, s.name)  # (best_fit_key, inline: once per server per start)
                if best_key is None or key < best_key:
                    best, best_key = s, key
        if best is not None:
            devices = self.pick_devices(best, free[best.name], gpus)
            if gpus == 1:
                return (self.one(best.name, devices),)
            return (Placement(best.name, devices),)
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
