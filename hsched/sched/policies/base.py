"""The policy contract and the helpers policies share (the registry of names is hsched.sched.registry).

A policy turns a `PolicyInput` into a `Plan` (wanted jobs in priority order, each with acceptable GPU types).
It never places devices and never sees durations: the round function (`hsched.sched.round`) does the
packing, gang by gang, all or nothing. A clairvoyant policy subclasses `OraclePolicy`, must be named
`*-oracle`, and receives an `OracleInput` instead.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from itertools import repeat
from operator import add, itemgetter, ne
from typing import TYPE_CHECKING, Any, ClassVar, cast

from hsched.sched.view import JobView, OracleInput, Plan, PolicyInput, Want

if TYPE_CHECKING:
    from hsched.sched.throughput import ThroughputModel


class PolicyHooks:
    """Optional hooks the round reads instead of testing a policy's class: a policy without fair share serves
    nobody after the others, and one without a move rule moves at any gain."""

    reads_forecast: ClassVar[bool] = True
    """Whether the policy reads `PolicyInput.forecast_s` (its hooks included). Only a hint of cost: a caller that works
    each running job's forecast out every round for a policy that reads them all (the simulator) hands one that never
    reads them a mapping that works out only what is asked instead. Either answers alike."""

    def over_share(self, inp: PolicyInput) -> frozenset[str]:
        """The users this policy serves after the others (fair share); the round reads it to name the most
        important waiting job it reserves GPUs for."""
        return frozenset()

    def move_gain(self, j: JobView, new_type: str, inp: PolicyInput) -> tuple[float, float]:
        """(seconds a move of running job `j` to `new_type` is expected to save, what its checkpoint and restore
        cost). Without a model of the gain: unbounded."""
        return math.inf, inp.checkpoint_costs.get(j.id, inp.checkpoint_cost_s)

    def waiting_order(self, inp: PolicyInput) -> Iterable[int] | None:
        """The waiting jobs' ids, most important first, as this policy serves them: what a round's reservation should
        take its head from (the first of them it does not start) and call backfill (a start after the head); read
        once, and maybe only as far as the head (an iterator may make it as it goes). None:
        the policy has no order of its own beyond its plan (the round keeps its QoS, priority, submit order)."""
        return None


class Policy(PolicyHooks):
    """A non-clairvoyant policy. Subclasses set `name` and implement `plan`."""

    name: ClassVar[str] = ""
    clairvoyant: ClassVar[bool] = False
    time_sharing: ClassVar[bool] = False
    """True when the policy wants a round every quantum (priorities change as jobs run), not only on events."""

    def plan(self, inp: PolicyInput) -> Plan:
        raise NotImplementedError


class OraclePolicy(PolicyHooks):
    """A clairvoyant policy, for reference only: it reads remaining times, which no real scheduler has."""

    name: ClassVar[str] = ""
    clairvoyant: ClassVar[bool] = True
    time_sharing: ClassVar[bool] = False

    def plan(self, inp: OracleInput) -> Plan:
        raise NotImplementedError


AnyPolicy = Policy | OraclePolicy

# ---------------------------------------------------------------- helpers shared by several policies


def fastest_types(job: JobView, inp: PolicyInput) -> tuple[str, ...]:
    """The job's allowed, runnable GPU types, fastest for this job first."""
    return inp.throughput.fastest_types(job.job_type, job.gpus, inp.gpu_types, job.gpu_types)


def select_by_capacity(ordered: Iterable[JobView], capacity: Mapping[str, int], inp: PolicyInput) -> list[JobView]:
    """Jobs in priority order that fit the fleet's total GPU count, gangs whole; later small jobs fill gaps.

    Counting GPUs over all types is what lets a heterogeneity-aware assignment decide the types afterwards.
    In a start-only round (`inp.starts_only`) the first job that does not fit ends the selection: no job
    jumps a more important one between full rounds.
    """
    free = sum(capacity.values())
    biggest = max(capacity.values(), default=0)
    strict = inp.starts_only
    if isinstance(ordered, list) and ordered:
        # Every job fits, with a GPU to spare (so the loop below would neither stop nor skip anyone): the usual
        # full round of a replay with free GPUs, counted at C speed
        sizes = list(map(_GPUS, ordered))
        largest = max(sizes)
        if sum(sizes) < free and largest <= biggest:
            return list(ordered)
        if largest == 1 and biggest >= 1:
            # one GPU each (Gavel's single-GPU traces): the loop below takes the first `free` jobs, skipping none
            return ordered[:max(0, free)]
    out: list[JobView] = []
    for j in ordered:
        if free <= 0:
            break
        # a gang must fit one GPU type (it runs on one type, as in Gavel's model)
        if j.gpus <= free and j.gpus <= biggest:
            out.append(j)
            free -= j.gpus
        elif strict:
            break
    return out


def view_getter(*fields: str) -> Callable[[JobView], Any]:
    """`attrgetter(*fields)` for a `JobView`, by position (`itemgetter`): a NamedTuple's field read by name goes through
    its descriptor, a generic attribute lookup (the type's dictionary, then the descriptor's call), where an index is
    one C call. The rounds' maps over every job read them by the million: generic lookups were ~10 % of the
    instructions of an ed69ec 8:8:8 replay (callgrind); by position, with the round's own loops (`round._JID`...), the
    replay ran 3.7 % fewer (an index into a tuple subclass is still converted on every call)."""
    return itemgetter(*map(JobView._fields.index, fields))


def view_at(**at: int) -> None:
    """Check fixed positions of JobView's fields (name=position), as a module that indexes views by literals (where
    the types must check field by field) declares them: a field moved in the view fails the import, not a round."""
    wrong = {name: i for name, i in at.items() if JobView._fields.index(name) != i}
    if wrong:
        raise RuntimeError(f"JobView's fields moved: {wrong} (now {JobView._fields})")


_QUAD = view_getter("job_type", "gpus", "gpu_types", "gpu_type")
_ASKED = view_getter("id", "job_type", "gpus", "gpu_types", "gpu_type")
_PROFILES, _LAST_ASSIGN = "base.hetero_assign.profiles", "base.hetero_assign.last"
"""The caller's cache keys (PolicyInput.cache) of `hetero_assign`'s `_ProfileMemo` and its last answer."""


def memo_for(cache: MutableMapping[str, object], key: str, model: object, types: tuple[str, ...],
             make: Callable[[object, tuple[str, ...]], object]) -> object:
    """The memo `make(model, types)` kept in the caller's `cache[key]`: one per list of GPU types, all dropped when the
    model changes. (One memo for the last types alone was made again and again in the simulator's start-only rounds,
    whose free GPUs come in a few lists of types that take turns: 725 times in 652 such rounds of ed69ec 16:16:16.)"""
    kept = cache.get(key)
    if not isinstance(kept, tuple) or kept[0] is not model:
        kept = cache[key] = (model, {})
    by_types = cast("dict[tuple[str, ...], object]", kept[1])
    memo = by_types.get(types)
    if memo is None:
        memo = by_types[types] = make(model, types)
    return memo


class _ProfileMemo:
    """What `hetero_assign` keeps from round to round for one model and one list of GPU types: each job profile's
    speed-profile id, the speeds of each id, and each level's keep-fraction per id. All of it depends only on the
    model's (memoised, fixed) answers and the types, which the memo is checked against before use."""

    __slots__ = ("code_gpus", "code_on", "code_sid", "codes", "gangs", "ids", "levels", "model", "of", "speeds",
                 "types")

    def __init__(self, model: object, types: tuple[str, ...]) -> None:
        self.model = model
        self.types = types
        self.of: dict[tuple[str, int, tuple[str, ...]], int] = {}  # (kind, size, allowed types) -> speeds id
        self.speeds: list[tuple[float, ...]] = []  # relative speed on each of the types, by id
        self.ids: dict[tuple[float, ...], int] = {}
        self.levels: dict[tuple[str, ...], _Level] = {}  # a level's types (slow, *faster) -> its fractions
        # (kind, size, allowed types, type now) -> a job code; per code its speeds id, type now and size
        self.codes: dict[tuple[str, int, tuple[str, ...], str | None], int] = {}
        self.code_sid: list[int] = []
        self.code_on: list[str | None] = []
        self.code_gpus: list[int] = []
        self.gangs: set[int] = set()  # the codes of sizes other than one GPU


def _speeds_id(memo: _ProfileMemo, model: ThroughputModel, all_types: tuple[str, ...],
               prof: tuple[str, int, tuple[str, ...]]) -> int:
    """A job profile's speeds id in `memo`: its relative speed on each type, numbered as first seen."""
    sid = memo.of.get(prof)
    if sid is None:
        job_type, gpus, allowed = prof
        full = model.rel_speeds(job_type, gpus, all_types)
        # a type the job may not use counts as one it cannot run on
        sp = tuple(full.get(t, 0.0) if not allowed or t in allowed else 0.0 for t in all_types)
        sid = memo.of[prof] = memo.ids.setdefault(sp, len(memo.ids))
        if sid == len(memo.speeds):
            memo.speeds.append(sp)
    return sid


class _Level:
    """One level of `hetero_assign` (its slow type's column and the faster types'): minus each speeds id's
    keep-fraction, and the walk's order of them: twice the rank of the value among the distinct ones (ascending: the
    highest fraction first), and the first rank that cannot run there (`runs`, as 2 x rank) and the first that keeps
    no more than its speed (`gains`)."""

    __slots__ = ("f_cols", "gains", "keys", "neg", "rank2", "runs", "s_col")

    def __init__(self, s_col: int, f_cols: tuple[int, ...]) -> None:
        self.s_col, self.f_cols = s_col, f_cols
        self.neg: list[float] = []
        self.rank2: list[int] = []
        self.keys: list[int] = []  # per job code (`_ProfileMemo`): its walk key, rank2 plus one when not on this type
        self.runs = self.gains = 0

    def fill(self, code_sid: Sequence[int], code_on: Sequence[str | None], slow: str) -> None:
        """The walk keys of every code (after `grow`: every rank may have moved)."""
        rank2 = self.rank2
        self.keys = [rank2[sid] + (on != slow) for sid, on in zip(code_sid, code_on, strict=True)]

    def grow(self, speeds: Sequence[tuple[float, ...]]) -> None:
        """Fractions for the speeds ids seen since, and the ranks again."""
        s_col, f_cols, neg = self.s_col, self.f_cols, self.neg
        while len(neg) < len(speeds):
            sp = speeds[len(neg)]
            here_speed = sp[s_col]
            if here_speed <= 0:
                neg.append(1.0)
            else:
                best = max((sp[c] for c in f_cols), default=0.0)
                neg.append(-(here_speed / best) if best > 0 else -2.0)
        values = sorted(set(neg))
        rank = {v: 2 * i for i, v in enumerate(values)}
        self.rank2 = [rank[v] for v in neg]
        self.keys = []
        self.runs = 2 * sum(1 for v in values if v <= 0)  # keys below this: the job can run here
        self.gains = 2 * sum(1 for v in values if v < -1.0)  # keys below this: it keeps more than its speed


_ID = view_getter("id")
_GPUS = view_getter("gpus")


def hetero_assign(
    selected: Sequence[JobView],
    capacity: Mapping[str, int],
    inp: PolicyInput,
    pinned: Mapping[int, str] | None = None,
) -> dict[int, str]:
    """Give each selected job a GPU type so that total normalised throughput is high.

    Types are filled slowest first: the slowest type takes the jobs that keep the largest fraction of their
    best remaining speed there, and only as many GPUs as the faster types cannot hold. Repeating this up the
    list leaves the fastest GPUs to the jobs that gain most from them (Gavel's insight, greedily: no LP).
    Ties go to jobs already on that type, so equal jobs do not swap places each round, then to the
    least-served job, so long-running jobs hold the faster GPUs. `pinned` jobs keep
    their type and use its capacity first.
    """
    model, all_types = inp.throughput, inp.gpu_types
    ids: list[int] | None = None
    if not pinned:
        # The same jobs in the same order, with the same kinds, sizes, allowed types and types now, on the same
        # capacity: the same answer as the last round's (61 % of ed69ec 8:8:8's rounds: a round for an arrival
        # that selects nobody new), kept in the caller's cache.
        # (the last round's views are kept and compared only when the same jobs are selected in the same order, one
        # C-speed comparison of their ids: most rounds differ, and then the views are not read)
        ids = list(map(_ID, selected))
        last = cast("tuple[object, tuple[str, ...], Mapping[str, int], list[int], tuple[JobView, ...], "
                    "dict[int, str]] | None", inp.cache.get(_LAST_ASSIGN))
        if (last is not None and last[0] is model and last[3] == ids and last[1] == all_types
                and last[2] == capacity and list(map(_ASKED, last[4])) == list(map(_ASKED, selected))):
            return dict(last[5])
    caps = dict(capacity)
    out: dict[int, str] = {}
    if pinned:
        gpus_of: dict[int, int] = {}
        for j in selected:
            gpus_of.setdefault(j.id, j.gpus)
        for jid, t in pinned.items():
            out[jid] = t
            caps[t] = caps.get(t, 0) - gpus_of.get(jid, 0)
    todo = [j for j in selected if j.id not in out] if out else list(selected)
    # (the memo: kept in the caller's cache from round to round; the same model and types, the same speeds)
    memo = cast("_ProfileMemo", memo_for(inp.cache, _PROFILES, model, all_types, _ProfileMemo))
    # A job is a small integer, its code: what its (kind, size, allowed types, type now) maps to is kept in the memo,
    # with the code's speeds id, type now and size, so a round reads each job once (and builds nothing); a level's walk
    # key of a code (`_Level.keys`) is kept there too.
    code_sid, code_on, code_gpus = memo.code_sid, memo.code_on, memo.code_gpus
    quads = list(map(_QUAD, todo))
    codes = list(map(memo.codes.get, quads))  # None: not seen yet
    if None in codes:
        for i, quad in enumerate(quads):
            if codes[i] is None:
                code = memo.codes.get(quad)
                if code is None:
                    code = memo.codes[quad] = len(code_sid)
                    code_sid.append(_speeds_id(memo, model, all_types, quad[:3]))
                    code_on.append(quad[3])
                    code_gpus.append(quad[1])
                    if quad[1] != 1:
                        memo.gangs.add(code)
                codes[i] = code
    code_of = cast("list[int]", codes)
    present = set(code_of)
    speeds = memo.speeds
    # Each level (a type, slowest first) walks the jobs not yet placed by the fraction of their best speed they keep
    # there (highest first), the job already on that type first among equals, then priority order (its position),
    # and stops as soon as the type is full or no longer needed: one sort of small tuples per level (C speed).
    # A fraction depends only on the job's speeds id and the level: kept in the memo from round to round.
    n = len(todo)
    # (one GPU each, Gavel's single-GPU traces: a level's walk is counted. The codes of gangs are kept as a set: one
    # C-speed test, not the largest size of every code present)
    ones = bool(present) and memo.gangs.isdisjoint(present)
    if ones:
        left, least, placed, sid_of, on_at, gpus_at = n, 1, [], [], [], []
        # (the fractions are read only for their highest and lowest, over the few speeds ids there are)
        sids: set[int] | None = set(map(code_sid.__getitem__, present))
    else:
        sid_of = list(map(code_sid.__getitem__, code_of))
        on_at = list(map(code_on.__getitem__, code_of))
        gpus_at = list(map(_GPUS, todo))
        left = sum(gpus_at)  # GPUs of the jobs not yet given a type
        least = min(gpus_at, default=0)  # the smallest request: a type with less room takes nobody more
        placed = [False] * n
        sids = None
    unplaced = list(range(n))
    if ids is None:  # (else not pinned: `todo` is `selected`, whose ids were read above)
        ids = list(map(_ID, todo))
    types = [t for t in all_types if caps.get(t, 0) > 0]
    while left > 0 and types:
        slow, faster = types[-1], types[:-1]
        room_above = 0
        for t in faster:
            if caps[t] > 0:
                room_above += caps[t]
        need = left - room_above
        # keep_frac: the fraction of its best speed on a faster type that the job keeps on the slow type;
        # -1 where it cannot run on the slow type, 2.0 where it runs nowhere faster (it must go here). Kept negated
        # (the sort below puts the highest fraction first), by the level's types
        level = memo.levels.get((slow, *faster))
        if level is None:
            col = {t: c for c, t in enumerate(all_types)}
            level = memo.levels[(slow, *faster)] = _Level(col[slow], tuple(col[t] for t in faster))
        if len(level.neg) < len(speeds):
            level.grow(speeds)
        if ones and len(level.keys) < len(code_sid):
            level.fill(code_sid, code_on, slow)
        neg = level.neg
        # the fractions of the jobs (one GPU each: of their speeds ids), read only by the two tests below, which most
        # levels do not reach (a list of them was made at every level)
        fracs = neg.__getitem__
        read = sid_of if sids is None else sids
        cap = caps[slow]
        if not faster and left <= cap and max(map(fracs, read)) <= 0:
            # the fastest type, with room for everyone left: all of them go here, in no particular order
            if len(unplaced) < n:
                for k in unplaced:  # (a loop: dict.update of a zip goes through a pair at a time, twice as long)
                    out[ids[k]] = slow
            else:  # (the usual case with free GPUs: nobody went to a slower type)
                out.update(dict.fromkeys(ids, slow))
            caps[slow] = cap - left
            break
        # among equals (one fraction), the job already there stays, then the first in priority order (the
        # least served) takes the slow type: the most-served jobs are the likeliest to keep running (heavy
        # tails), so they gain most from the fast GPUs, and the longest job is what sets the makespan
        lazy = bool(faster)  # (a faster type is left: a job that keeps no more than its speed waits for it)
        if lazy and need <= 0 and min(map(fracs, read)) >= -1.0:
            types.pop()  # (not needed, and nobody is faster here: the walk below would stop at its first job)
            continue
        # the walk's order as one small integer a job: twice its fraction's rank (highest fraction first), plus one
        # when it is not on this type; a stable sort of the positions keeps priority order among equals
        keys = (list(map(level.keys.__getitem__, code_of)) if ones
                else list(map(add, map(level.rank2.__getitem__, sid_of), map(ne, on_at, repeat(slow)))))
        at = keys.__getitem__
        walk = sorted(unplaced, key=at)
        if ones:
            # every job takes one GPU, so the walk takes its first m jobs: it stops at the first that cannot run here
            # (r: those that can are a prefix), when the type is full (cap), or, with a faster type left, once the
            # type is not needed and the job keeps no more than its speed (h: those that keep more are a prefix)
            r = bisect.bisect_left(walk, level.runs, key=at)
            h = bisect.bisect_left(walk, level.gains, key=at)
            m = max(0, min(r, cap, max(need, h) if lazy else r))
            if m:
                for k in walk[:m]:
                    out[ids[k]] = slow
                cap, need, left = cap - m, need - m, left - m
                # the rest in position order, as `unplaced` is (the next level's stable sort keeps it among equals)
                unplaced = sorted(walk[m:])
            caps[slow] = cap
            types.pop()
            continue
        for k in walk:
            negfrac = neg[sid_of[k]]
            if negfrac > 0 or cap < least or (need <= 0 and lazy and negfrac >= -1.0):
                break
            g = gpus_at[k]
            if g <= cap:
                out[ids[k]] = slow
                cap -= g
                need -= g
                left -= g
                placed[k] = True
        unplaced = [k for k in unplaced if not placed[k]]
        caps[slow] = cap
        types.pop()
    if not pinned:
        inp.cache[_LAST_ASSIGN] = (model, all_types, dict(capacity), ids, tuple(selected), dict(out))
    return out


def wants_from_assignment(
    ordered: Iterable[JobView], assigned: Mapping[int, str], inp: PolicyInput
) -> tuple[Want, ...]:
    """Wants in priority order: assigned type first, then the job's other types as a fallback."""
    model, all_types = inp.throughput, inp.gpu_types
    jobs = ordered
    # the same jobs (kinds, sizes, allowed types) in the same order with the same assignment as last round: the
    # same wants (the usual round after an arrival that changes nobody's type), kept in the caller's cache with
    # the preferences per (kind, size, allowed types, assigned type), which depend only on the model and types
    memo = cast("_WantsMemo", memo_for(inp.cache, _WANTS, model, all_types, _WantsMemo))
    ids = list(map(_ID, jobs))  # (C speed: the loop below reads these, not the views)
    kinds = list(map(_WANT_KIND, jobs))
    if memo.asked == ids and memo.kinds == kinds and memo.assigned == assigned:
        return memo.wants
    out: list[Want] = []
    prefs = memo.prefs
    new, append = tuple.__new__, out.append  # Want is a NamedTuple: no __new__ wrapper
    # a job's want is the one made before while its kind and type are (most of them, round to round): kept per job.
    # (A want depends on the job's id, kind and type alone, so an older one is as good: the jobs of this call alone
    # are kept only once the others outnumber them, not rewritten every call)
    want_of = memo.want_of
    for jid, kind, t in zip(ids, kinds, map(assigned.get, ids), strict=True):
        if t is None:
            continue
        hit = want_of.get(jid)
        if hit is not None and hit[1] == t and hit[0] == kind:
            append(hit[2])
            continue
        types = prefs.get((kind, t))
        if types is None:
            job_type, gpus, allowed = kind
            ft = model.fastest_types(job_type, gpus, all_types, allowed)
            types = prefs[(kind, t)] = (t, *(x for x in ft if x != t))
        w = new(Want, (jid, types))
        want_of[jid] = (kind, t, w)
        append(w)
    if len(want_of) > 2 * len(out) + 64:
        memo.want_of = {w[0]: want_of[w[0]] for w in out}
    memo.asked, memo.kinds, memo.assigned, memo.wants = ids, kinds, dict(assigned), tuple(out)
    return memo.wants


_WANT_KIND = view_getter("job_type", "gpus", "gpu_types")
_WANTS = "base.wants_from_assignment"
"""The caller's cache key (PolicyInput.cache) of `wants_from_assignment`'s `_WantsMemo`."""


class _WantsMemo:
    """What `wants_from_assignment` keeps from round to round for one model and one list of GPU types."""

    __slots__ = ("asked", "assigned", "kinds", "model", "prefs", "types", "want_of", "wants")

    def __init__(self, model: object, types: tuple[str, ...]) -> None:
        self.model = model
        self.types = types
        # ((kind, size, allowed types), assigned type) -> the preferences
        self.prefs: dict[tuple[tuple[str, int, tuple[str, ...]], str], tuple[str, ...]] = {}
        self.asked: list[int] = []  # the last call's job ids, and their (kind, size, allowed types)
        self.kinds: list[tuple[str, int, tuple[str, ...]]] = []
        self.assigned: dict[int, str] = {}
        self.wants: tuple[Want, ...] = ()
        # job id -> its (kind, size, allowed types), its assigned type and its want, as a call made them last (the
        # last call's jobs at least)
        self.want_of: dict[int, tuple[tuple[str, int, tuple[str, ...]], str, Want]] = {}
