"""Fair share in the controller: usage from the store, shares from the settings (the math: hsched.fairshare).

The scheduling round hands the policy each user's decayed usage per share (`round_usage`); `hsched share`
shows the same numbers as sshare does (`share_report`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hsched.controller.core import Controller
from hsched.fairshare import ShareRow, policy_usage, share_rows


async def lab_shares(ctl: Controller, now: float, users: Iterable[str] = ()) -> list[ShareRow]:
    """Every user's share line: those given, those with jobs not ended, those with any usage, those named in
    the settings' accounts."""
    usage = await ctl.db(ctl.store.user_usage, now, ctl.settings.fairshare_half_life_s)
    people = set(users) | set(await ctl.db(ctl.store.job_users)) | {u for u, v in usage.items() if v.raw_s > 0}
    return share_rows(people, usage, ctl.settings.accounts)


async def round_usage(ctl: Controller, now: float, users: Iterable[str]) -> dict[str, float]:
    """What fair share compares in a round (FleetView.user_usage): decayed GPU-seconds per equal share."""
    return policy_usage(await lab_shares(ctl, now, users))


async def share_report(ctl: Controller) -> dict[str, Any]:
    """`hsched share --json`: the half-life, and one line per user (GPU-hours, fractions, the factor)."""
    rows = await lab_shares(ctl, ctl.clock.time())
    return {
        "half_life_s": ctl.settings.fairshare_half_life_s,
        "policy": ctl.settings.policy,
        "users": [{
            "user": r.user, "account": r.account, "shares": r.shares, "norm_shares": round(r.norm_shares, 6),
            "raw_usage_gpu_hours": round(r.raw_usage_s / 3600, 4),
            "decayed_usage_gpu_hours": round(r.decayed_usage_s / 3600, 4),
            "effective_usage": round(r.effective_usage, 6), "fairshare": round(r.fairshare, 6),
        } for r in rows],
    }
