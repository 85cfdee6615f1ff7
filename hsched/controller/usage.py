"""Each running job's monitoring samples folded into tallies (hsched.efficiency), for `hsched eff`.

The controller keeps only a few minutes of each GPU's history (hsched.controller.fleet.HISTORY), too little
for a job of hours; so every node sample is folded, as it arrives, into one small tally per attempt and node
of each job holding GPUs there. A tally stays in memory while its job holds the GPUs and is written to the
store (`run_usage`) once the job no longer does; `hsched eff` reads both. A controller restart loses the
tallies of the jobs running then (their figures start again from the restart): said as fewer samples.

`observe` runs on the event loop for every sample of every node: it reads only the job cache's latest
snapshot (no store read) and keeps the GPU -> job map built once per snapshot.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hsched.efficiency import RunTally, fold
from hsched.serialize import job_of_run_dir

if TYPE_CHECKING:
    from hsched.controller.core import Controller
    from hsched.controller.fleet import NodeRuntime
    from hsched.controller.launching import Jobs

log = logging.getLogger("hsched.usage")


@dataclass(slots=True)
class Usage:
    """The controller's live tallies (one per controller: a test process may hold several)."""

    tallies: dict[tuple[int, int, str], RunTally] = field(default_factory=dict)
    """(job id, attempt, node) -> its tally, while the job holds GPUs."""
    jobs: Jobs | None = None
    held: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)
    """From `jobs`: node -> GPU UUID -> (job id, attempt) of the job holding it."""


_USAGE: weakref.WeakKeyDictionary[Controller, Usage] = weakref.WeakKeyDictionary()


def usage(ctl: Controller) -> Usage:
    u = _USAGE.get(ctl)
    if u is None:
        u = _USAGE[ctl] = Usage()
    return u


def _held(jobs: Jobs) -> dict[str, dict[str, tuple[int, int]]]:
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for j in jobs.active:
        for p in j.placement:
            for uuid in p.devices:
                # a running attempt's runs are numbered restarts + 1 (hsched.store.Store.start_runs)
                out.setdefault(p.node, {})[uuid] = (j.id, j.restarts + 1)
    return out


def observe(ctl: Controller, rt: NodeRuntime, sample: Mapping[str, Any], now: float) -> None:
    """Fold one monitoring sample of `rt` into the tallies of the jobs holding its GPUs; write out the tallies
    of jobs that hold none any more. Call it after hsched.controller.health.record_sample, for every sample."""
    from hsched.controller.launching import job_cache

    u = usage(ctl)
    jobs = job_cache(ctl).last
    if jobs is not u.jobs:
        u.jobs, u.held = jobs, _held(jobs)
        _flush_ended(ctl, u)
    held = u.held.get(rt.name)
    if not held:
        return
    gpus = sample.get("gpus") or {}
    # readings of real GPUs only: a simulated GPU's figures are made up (hsched.simulated), not samples
    simulated = {d.uuid for d in rt.node.devices if d.simulated}
    readings = {d["uuid"]: d for d in gpus.get("devices") or []
                if isinstance(d, dict) and d.get("uuid") in held and d.get("uuid") not in simulated}
    listed = sample.get("processes") if gpus.get("source") else None  # as record_sample takes them
    by_run: dict[tuple[int, int], list[dict[str, Any]]] = {key: [] for key in held.values()}
    if isinstance(listed, list):
        for p in listed:
            key = held.get(str(p.get("uuid"))) if isinstance(p, dict) else None
            # the process is the job's when it runs on a GPU the job holds and from one of the job's run folders
            if key is not None and job_of_run_dir(p.get("job_run_dir") or p.get("run_dir")) == key[0]:
                by_run[key].append(p)
    totals = {d.uuid: d.memory_total_mib for d in rt.node.devices}
    for key, procs in by_run.items():
        tk = (key[0], key[1], rt.name)
        tally = u.tallies.get(tk)
        if tally is None:
            tally = u.tallies[tk] = RunTally(key[0], key[1], rt.name)
        mine = {uuid: totals.get(uuid) for uuid, k in held.items() if k == key}
        fold(tally, now, readings, mine, procs if isinstance(listed, list) else None)


def _flush_ended(ctl: Controller, u: Usage) -> None:
    """Write the tallies of jobs that no longer hold GPUs to the store, and forget them here."""
    assert u.jobs is not None
    live = {(j.id, j.restarts + 1) for j in u.jobs.active}
    done = [t for k, t in u.tallies.items() if (k[0], k[1]) not in live]
    if not done:
        return
    rows = [(t.job_id, t.attempt, t.node, t.to_dict()) for t in done]

    async def write() -> None:
        try:
            await ctl.db(ctl.store.save_run_usage, rows)
        except Exception:  # a figure lost is no reason to disturb the controller
            log.exception("cannot keep the usage of %d runs", len(rows))
        # forgotten here only once stored, so `hsched eff` finds each tally in one place or the other
        for t in done:
            if u.tallies.get((t.job_id, t.attempt, t.node)) is t:
                del u.tallies[(t.job_id, t.attempt, t.node)]

    ctl.spawn(write())


def tallies_of(ctl: Controller, job_id: int, stored: list[dict[str, Any]]) -> list[RunTally]:
    """Job `job_id`'s tallies: those written to the store (`stored`, its run_usage bodies) and the live ones
    (a live one wins over a stored one of the same attempt and node)."""
    out = {(t.attempt, t.node): t for t in map(RunTally.from_dict, stored)}
    for (j, attempt, node), t in usage(ctl).tallies.items():
        if j == job_id:
            out[(attempt, node)] = t
    return [out[k] for k in sorted(out)]
