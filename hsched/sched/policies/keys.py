"""The `hsched` policy's keys: a job's place in its user's own order, and the waiting jobs' keys kept from round to
round (a live round's 2,000 waiting jobs mostly keep their very views: their keys, sorted, are the last round's but
for the few that arrived or left; issue 33)."""

from __future__ import annotations

import bisect
import operator
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from hsched.model import DEFAULT_QOS
from hsched.sched.view import QOS_RANK, JobView, PolicyInput, qos_rank

Key = tuple[int, int, int, bool, float, float, int, JobView]
"""A job's place in its user's own order (`Hsched.order`): QoS rank, -priority an admin set, -priority, not fresh
from a (re)start, GPU-seconds of work (`work`), arrival, id; then the view itself. Ids are unique: two keys never tie
up to the view, which is there to be handed back."""
_SORTED = "hsched.order"
_BY_USER = "hsched.order.by_user"
"""The caller's cache keys (PolicyInput.cache) of `waiting_sorted`'s and `waiting_by_user`'s memos."""
INSERT_AT_MOST = 64
"""New waiting keys inserted into the last round's sorted ones up to this many; more, and all are sorted afresh."""


def work(j: JobView, forecast: Mapping[int, float]) -> float:
    """A job's GPU-seconds in the order: its GPUs times its remaining time where its progress says it (a total
    reported: `PolicyInput.forecast_s`), shortest first, as SRTF; else times the service it attained, least
    first, as LAS (a job nobody knows anything of has attained none: it goes first, and once it has run, its
    progress tells).

    Why remaining time where known: attained service only guesses that the job which ran longest has longest to
    go; on loaded clusters that guess cost the most. Measured with `hsched sim` (seed 0, avg JCT over the lower
    bound, attained service only -> with remaining time): ed69ec 8:8:8 2.464 -> 1.870 at no checkpoint cost and
    2.718 -> 1.92 at 600 s; 0e4a51 16:16:16 1.81 M -> 0.85 M s (seeds 1 and 2 alike); ed69ec 16:16:16 unchanged
    (1.161 -> 1.156). The clairvoyant srtf-oracle, which reads every job's true remaining time but ignores which
    GPU type is faster for whom, scores 1.969 on ed69ec 8:8:8."""
    left = forecast.get(j.id)
    return j.gpus * (j.service_s if left is None else left)


def waiting_key(j: JobView, admin: frozenset[int], forecast: Mapping[int, float]) -> Key:
    """A waiting job's key (never fresh from a start: it waits)."""
    return (QOS_RANK.get(j.qos, qos_rank(DEFAULT_QOS)), -j.priority if j.id in admin else 0, -j.priority, True,
            work(j, forecast), j.arrival_s, j.id, j)


class _Sorted(NamedTuple):
    """The last `waiting_sorted`'s waiting jobs: their views, the jobs whose priority an admin set, their keys by id
    and their keys sorted. Kept in the caller's `PolicyInput.cache` (a policy object is made afresh each live round),
    swapped whole: a key holds its view, which tells whether it is still the job's. At 2,000 waiting jobs, keys
    made afresh and sorted took 4.3 ms of a 21 ms live round (bench_live.py)."""

    waiting: list[JobView]
    admin: frozenset[int]
    keys: dict[int, Key]
    ordered: list[Key]


def waiting_sorted(inp: PolicyInput, waiting: list[JobView], admin: frozenset[int]) -> list[Key]:
    """The waiting jobs' keys, sorted (`admin`: the jobs whose priority an admin set): the last call's, as far as its
    views are these (kept in `inp.cache`; do not change the list handed back)."""
    memo = inp.cache.get(_SORTED)
    last_waiting, last_admin, last, last_sorted = memo if isinstance(memo, _Sorted) else _Sorted([], frozenset(), {},
                                                                                                  [])
    if admin == last_admin and len(waiting) == len(last_waiting) and all(map(operator.is_, waiting, last_waiting)):
        # the very same waiting views as last time, and the same admin priorities: the same keys, sorted
        # already (the live controller's usual round: 2,000 waiting jobs that did not change)
        return last_sorted
    # a waiting job's key is its view's alone (and whether an admin set its priority): the last round's, while it is
    # (the live controller and the simulator keep a waiting job's very view from round to round; its forecast, from
    # its last attempt's progress, changes only when it runs again, with a new view)
    forecast = inp.forecast_s
    kept: dict[int, Key] = {}
    made: list[Key] = []
    for j in waiting:
        jid = j.id  # (once: a view's field by name is a generic attribute lookup, policies.base.view_getter)
        hit = last.get(jid)
        adm = -j.priority if jid in admin else 0
        if hit is None or hit[7] is not j or hit[1] != adm:
            hit = waiting_key(j, admin, forecast)
            made.append(hit)
        kept[jid] = hit
    # (only this round's waiting jobs are kept: ended and started ones do not pile up)
    if len(made) <= INSERT_AT_MOST and last_sorted:
        # a few arrived or changed (a churning queue: two jobs end, two start, two arrive): the last round's sorted
        # keys still kept, each new one inserted in its place. The same list as sorting them all (ids make keys
        # unique), for a filter and a few bisections instead of a sort of 2,000 tuples
        get = kept.get
        ordered = [k for k in last_sorted if get(k[6]) is k]
        for k in made:
            bisect.insort(ordered, k)
    else:
        ordered = sorted(kept.values())
    inp.cache[_SORTED] = _Sorted(waiting, admin, kept, ordered)
    return ordered


class _ByUser(NamedTuple):
    """The last `waiting_by_user`'s: the jobs whose priority an admin set, the waiting views (by `id`), their keys
    (by the view's `id`: a key holds its view, so an id here is never another live view's) and the keys by class and
    user, sorted."""

    admin: frozenset[int]
    ids: frozenset[int]
    keys: dict[int, Key]
    by_user: dict[int, dict[str, list[Key]]]


def waiting_by_user(inp: PolicyInput, waiting: Sequence[JobView], admin: frozenset[int]
                    ) -> dict[int, dict[str, list[Key]]]:
    """The waiting jobs' keys by QoS rank and user, each user's sorted: what the order between users merges
    (`Hsched._between_users`). The last call's, with the views that left taken out and those that came put in their
    place, while few did (kept in `inp.cache`; do not change what is handed back). Made afresh, the split of 2,500
    keys by class and user was ~1 ms of every churning live round (issue 33); kept, it costs the changes."""
    ids = frozenset(map(id, waiting))
    memo = inp.cache.get(_BY_USER)
    if isinstance(memo, _ByUser) and memo.admin == admin:
        if ids == memo.ids:
            return memo.by_user
        gone, came = memo.ids - ids, ids - memo.ids
        if len(gone) + len(came) <= INSERT_AT_MOST:
            keys = dict(memo.keys)
            by_user = dict(memo.by_user)
            ranks: set[int] = set()
            copied: set[tuple[int, str]] = set()

            def mine(k: Key) -> list[Key]:
                # the user's list in the key's class, copied before its first change (the last call's is handed out)
                rank, user = k[0], k[7].user
                if rank not in ranks:
                    ranks.add(rank)
                    by_user[rank] = dict(by_user.get(rank, {}))
                users = by_user[rank]
                if (rank, user) not in copied:
                    copied.add((rank, user))
                    users[user] = list(users.get(user, ()))
                return users[user]

            for vid in gone:
                k = keys.pop(vid)
                ks = mine(k)
                del ks[bisect.bisect_left(ks, k)]
            forecast = inp.forecast_s
            for j in waiting:
                if id(j) in came:
                    k = keys[id(j)] = waiting_key(j, admin, forecast)
                    bisect.insort(mine(k), k)
            for rank, user in copied:  # (no user or class left empty)
                if not by_user[rank][user]:
                    del by_user[rank][user]
            for rank in ranks:
                if not by_user[rank]:
                    del by_user[rank]
            inp.cache[_BY_USER] = _ByUser(admin, ids, keys, by_user)
            return by_user
    forecast = inp.forecast_s
    keys = {id(j): waiting_key(j, admin, forecast) for j in waiting}
    made: dict[int, dict[str, list[Key]]] = {}
    for k in sorted(keys.values()):
        made.setdefault(k[0], {}).setdefault(k[7].user, []).append(k)
    inp.cache[_BY_USER] = _ByUser(admin, ids, keys, made)
    return made
