"""Fair share between people: decayed GPU usage and shares, as pure functions (Slurm's multifactor fair share,
classic form).

Usage is GPU-seconds: a run's GPUs times the time it held them. Old usage counts less: usage `t` seconds ago
weighs 2^(-t / half_life) (Slurm's PriorityDecayHalfLife, by default 7 days), so a week-old GPU-hour counts
half, and a lab member who used a lot last month is not punished today. The decay is exact, not stepped: a run
held `g` GPUs from `s` to `e` contributes, at time `T`,

    g * integral from s to e of 2^(-(T - t)/h) dt  =  g * h/ln2 * (2^(-(T - e)/h) - 2^(-(T - s)/h))

and any total decays as a whole (`x` at T1 is `x * 2^(-(T2 - T1)/h)` at T2), so ended runs are folded into
running totals once (`Ledger`) and never read again.

Shares: every account gets its `shares` (1 unless settings say more), split evenly among its users; a user in
no account is an account of one. A user's normalised share is the fraction of the lab that is theirs; their
effective usage the fraction of all decayed usage that is theirs; their fair-share factor
2^(-effective usage / normalised share): 1.0 for someone who used nothing, 0.5 for someone who used exactly
their share, towards 0 above it (Slurm's classic formula).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hsched.sched.priority import (  # noqa: F401  (re-exported: fair share's views read them)
    PriorityTerms,
    PriorityWeights,
    UserShare,
    _user_share,
    age_factor,
    charged_factor,
    size_factor,
)

DEFAULT_HALF_LIFE_S = 7 * 86400.0
"""Slurm's default PriorityDecayHalfLife."""


def decay_factor(dt: float, half_life_s: float) -> float:
    """How much usage `dt` seconds old still counts; a half-life of 0 means no decay."""
    if half_life_s <= 0 or dt <= 0:
        return 1.0
    return 2.0 ** (-dt / half_life_s)


def decayed_gpu_seconds(gpus: float, start: float, end: float, now: float, half_life_s: float) -> float:
    """GPU-seconds of `gpus` GPUs held from `start` to `end`, weighed by age at `now` (times after `now` do not
    count: a node's clock ahead of ours)."""
    end = min(end, now)
    if end <= start or gpus <= 0:
        return 0.0
    if half_life_s <= 0:
        return gpus * (end - start)
    k = math.log(2.0) / half_life_s
    return gpus * (math.exp(-k * (now - end)) - math.exp(-k * (now - start))) / k


@dataclass(frozen=True, slots=True)
class RunUsage:
    """One run as fair share reads it from the store."""

    id: int
    user: str
    gpus: float
    """GPUs the run held (a rank sharing its node's devices with other ranks of its job holds its part)."""
    start: float | None
    end: float | None
    """None while it runs: it counts up to now."""


@dataclass(frozen=True, slots=True)
class Usage:
    """A user's GPU-seconds: all of them, and weighed by age."""

    raw_s: float = 0.0
    decayed_s: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.raw_s + other.raw_s, self.decayed_s + other.decayed_s)


def run_usage(r: RunUsage, now: float, half_life_s: float) -> Usage:
    if r.start is None:
        return Usage()
    end = now if r.end is None else min(r.end, now)
    return Usage(max(0.0, end - r.start) * r.gpus, decayed_gpu_seconds(r.gpus, r.start, end, now, half_life_s))


@dataclass(frozen=True, slots=True)
class Ledger:
    """Usage so far, folded: the totals of every ended run up to `upto` (by run id), decayed as of `as_of`.

    `advance` is handed the runs it has not folded (ids above `upto`, and those in `open`: seen running) and
    returns the next ledger and every user's usage now. Run ids grow with time, so the rows to read each round
    are the new runs and the running ones, never the whole history.
    """

    half_life_s: float = DEFAULT_HALF_LIFE_S
    as_of: float = 0.0
    upto: int = 0
    """The highest run id seen."""
    open: frozenset[int] = frozenset()
    """Runs seen without an end: read again until they end."""
    folded: Mapping[str, Usage] = field(default_factory=dict)
    """Ended runs' usage per user; `decayed_s` as of `as_of`."""
    runs_n: float = 0.0
    """Ended runs (with GPUs), each weighed by its end's age as usage is, as of `as_of`."""
    runs_s: float = 0.0
    """Their lengths in seconds, weighed alike: `typical_run_s` is the ratio."""

    @property
    def typical_run_s(self) -> float:
        """How long the lab's runs hold their GPUs: the mean length of the ended runs, recent ones weighing more (by
        the same half-life as usage); 0 before any ended. Folded sums, so it does not depend on the order runs were
        read in (a restarted controller finds the same)."""
        return self.runs_s / self.runs_n if self.runs_n > 0 else 0.0

    def advance(self, rows: Iterable[RunUsage], now: float) -> tuple[Ledger, dict[str, Usage]]:
        now = max(now, self.as_of)  # a clock stepped back does not make old usage grow
        f = decay_factor(now - self.as_of, self.half_life_s)
        h = self.half_life_s
        # plain floats per user while summing: the first call after a start folds the whole history
        raw = {u: v.raw_s for u, v in self.folded.items()}
        dec = {u: v.decayed_s * f for u, v in self.folded.items()}
        live_raw: dict[str, float] = {}
        live_dec: dict[str, float] = {}
        still: set[int] = set()
        upto = self.upto
        runs_n, runs_s = self.runs_n * f, self.runs_s * f
        for r in rows:
            upto = max(upto, r.id)
            start = r.start
            if r.end is None:
                still.add(r.id)
                to_raw, to_dec = live_raw, live_dec
            else:
                to_raw, to_dec = raw, dec
            if start is None:
                continue
            end = now if r.end is None else min(r.end, now)
            if r.end is not None and r.gpus > 0:
                weight = decay_factor(now - end, h)
                runs_n += weight
                runs_s += weight * max(0.0, end - start)
            to_raw[r.user] = to_raw.get(r.user, 0.0) + max(0.0, end - start) * r.gpus
            to_dec[r.user] = to_dec.get(r.user, 0.0) + decayed_gpu_seconds(r.gpus, start, end, now, h)
        folded = {u: Usage(raw.get(u, 0.0), dec.get(u, 0.0)) for u in raw.keys() | dec.keys()}
        total = dict(folded)
        for u in live_raw.keys() | live_dec.keys():
            total[u] = total.get(u, Usage()) + Usage(live_raw.get(u, 0.0), live_dec.get(u, 0.0))
        return Ledger(h, now, upto, frozenset(still), folded, runs_n, runs_s), total


# ------------------------------------------------------------------------------------------------ shares


@dataclass(frozen=True, slots=True)
class Account:
    """Settings' `[accounts]`: a group of users sharing `shares` of the lab (Slurm's account association)."""

    name: str
    users: tuple[str, ...]
    shares: int = 1


@dataclass(frozen=True, slots=True)
class ShareRow:
    """One user's line of `hsched share` (sshare's columns)."""

    user: str
    account: str
    shares: int
    """The account's raw shares."""
    norm_shares: float
    """The fraction of the lab that is this user's."""
    raw_usage_s: float
    decayed_usage_s: float
    effective_usage: float
    """This user's fraction of all decayed usage."""
    fairshare: float
    """2^(-effective_usage / norm_shares): 1.0 unused, 0.5 at their share, towards 0 above it."""


def account_of(user: str, accounts: Mapping[str, Account]) -> Account:
    """The user's account; a user in none is an account of one, named after them."""
    for a in accounts.values():
        if user in a.users:
            return a
    return Account(user, (user,))


def share_rows(users: Iterable[str], usage: Mapping[str, Usage], accounts: Mapping[str, Account]) -> list[ShareRow]:
    """Every user's share line. `users`: the lab's people now (with usage, with jobs, or named in accounts);
    accounts split the lab among those present, so a share is never held for someone who is not there."""
    people = sorted(set(users) | {u for a in accounts.values() for u in a.users})
    of = {u: account_of(u, accounts) for u in people}
    members: dict[str, list[str]] = {}
    for u in people:
        members.setdefault(of[u].name, []).append(u)
    total_shares = sum(of[m[0]].shares for m in members.values()) or 1
    total_decayed = sum(usage.get(u, Usage()).decayed_s for u in people)
    rows = []
    for u in people:
        acc = of[u]
        norm = acc.shares / total_shares / len(members[acc.name])
        use = usage.get(u, Usage())
        eff = use.decayed_s / total_decayed if total_decayed > 0 else 0.0
        factor = 2.0 ** (-eff / norm) if norm > 0 else 0.0
        rows.append(ShareRow(u, acc.name, acc.shares, norm, use.raw_s, use.decayed_s, eff, factor))
    return sorted(rows, key=lambda r: (r.account, r.user))


def policy_usage(rows: Iterable[ShareRow], weights: PriorityWeights | None = None,
                 admin_jobs: Mapping[str, frozenset[int]] | None = None, hold_s: float = 0.0) -> dict[str, float]:
    """What the scheduling policy compares between users (PolicyInput.user_usage): decayed GPU-seconds per
    equal share (with equal shares the decayed usage itself; a user whose account holds twice the share counts
    half their usage), as `UserShare`s carrying the rest of what the multifactor priority reads: the user's
    decayed usage and normalised share, the lab's decayed usage, the jobs whose priority an admin set, `weights`,
    and how long runs typically hold their GPUs (`hold_s`)."""
    rows = list(rows)
    n = len(rows)
    lab = sum(r.decayed_usage_s for r in rows)
    admin_jobs = admin_jobs or {}
    return {r.user: UserShare(r.decayed_usage_s / (r.norm_shares * n) if r.norm_shares > 0 else r.decayed_usage_s,
                              decayed_s=r.decayed_usage_s, norm_share=r.norm_shares, lab_decayed_s=lab,
                              admin_jobs=admin_jobs.get(r.user, frozenset()), weights=weights, hold_s=hold_s)
            for r in rows}


# ------------------------------------------------------------------------------------ multifactor priority


def priority_line(p: Mapping[str, object]) -> str:
    """`PriorityTerms.as_dict` as one line (`hsched show`): each factor times its weight, and the total."""
    parts = [f"{p[k]:.3f}x{p[f'weight_{k}']:g} {k}" for k in ("fairshare", "age", "size")]
    admin = p.get("admin_priority")
    return f"{p['total']:g} = " + " + ".join(parts) + (f"; priority {admin} set by an admin (first)" if admin else "")


def shared_usage(usage: Mapping[str, float], shares: Mapping[str, float], users: Iterable[str],
                 running: Iterable[tuple[str, float]] = (), weights: PriorityWeights | None = None,
                 hold_s: float = 0.0) -> dict[str, float]:
    """The simulator's `PolicyInput.user_usage`: GPU-seconds used so far per user (`usage`: ended runs; `running`:
    (user, GPU-seconds so far) of each running one, as the live controller's ledger counts them; no decay: a replay
    is days, not the weeks a half-life is set for) against `shares` (a user not named holds 1), as `policy_usage`
    hands the live round its `UserShare`s."""
    people = sorted(set(users))
    total_shares = sum(shares.get(u, 1.0) for u in people) or 1.0
    usage = dict(usage)
    for u, used in running:
        usage[u] = usage.get(u, 0.0) + used
    lab = sum(usage.get(u, 0.0) for u in people)
    n = len(people)
    out: dict[str, float] = {}
    for u in people:
        norm = shares.get(u, 1.0) / total_shares
        used = usage.get(u, 0.0)
        out[u] = UserShare(used / (norm * n) if norm > 0 else used, decayed_s=used, norm_share=norm,
                           lab_decayed_s=lab, weights=weights, hold_s=hold_s)
    return out
