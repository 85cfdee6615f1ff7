"""Every preemption, for the simulator and the live controller alike: which running jobs may be stopped,
and for whom.

A round may stop a running job for one of two reasons, and for no other:

* **Time-sharing among equals.** A preemptive plan (LAS bands, Gavel's rounds) leaves a running job out, or
  moves it to another GPU type. The round may do that only to a job that can checkpoint
  (`JobView.checkpointable`), that has run at least `PreemptRule.min_run_s` since it (re)started, and only
  while the rule allows time-sharing (`protected` names the others: the round keeps them where they are).
  A job left out must hand its GPUs to a job of its own QoS class, one that starts or moves onto some of its
  devices; a job left out for nobody, or for a job of another class, keeps them (`displaced`: the round is
  applied again with it in place, and a job of another class that took its devices waits for the QoS rule).
* **QoS preemption.** A waiting job may stop running jobs of the classes its class may preempt
  (`PreemptRule.qos_preempts`: the settings' QoS table, by default prod preempts normal and scavenger, normal
  preempts scavenger), on one server: the fewest jobs, then the fewest GPUs, taking the least important first
  (lowest class, lowest priority, most recently started: the least work lost), and dropping any that turn
  out unneeded (`Victims`). Whether a victim can checkpoint is not asked: one that cannot loses its work.

Live jobs do not checkpoint: a job spec names a checkpoint *signal* (by default SIGTERM, the same signal a
cancel sends), but nothing in it says the job resumes from what it saved. So the live controller makes QoS
preemptions only, exactly the ones it made before this module existed; the simulator's trace jobs checkpoint,
as in Gavel, and are time-shared as well. Both call this module with the same rule (the simulator's default is
the controller's default QoS table), so every preemption the controller makes is one the simulator measures;
`hsched sim --no-time-sharing` (or trace jobs with `checkpointable=False`) replays with QoS preemption alone.

Pure: frozen data in, frozen data out. Whether a job fits a server is the caller's question (the simulator
counts devices, the live controller asks the topology engine), passed in as a function.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Protocol

from hsched.sched.view import JobPhase, JobView, Preempt, RoundDecision, qos_rank

Fits = Callable[[str, frozenset[str]], bool]
"""Whether the waiting job would fit on the named server if these devices (its victims') were free too."""


class QosClassLike(Protocol):
    """What the rule reads of a settings QoS class (hsched.config.QosClass)."""

    @property
    def preempts(self) -> Sequence[str]: ...


@dataclass(frozen=True, slots=True)
class PreemptRule:
    """Who may stop whom. The live controller builds it from its settings, the simulator from the same
    defaults (or `hsched sim --settings FILE`).

    qos_preempts: QoS class -> the classes a waiting job of that class may preempt.
    time_sharing: a preemptive plan may stop or move running jobs that can checkpoint; off, only QoS
        preemption stops anyone.
    min_run_s: a job that has run less than this since it (re)started is not time-shared away.
    """

    qos_preempts: Mapping[str, frozenset[str]] = field(default_factory=dict)
    time_sharing: bool = True
    min_run_s: float = 0.0

    @classmethod
    def from_qos(cls, table: Mapping[str, QosClassLike], *, time_sharing: bool = True,
                 min_run_s: float = 0.0) -> PreemptRule:
        """The rule of a settings QoS table (`Settings.qos`)."""
        return cls({name: frozenset(q.preempts) for name, q in table.items()}, time_sharing, min_run_s)

    def may_preempt(self, qos: str, victim_qos: str) -> bool:
        """A waiting job of class `qos` may stop a running job of class `victim_qos`."""
        return victim_qos in self.qos_preempts.get(qos, ())

    def may_time_share(self, job: JobView, now: float) -> bool:
        """The plan may stop or move this running job."""
        if not (self.time_sharing and job.checkpointable):
            return False
        start = job.run_start_s
        return self.min_run_s <= 0 or start is None or now - start >= self.min_run_s


_CHECKPOINTS = attrgetter("checkpointable")


def protected(rule: PreemptRule, jobs: Iterable[JobView], now: float) -> frozenset[int]:
    """The running jobs a preemptive plan must leave where they are."""
    running = JobPhase.RUNNING
    if rule.time_sharing and rule.min_run_s <= 0:
        # the simulator's common case, once per round over every active job: one attribute each (and when every job
        # checkpoints, as in Gavel's traces, one C call each)
        if isinstance(jobs, (list, tuple)) and all(map(_CHECKPOINTS, jobs)):
            return frozenset()
        return frozenset(j.id for j in jobs if not j.checkpointable and j.phase is running)
    return frozenset(j.id for j in jobs if j.phase is running and not rule.may_time_share(j, now))


def displaced(decision: RoundDecision, jobs: Mapping[int, JobView]) -> tuple[frozenset[int], frozenset[int]]:
    """Check the jobs a round stops against the time-sharing rule.

    Returns (stopped jobs that must keep their GPUs, jobs whose start or move took devices of a stopped job
    of another QoS class). Both are empty when every stop hands its devices to an equal.
    """
    if not decision.preempt:
        return frozenset(), frozenset()
    owner: dict[str, int] = {}
    for s in decision.starts:
        for p in s.placement:
            for d in p.devices:
                owner[d] = s.job_id
    keep: set[int] = set()
    refused: set[int] = set()
    for vid in decision.preempt:
        v = jobs[vid]
        takers = {owner[d] for p in v.placement for d in p.devices if d in owner}
        others = {t for t in takers if jobs[t].qos != v.qos}
        if not takers or others:
            keep.add(vid)
            refused.update(others)
    return frozenset(keep), frozenset(refused)


def least_important(v: JobView) -> tuple[int, int, float]:
    """Sort key, least important first: lowest class, lowest priority, most recently started."""
    return (-qos_rank(v.qos), v.priority, -(v.run_start_s or 0.0))


class Victims:
    """One round's QoS preemption: the running jobs it may stop, indexed by server, least important first.

    Built once per round from the running jobs that hold one server each (a gang spread over servers is
    never a victim: stopping it frees devices on several). `choose` is called for each waiting job in the
    order the round serves them; victims chosen for one job are not offered to the next.

    The search is linear in the running jobs per round, not per waiting job: a server's answer for a request
    shape (`choose`'s `shape`) is kept until the server changes (its victims taken, or `stamp(server)` moved: the
    caller's ledger of what the round placed there), so a storm of 2,000 waiting jobs asks each server again
    only after a preemption or start there; the classes still choosable are counted, not recomputed.
    """

    __slots__ = ("_answers", "_left", "_shapes", "_taken_on", "by_node", "rule", "shared", "taken")

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
        left: dict[str, int] = {}
        for lst in by_node.values():
            # (shared jobs first: inference on a slice is cheaper to stop than a training job's whole GPU)
            lst.sort(key=(lambda v: (v.id not in sharing, *least_important(v))) if sharing else least_important)
            for v in lst:
                left[v.qos] = left.get(v.qos, 0) + 1
        self.by_node = by_node
        self.taken: set[int] = set()
        self._left = left
        self._taken_on: dict[str, int] = {}
        self._answers: dict[tuple[str, int], tuple[object, int, list[JobView] | None]] = {}
        self._shapes: dict[Hashable, int] = {}
        """Shape -> a small number: a shape (a request's resources) hashed once a call, not once per server."""

    def classes(self) -> frozenset[str]:
        """The QoS classes of the jobs that may still be chosen."""
        return frozenset(q for q, n in self._left.items() if n > 0)

    def choose(self, job: JobView, nodes: Iterable[str], fits: Fits, *, shape: Hashable = None,
               stamp: Callable[[str], object] | None = None) -> Preempt | None:
        """The best server's victims for `job`, marked taken; None when no server would do.

        `nodes`: the servers `job` may run on, in the caller's order of preference (the first of equals wins).
        `fits(node, freed)`: whether `job` fits `node` once `freed` (devices of victims there) are free.
        `shape` and `stamp`: with both, a server's answer is kept for jobs of the same shape (what `fits` depends on
        besides the server: the request and what it may use) while `stamp(server)` (what the round placed there)
        and the server's victims stay the same.
        """
        allowed = self.rule.qos_preempts.get(job.qos)
        if not allowed:
            return None
        memo = stamp is not None and shape is not None
        sid = self._shapes.setdefault(shape, len(self._shapes)) if memo else 0
        best: tuple[tuple[int, int], str, list[JobView]] | None = None
        for node in nodes:
            lst = self.by_node.get(node)
            if not lst:
                continue
            if memo:
                assert stamp is not None
                now = (stamp(node), self._taken_on.get(node, 0))
                kept = self._answers.get((node, sid))
                if kept is not None and kept[0] == now[0] and kept[1] == now[1]:
                    chosen = kept[2]
                else:
                    chosen = self._search(lst, allowed, node, fits)
                    self._answers[(node, sid)] = (now[0], now[1], chosen)
            else:
                chosen = self._search(lst, allowed, node, fits)
            if chosen is None:
                continue
            key = (len(chosen), sum(len(v.placement[0].devices) for v in chosen))
            if best is None or key < best[0]:
                best = (key, node, chosen)
        if best is None:
            return None
        _, node, chosen = best
        for v in chosen:
            self.taken.add(v.id)
            self._left[v.qos] -= 1
        self._taken_on[node] = self._taken_on.get(node, 0) + 1
        names = ", ".join(f"{v.id} ({v.qos})" for v in chosen)
        return Preempt(job.id, tuple(v.id for v in chosen), node,
                       f"job {job.id} ({job.qos}) needs {node}: preempting {names}")

    def _search(self, lst: list[JobView], allowed: frozenset[str], node: str, fits: Fits) -> list[JobView] | None:
        cands = [v for v in lst if v.qos in allowed and v.id not in self.taken]
        return _fewest(cands, node, fits, self.shared) if cands else None


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
