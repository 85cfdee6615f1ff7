"""Where a gang goes once the policy has picked its GPU type: a small seam the topology engine can fill.

`PackingPlacer` consolidates: a gang that fits on one server goes to the server with the fewest free GPUs
that still fits it (best fit, which keeps whole servers free for the next big gang), on servers whose
internal link is NVLink before PCIe-only ones. A gang too big for any one server spans the servers with the
most free GPUs (fewest pieces), unless the job forbids spanning. A topology-aware placer (choosing the K
best-linked devices inside a server) can replace `pick_devices` without touching the policies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, Protocol

from hsched.model import Placement
from hsched.sched.frozen import slot_setters
from hsched.sched.view import JobPhase, JobView, Plan, ServerView, Start


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


# JobView's fields by position (as hsched.sched.round's: a NamedTuple's field read by name is a generic attribute
# lookup), checked against the view's own at import
_JID: Final = 0
_GPUS: Final = 2
_PHASE: Final = 4
_PLACED: Final = 9
if tuple(JobView._fields[i] for i in (_JID, _GPUS, _PHASE, _PLACED)) != ("id", "gpus", "phase", "placement"):
    raise RuntimeError(f"JobView's fields moved: {JobView._fields}")
_new = object.__new__
_S_ID, _S_TYPE, _S_PLACED, _S_MIGRATE = slot_setters(Start, "job_id", "gpu_type", "placement", "migrate")


def _start(job_id: int, gpu_type: str, placement: tuple[Placement, ...], migrate: bool) -> Start:
    """`Start(job_id, gpu_type, placement, migrate)`, its slots set directly (hsched.sched.frozen)."""
    s = _new(Start)
    _S_ID(s, job_id)
    _S_TYPE(s, gpu_type)
    _S_PLACED(s, placement)
    _S_MIGRATE(s, migrate)
    return s


def place_granted(
    to_place: list[tuple[JobView, str]],
    keep: list[JobView],
    plan: Plan,
    servers: Sequence[ServerView],
    placer: Placer,
    preempt: list[int],
    repeated: bool = False,
    free_now: Mapping[str, Sequence[str]] | None = None,
    jobs: Mapping[int, JobView] | None = None,
) -> tuple[list[Start], set[int]]:
    """The round's (hsched.sched.round): devices for the granted jobs around the kept ones; a running job that cannot
    be placed is preempted. `to_place` comes in the plan's order (`repeated`: some job was wanted twice, and its rank is
    its last want). `free_now` (with `jobs`, the round's views by id): each server's devices that no running job holds
    now, in the server's order, as the caller keeps them (the simulator); else worked out from the kept jobs."""
    running = JobPhase.RUNNING  # (`JobView.running`, without its call)
    needed = {t for _, t in to_place}
    by_type: dict[str, list[ServerView]] = {}
    for s in servers:
        if s.gpu_type in needed:
            by_type.setdefault(s.gpu_type, []).append(s)
    # free devices only on the servers of the types being placed: the rest are never looked at. A device's name is
    # its node's, not the fleet's: an AMD GPU with no UUID is named by its PCI address (hsched.node.amd), the same
    # on two alike machines, so a running job holds its devices on its own node only
    if free_now is None or jobs is None:
        # each of those servers' devices in its order, less the kept jobs' there (a placement elsewhere: one lookup;
        # before, a set of held devices per node of every kept job, 40 a round on ed69ec 16:16:16, most on types
        # nobody was placed on)
        free: dict[str, list[str]] = {s.name: list(s.devices) for ss in by_type.values() for s in ss}
        held: dict[str, set[str]] = {}
        for j in keep:
            for p in j[_PLACED]:
                if p.node in free:
                    have = held.get(p.node)
                    if have is None:
                        held[p.node] = set(p.devices)
                    else:
                        have.update(p.devices)
        # (each list filtered once: a device removed from it one at a time was a pass over the list each, quadratic
        # in a large node's devices, as a live Slurm node group's)
        for name, have in held.items():
            free[name] = [d for d in free[name] if d not in have]
    else:
        # the same lists from the caller's free devices and those of the few running jobs this round stops or moves
        # (every running job is kept, stopped or moved), not from the many it keeps
        back: dict[str, list[str]] = {}
        for j in [*map(jobs.__getitem__, preempt), *(j for j, _ in to_place if j[_PHASE] is running)]:
            for p in j[_PLACED]:
                back.setdefault(p.node, []).extend(p.devices)
        free = {}
        for ss in by_type.values():
            for s in ss:
                now = free_now.get(s.name, ())
                extra = back.get(s.name)
                free[s.name] = [d for d in s.devices if d in now or d in extra] if extra else list(now)
    # big gangs first so that small jobs do not fragment the servers they need, each size in the plan's order; the
    # starts come back in the plan's order. Gangs of one size (one GPU each, Gavel's traces) are in that order
    # already: nothing to sort, either way
    rank: dict[int, int] | None = None
    if repeated:
        rank = {jid: i for i, (jid, _types) in enumerate(plan.wants)}
        to_place.sort(key=lambda jt: (-jt[0].gpus, rank.get(jt[0].id, 0)))  # type: ignore[union-attr]
    elif len({j[_GPUS] for j, _ in to_place}) > 1:
        rank = {j.id: i for i, (j, _) in enumerate(to_place)}  # (the plan's order: a stable sort keeps it)
        to_place.sort(key=lambda jt: -jt[0].gpus)
    starts: list[Start] = []
    unplaced: set[int] = set()
    packing = placer if type(placer) is PackingPlacer else None  # (exactly: a subclass may choose otherwise)
    for j, t in to_place:
        if packing is not None and j[_GPUS] == 1:
            # PackingPlacer.place of one GPU, inline (most starts of a replay): the NVLink server, then the one with the
            # fewest free GPUs, then by name, and its first free device; no server with one free: nowhere
            where: tuple[Placement, ...] | None = None
            best: tuple[int, int, str] | None = None  # (best_fit_key of the server that holds it: name last)
            for s in by_type.get(t, ()):
                n = len(free[s.name])
                if n:
                    key = (0 if s.link == "nvlink" else 1, n, s.name)
                    if best is None or key < best:
                        best = key
            if best is not None:
                left = free[best[2]]
                where = (packing.one(best[2], (left[0],)),)
                del left[0]  # (the device it takes: the first of that list)
                starts.append(_start(j[_JID], t, where, j[_PHASE] is running))  # (`migrate`: a running job's start)
                continue
        else:
            where = placer.place(j.gpus, by_type.get(t, []), free, j.max_servers, job=j)
        if where is None:
            unplaced.add(j.id)
            if j.phase is running:
                preempt.append(j.id)
            continue
        for p in where:
            left = free[p.node]  # (this round's own list: taken devices leave it in place)
            for d in p.devices:
                if d in left:
                    left.remove(d)
        starts.append(_start(j.id, t, where, j.phase is running))
    if rank is not None:
        starts.sort(key=lambda s: rank.get(s.job_id, 0))
    return starts, unplaced
