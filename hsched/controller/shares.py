"""Fair share in the controller: usage from the store, shares from the settings (the math: hsched.learn.fairshare).

The scheduling round hands the policy each user's decayed usage per share (`round_usage`, as `UserShare`s that
also carry the user's share, the lab's usage, the jobs whose priority an admin set and the settings' weights);
`hsched share` shows the same numbers as sshare does and each waiting job's multifactor priority as sprio does
(`share_report`); `hsched show` the job's own (`job_priority`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hsched.config import Settings
from hsched.controller.core import Controller
from hsched.controller.store import Store
from hsched.learn.fairshare import PriorityTerms, ShareRow, age_factor, policy_usage, share_rows, size_factor
from hsched.model import Job, JobState, NodeState


async def lab_shares(ctl: Controller, now: float, users: Iterable[str] = ()) -> list[ShareRow]:
    """Every user's share line: those given, those with jobs not ended, those with any usage, those named in
    the settings' accounts."""
    usage = await ctl.db(ctl.store.user_usage, now, ctl.settings.fairshare_half_life_s)
    people = set(users) | set(await ctl.db(ctl.store.job_users)) | {u for u, v in usage.items() if v.raw_s > 0}
    return share_rows(people, usage, ctl.settings.accounts)


def admin_jobs(jobs: Iterable[Job]) -> dict[str, frozenset[int]]:
    """Per user, their jobs whose priority a lab admin set (those order across users)."""
    out: dict[str, set[int]] = {}
    for j in jobs:
        if j.spec.priority_admin and j.spec.priority:
            out.setdefault(j.user, set()).add(j.id)
    return {u: frozenset(ids) for u, ids in out.items()}


async def round_usage(ctl: Controller, now: float, users: Iterable[str], jobs: Iterable[Job] = (),
                      mark: int | None = None) -> dict[str, float]:
    """What fair share compares in a round (FleetView.user_usage): decayed GPU-seconds per equal share, as
    `UserShare`s (`jobs`: the round's, for the priorities admins set; with `mark`, the store's change count when
    `jobs` were read, they are every job not ended)."""
    # (in one call on the store's thread: three calls and the sums on the event loop were ~0.5 ms of it a poll)
    return await ctl.db(_round_usage, ctl.store, ctl.settings, now, frozenset(users), tuple(jobs), mark)


def _round_usage(store: Store, settings: Settings, now: float, users: frozenset[str], jobs: tuple[Job, ...],
                 mark: int | None = None) -> dict[str, float]:
    usage = store.user_usage(now, settings.fairshare_half_life_s)
    # the users with a job not ended: those of `jobs` while the store has not changed since they were read (the
    # query over the jobs table was ~1.2 ms a poll with 2,500 jobs, issue 33)
    with_jobs = ({j.user for j in jobs} if mark is not None and store.db.total_changes == mark
                 else set(store.job_users()))
    people = set(users) | with_jobs | {u for u, v in usage.items() if v.raw_s > 0}
    rows = share_rows(people, usage, settings.accounts)
    # (user_usage advanced the store's ledger to now: its typical run length is this round's)
    return policy_usage(rows, settings.priority, admin_jobs(jobs), store.typical_run_s())


def fleet_gpus(ctl: Controller) -> int:
    """GPUs on the nodes that are up: what the size factor divides by (the policy's: the round's capacity)."""
    return sum(len(rt.node.devices) for rt in ctl.nodes.values() if rt.node.state is NodeState.UP)


def job_terms(job: Job, rows: Mapping[str, ShareRow], ctl: Controller, now: float) -> PriorityTerms:
    """A job's multifactor priority as sprio shows it: its user's fair-share factor (sshare's), its age (time
    waited since submit, over `[priority] max_age_s`) and size (GPUs over the fleet's), with the weights. The
    policy starts each selection from these and counts what it hands out as it goes (hsched.sched.policies.hsched)."""
    w = ctl.settings.priority
    row = rows.get(job.user)
    waited = (job.start_time if job.state is not JobState.PENDING and job.start_time else now) - job.submit_time
    res = job.spec.resources
    return PriorityTerms(row.fairshare if row is not None else 1.0, age_factor(waited, w.max_age_s),
                         size_factor(max(1, res.gpus * res.nodes), fleet_gpus(ctl)), w,
                         job.spec.priority if job.spec.priority_admin else None)


async def job_priority(ctl: Controller, job: Job) -> dict[str, Any] | None:
    """`hsched show`'s priority breakdown of a job that has not ended (None for an ended one)."""
    if job.state.is_terminal():
        return None
    now = ctl.clock.time()
    rows = {r.user: r for r in await lab_shares(ctl, now, (job.user,))}
    return {"job_id": job.id, "user": job.user, "qos": job.spec.qos, "priority": job.spec.priority,
            **job_terms(job, rows, ctl, now).as_dict()}


def _weights(ctl: Controller) -> dict[str, float]:
    w = ctl.settings.priority
    return {"weight_fairshare": w.fairshare, "weight_age": w.age, "weight_size": w.size, "max_age_s": w.max_age_s}


async def share_report(ctl: Controller) -> dict[str, Any]:
    """`hsched share --json`: the half-life, the weights, one line per user (GPU-hours, fractions, the factor),
    and every waiting job's priority breakdown (sprio's)."""
    now = ctl.clock.time()
    rows = await lab_shares(ctl, now)
    by_user = {r.user: r for r in rows}
    waiting = await ctl.db(lambda: ctl.store.jobs(states=[JobState.PENDING]))
    jobs = []
    for j in waiting:
        terms = job_terms(j, by_user, ctl, now)
        jobs.append({"job_id": j.id, "user": j.user, "qos": j.spec.qos, "priority": j.spec.priority,
                     **terms.as_dict()})
    return {
        "half_life_s": ctl.settings.fairshare_half_life_s,
        "policy": ctl.settings.policy,
        "weights": _weights(ctl),
        "users": [{
            "user": r.user, "account": r.account, "shares": r.shares, "norm_shares": round(r.norm_shares, 6),
            "raw_usage_gpu_hours": round(r.raw_usage_s / 3600, 4),
            "decayed_usage_gpu_hours": round(r.decayed_usage_s / 3600, 4),
            "effective_usage": round(r.effective_usage, 6), "fairshare": round(r.fairshare, 6),
        } for r in rows],
        # (an admin's priority first, as the policy orders them between users; then the sum)
        "jobs": sorted(jobs, key=lambda d: (-(d["admin_priority"] or 0), -d["total"], d["job_id"])),
    }
