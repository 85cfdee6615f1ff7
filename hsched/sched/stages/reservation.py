"""The one reservation (EASY backfill, issue 14): the most important job that cannot start now (the head) gets the
devices where it can start soonest, by the running jobs' predicted ends; a job behind it uses them only if its time
limit ends it before the head starts (`RoundState.exempt`). Without it a gang of 8 waited for ever behind a stream of
one-GPU jobs. The simulator's rounds reserve by the same rule (hsched.sim.engine). Pure: no I/O."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence

from hsched.model import DEFAULT_QOS, Job, Node, Placement
from hsched.sched.cache import OrderKey, RoundCache
from hsched.sched.fleet import NONE, DeviceChooser, FleetView, minute
from hsched.sched.placement import fragmentation_key
from hsched.sched.soonest import soonest_fit
from hsched.sched.stages.groups import gang_on_group
from hsched.sched.stages.preemption import Preempting
from hsched.sched.state import RESOURCES
from hsched.sched.view import QOS_RANK, qos_rank


def order_key(job: Job, over: frozenset[str] = frozenset(), attained: float = 0.0) -> OrderKey:
    """Which waiting job is the most important (the one the round reserves GPUs for): `order`'s key, with the
    `hsched` policy's fair share (`over`: the users it serves after the others) after QoS and priority, then the
    GPU-seconds its earlier attempts attained (or, where its progress reported a total, have left), as that policy
    orders waiting jobs."""
    res = job.spec.resources
    return (QOS_RANK.get(job.spec.qos, _NORMAL), -job.spec.priority, job.user in over,
            max(1, res.gpus * res.nodes) * attained, job.submit_time, job.id)


_NORMAL = qos_rank(DEFAULT_QOS)



def order_keys(jobs: Sequence[Job], over: frozenset[str], cache: RoundCache, attained: Mapping[int, float] = NONE
               ) -> dict[int, OrderKey]:
    """`order_key` of the round's waiting jobs by id, kept from round to round while a job (the very object) and
    its user's fair share flag are the same: finding the head is a pass over 2,000 waiting jobs every round."""
    last_jobs, last_over, last_out = cache.keys_out
    if over == last_over and len(jobs) == len(last_jobs) and all(map(operator.is_, jobs, last_jobs)):
        return last_out  # the very same waiting jobs as last round (a busy queue's usual round)
    last = cache.keys
    kept: dict[int, tuple[Job, bool, OrderKey]] = {}
    out: dict[int, OrderKey] = {}
    for j in jobs:
        flag = j.user in over
        hit = last.get(j.id)
        if hit is None or hit[0] is not j or hit[1] is not flag:
            hit = (j, flag, order_key(j, over, attained.get(j.id, 0.0) if j.restarts else 0.0))
        kept[j.id] = hit
        out[j.id] = hit[2]
    cache.keys, cache.keys_out = kept, (tuple(jobs), over, out)
    return out


class Reserving(Preempting):
    """The round with the head's reservation (`reserve`); `reserving`: whether the first job that waits becomes the
    head (without a policy; with one, the pipeline picks it by `order_keys`)."""

    def __init__(self, fleet: FleetView, choose: DeviceChooser, now: float, cache: RoundCache | None = None) -> None:
        super().__init__(fleet, choose, now, cache)
        self.reserving = fleet.policy is None

    def reserve(self, job: Job) -> None:
        """Make `job` the head: reserve the devices where it can start soonest, by the running jobs' predicted ends
        (`FleetView.ends`; unknown: never), devices being released counting as free now and the round's starts
        ending at their time limits. Ties go to the node the fragmentation-aware best fit prefers. A job that no
        node could ever hold reserves nothing."""
        self.reserving = False
        self.head = job.id
        self.head_reason = RESOURCES
        # the last round's reservation, while what it was made of is the same (a busy queue's usual round: the
        # same head, running jobs, busy devices and predicted ends; searching the nodes again costs ~5 ms); the
        # nodes as they are, not their devices' readings, which every heartbeat renews (`nodes_fixed`)
        sig = (job, self.nodes_fixed(), tuple(n.links for n in self.fleet.nodes), self.fleet.running,
               frozenset(self.busy), frozenset(self.releasing), dict(self.started), dict(self.fleet.ends),
               self.fleet.labels, self.fleet.absent_users)
        last_sig, last = self.cache.reserved
        if last is not None and last_sig == sig and last[0] > self.now:
            self.shadow, self.reserved, self.head_reason = last
            self.version += 1
            return
        self.cache.reserved = (sig, None)
        res = job.spec.resources
        now, busy, g = self.now, self.busy, res.gpus
        inf = math.inf
        at = self.running_ends()
        free = self.free
        found: list[tuple[float, tuple[int, int, int], int, Placement]] = []
        one = res.nodes == 1
        candidates = self.nodes_for(job)
        waits_for = self.data_wait_node.get(job.id)
        if waits_for is not None:
            # a head waiting for a node holding its data is reserved for there, where it chose to start
            candidates = [n for n in candidates if n.name == waits_for]
        least = max(g, 1)  # (soonest_fit's: a job of no GPUs is tried on one release)

        def releases(devs: Sequence[str]) -> list[tuple[float, str]]:
            return sorted((at.get(u, inf) if u in busy else now, u) for u in devs)

        def fits_on(node: Node, when: list[tuple[float, str]]) -> Callable[[int], Placement | None]:
            return lambda n: self.fit(node, res, (), among=frozenset(u for _t, u in when[:n]))

        def frag_of(node: Node) -> tuple[int, int, int]:
            return fragmentation_key(self.link_of(node), len(node.devices), free[node.name], g)

        # each node that could hold it, with the soonest it could fit (the `least`-th soonest of its devices'
        # releases: it fits no sooner) and its place in the order
        soonest: list[tuple[float, int, Node, Sequence[str]]] = []
        for idx, node in enumerate(candidates):
            elig = self.eligible(node, res)
            if len(elig) < g or not elig:
                continue
            times = [at.get(u, inf) if u in busy else now for u in elig]
            soonest.append((min(times) if least == 1 else sorted(times)[least - 1], idx, node, elig))
        if one:
            # The least (time, best-fit key, order) of all nodes, searched from the nodes that could fit soonest: a
            # node whose soonest possible start is later than the best found cannot win, nor can any after it; the
            # nodes of one soonest time in best-fit order. Only those searched have their releases sorted and their
            # best-fit key made (for every node, ~1 ms of a churning round with every device busy and a new head).
            soonest.sort(key=lambda e: e[:2])
            best: tuple[float, tuple[int, int, int], int] = (inf, (inf, inf, inf), inf)  # type: ignore[assignment]
            k = 0
            while k < len(soonest) and soonest[k][0] <= best[0]:
                t0 = soonest[k][0]
                group = []
                while k < len(soonest) and soonest[k][0] == t0:
                    _t, idx, node, devs = soonest[k]
                    group.append((frag_of(node), idx, node, devs))
                    k += 1
                group.sort(key=lambda e: e[:2])
                for frag, idx, node, devs in group:
                    if (t0, frag, idx) >= best:
                        break

                    def worse(t: float, frag: tuple[int, int, int] = frag, idx: int = idx) -> bool:
                        return (t, frag, idx) >= best  # noqa: B023  (the best so far, as the search runs)

                    when = releases(devs)
                    hit = soonest_fit(when, fits_on(node, when), least=g, stop=worse)
                    if hit is not None:
                        found = [(hit[0], frag, idx, hit[1])]
                        best = (hit[0], frag, idx)
        else:
            for _t, idx, node, devs in soonest:
                when = releases(devs)
                hit = soonest_fit(when, fits_on(node, when), least=g)
                if hit is not None:
                    found.append((hit[0], frag_of(node), idx, hit[1]))
        found.sort(key=lambda f: f[:3])
        chosen = found[:res.nodes]
        placed = [f[3] for f in chosen] if len(found) >= res.nodes else []
        shadow = max((f[0] for f in chosen), default=inf) if placed else inf
        if res.nodes > 1:
            # a gang may also go whole to one Slurm node group (a share on each of N of its Slurm nodes): the
            # earliest time one takes it, if sooner (without this a gang only a group can hold was never reserved
            # for, and a stream of smaller jobs could keep it waiting for ever)
            for node in self.nodes_for(job):
                if node.executor != "slurm":
                    continue
                when_of = {u: at.get(u, inf) if u in busy else now for u in self.eligible(node, res)}
                for t in sorted(set(when_of.values())):
                    if t >= shadow or t == inf:
                        break
                    whole = gang_on_group(self, node, res, frozenset(u for u, w in when_of.items() if w > t))
                    if whole is not None:
                        shadow, placed = t, list(whole)
                        break
        if not placed:
            return
        self.shadow = shadow
        self.reserved = frozenset(u for p in placed for u in p.devices)
        self.version += 1
        if self.shadow < inf:
            # (with no known start it says Resources, as squeue does for the job a reservation is for)
            nodes = ", ".join(dict.fromkeys(p.node for p in placed))
            self.head_reason = f"{RESOURCES} (reserved on {nodes} from {minute(self.shadow)})"
        self.cache.reserved = (sig, (self.shadow, self.reserved, self.head_reason))

