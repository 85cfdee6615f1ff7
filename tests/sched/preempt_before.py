"""The QoS preemption search as it was before issue 33 (hsched.sched.preempt.Victims at that time), kept for the
in-run baseline of tests/bench/bench_live.py's storm and churn cases and for tests/sched/test_storm_decisions.py,
which checks that today's search decides exactly as this one did. Not used by hsched."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hsched.sched.preempt import Fits, PreemptRule
from hsched.sched.view import JobView, Preempt, qos_rank


def room_by_placement(self: object, node: object, res: object, busy: object, freed: object) -> bool:
    """`Preempting.room` as it was: the topology engine asked for every candidate set (`fit`)."""
    return self.fit(node, res, busy, freed=freed) is not None  # type: ignore[attr-defined, no-any-return]


def least_important(v: JobView) -> tuple[int, int, float]:
    """Sort key, least important first: lowest class, lowest priority, most recently started."""
    return (-qos_rank(v.qos), v.priority, -(v.run_start_s or 0.0))


class Victims:
    """One round's QoS preemption: the running jobs it may stop, indexed by server, least important first.

    Built once per round from the running jobs that hold one server each (a gang spread over servers is
    never a victim: stopping it frees devices on several). `choose` is called for each waiting job in the
    order the round serves them; victims chosen for one job are not offered to the next.
    """

    __slots__ = ("by_node", "rule", "shared", "taken")

    def __init__(self, rule: PreemptRule, running: Iterable[JobView],
                 shared: Mapping[str, frozenset[int]] | None = None) -> None:
        """`shared`: device -> the jobs sharing it (the live controller's `--shared` jobs): they are stopped first,
        and their device counts as freed only once every job on it is among the victims."""
        self.rule = rule
        self.shared = shared or {}
        targets = frozenset().union(*rule.qos_preempts.values()) if rule.qos_preempts else frozenset()
        by_node: dict[str, list[JobView]] = {}
        for j in running:
            if j.qos in targets and len(j.placement) == 1:
                by_node.setdefault(j.placement[0].node, []).append(j)
        sharing = frozenset().union(*self.shared.values()) if self.shared else frozenset()
        for lst in by_node.values():
            # (shared jobs first: inference on a slice is cheaper to stop than a training job's whole GPU)
            lst.sort(key=(lambda v: (v.id not in sharing, *least_important(v))) if sharing else least_important)
        self.by_node = by_node
        self.taken: set[int] = set()

    def classes(self) -> frozenset[str]:
        """The QoS classes of the jobs that may still be chosen."""
        return frozenset(v.qos for lst in self.by_node.values() for v in lst if v.id not in self.taken)

    def choose(self, job: JobView, nodes: Iterable[str], fits: Fits, **_: object) -> Preempt | None:
        """The best server's victims for `job`, marked taken; None when no server would do (today's keywords, which
        keep answers between jobs, ignored: this is the search without them).

        `nodes`: the servers `job` may run on, in the caller's order of preference (the first of equals wins).
        `fits(node, freed)`: whether `job` fits `node` once `freed` (devices of victims there) are free.
        """
        allowed = self.rule.qos_preempts.get(job.qos)
        if not allowed:
            return None
        best: tuple[tuple[int, int], str, list[JobView]] | None = None
        for node in nodes:
            lst = self.by_node.get(node)
            if not lst:
                continue
            cands = [v for v in lst if v.qos in allowed and v.id not in self.taken]
            chosen = _fewest(cands, node, fits, self.shared) if cands else None
            if chosen is None:
                continue
            key = (len(chosen), sum(len(v.placement[0].devices) for v in chosen))
            if best is None or key < best[0]:
                best = (key, node, chosen)
        if best is None:
            return None
        _, node, chosen = best
        self.taken.update(v.id for v in chosen)
        names = ", ".join(f"{v.id} ({v.qos})" for v in chosen)
        return Preempt(job.id, tuple(v.id for v in chosen), node,
                       f"job {job.id} ({job.qos}) needs {node}: preempting {names}")


def _devices(jobs: Iterable[JobView], shared: Mapping[str, frozenset[int]] | None = None) -> frozenset[str]:
    """The devices stopping `jobs` frees: a shared device only when every job on it is among them."""
    jobs = list(jobs)
    devices = frozenset(d for v in jobs for d in v.placement[0].devices)
    if not shared:
        return devices
    ids = {v.id for v in jobs}
    return frozenset(d for d in devices if d not in shared or shared[d] <= ids)


def _fewest(cands: list[JobView], node: str, fits: Fits,
            shared: Mapping[str, frozenset[int]] | None = None) -> list[JobView] | None:
    """Victims on one server, least important first until the job fits; then drop any it does not need."""
    chosen: list[JobView] = []
    for v in cands:
        chosen.append(v)
        if fits(node, _devices(chosen, shared)):
            break
    else:
        return None
    # the search added them greedily: one taken early may be unnecessary once a bigger one joined
    for v in list(chosen):
        rest = [x for x in chosen if x is not v]
        if rest and fits(node, _devices(rest, shared)):
            chosen = rest
    return chosen
