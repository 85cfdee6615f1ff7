"""Each running job's monitoring samples folded into tallies (hsched.learn.efficiency), for `hsched eff`.

The controller keeps only a few minutes of each GPU's history (hsched.controller.fleet.HISTORY), too little
for a job of hours; so every node sample is folded, as it arrives, into one small tally per attempt and node
of each job holding GPUs there. A tally stays in memory while its job holds the GPUs and is written to the
store (`run_usage`) once the job no longer does; `hsched eff` reads both. A controller restart loses the
tallies of the jobs running then (their figures start again from the restart): said as fewer samples.

Besides the GPU readings, every run's own figures (hsched/node/cgroupstats.py: its cgroup's CPU time and memory
peak, in the samples' `run_usage` every few seconds, and once more in its exit record) are folded into the tally
of its attempt and node, for every job, GPUs or none.

`observe` runs on the event loop for every sample of every node: it reads only the job cache's latest
snapshot (no store read) and keeps the GPU -> job map built once per snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hsched.controller.state import Usage
from hsched.learn.efficiency import RunTally, fold, fold_usage
from hsched.learn.profiles import IDLE_AFTER_S, Characterization, Profile, characterize
from hsched.serialize import job_of_run_dir

if TYPE_CHECKING:
    from hsched.controller.core import Controller
    from hsched.controller.fleet import NodeRuntime
    from hsched.controller.jobcache import Jobs

log = logging.getLogger("hsched.usage")


def usage(ctl: Controller) -> Usage:
    return ctl.state.usage


def _held(jobs: Jobs) -> dict[str, dict[str, tuple[int, int]]]:
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for j in jobs.active:
        for p in j.placement:
            for uuid in p.devices:
                # a running attempt's runs are numbered restarts + 1 (hsched.controller.store.Store.start_runs)
                out.setdefault(p.node, {})[uuid] = (j.id, j.restarts + 1)
    return out


def observe(ctl: Controller, rt: NodeRuntime, sample: Mapping[str, Any], now: float) -> None:
    """Fold one monitoring sample of `rt` into the tallies of the jobs holding its GPUs; write out the tallies
    of jobs that hold none any more. Call it after hsched.controller.health.record_sample, for every sample."""
    u = _refresh(ctl)
    _fold_run_usage(u, rt, sample.get("run_usage"), now)
    held = u.held.get(rt.name)
    if not held:
        return
    gpus = sample.get("gpus") or {}
    # readings of real GPUs only: a simulated GPU's figures are made up (hsched.simulated), not samples; a job
    # holding only simulated GPUs here gets its tally from observe_simulated instead
    simulated = {d.uuid for d in rt.node.devices if d.simulated}
    readings = {d["uuid"]: d for d in gpus.get("devices") or []
                if isinstance(d, dict) and d.get("uuid") in held and d.get("uuid") not in simulated}
    listed = sample.get("processes") if gpus.get("source") else None  # as record_sample takes them
    by_run: dict[tuple[int, int], list[dict[str, Any]]] = {
        key: [] for uuid, key in held.items() if uuid not in simulated}
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
            tally = _add(u, RunTally(key[0], key[1], rt.name))
        mine = {uuid: totals.get(uuid) for uuid, k in held.items() if k == key}
        fold(tally, now, readings, mine, procs if isinstance(listed, list) else None)


def _run_of(run_dir: Any) -> tuple[int, int, int] | None:
    """(job id, attempt, rank) from a run folder's name (`JOB-ATTEMPT-rRANK-MS`, hsched.controller.launching)."""
    if not isinstance(run_dir, str):
        return None
    parts = run_dir.rstrip("/").rpartition("/")[2].split("-")
    if len(parts) < 3 or not (parts[0].isdigit() and parts[1].isdigit() and parts[2][:1] == "r"
                              and parts[2][1:].isdigit()):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2][1:])


def _tally(u: Usage, key: tuple[int, int, str]) -> RunTally:
    tally = u.tallies.get(key)
    if tally is None:
        tally = _add(u, RunTally(*key))
    return tally


def _add(u: Usage, tally: RunTally) -> RunTally:
    """A new tally kept, under its key and under its job."""
    u.tallies[(tally.job_id, tally.attempt, tally.node)] = tally
    u.by_job.setdefault(tally.job_id, {})[(tally.attempt, tally.node)] = tally
    return tally


def _fold_run_usage(u: Usage, rt: NodeRuntime, readings: Any, now: float) -> None:
    """Fold a sample's `run_usage` (one reading per active run of the node's helper) into the tallies of the
    running attempts they belong to. Local nodes share one helper, whose readings name every local run: a run is
    folded only on the node its rank was placed on (ranks are numbered node by node, tasks_per_node each)."""
    if not isinstance(readings, list) or u.jobs is None:
        return
    for r in readings:
        ids = _run_of(r.get("job_run_dir") or r.get("run_dir")) if isinstance(r, dict) else None
        if ids is None:
            continue
        job = u.jobs.active_by_id.get(ids[0])
        if job is None or job.restarts + 1 != ids[1]:
            continue  # an attempt that is over: its exit record's reading is the last word
        where = ids[2] // max(1, job.spec.resources.tasks_per_node)
        if where >= len(job.placement) or job.placement[where].node != rt.name:
            continue
        fold_usage(_tally(u, (ids[0], ids[1], rt.name)), now, f"r{ids[2]}", r)


def final_usage(ctl: Controller, job_id: int, attempt: int, node: str, rank: int, reading: Mapping[str, Any] | None,
                now: float) -> None:
    """A run's last reading (its exit record's, taken once none of its processes was left), folded before its
    end is recorded: its attempt's tally is written out with it."""
    if not isinstance(reading, Mapping):
        return
    fold_usage(_tally(usage(ctl), (job_id, attempt, node)), now, f"r{rank}", {**reading, "final": True})


def _refresh(ctl: Controller) -> Usage:
    """The controller's tallies, with the GPU -> job map of the job cache's latest snapshot (and the tallies of
    jobs that hold no GPUs any more written out, once per new snapshot)."""
    from hsched.controller.jobcache import job_cache

    u = usage(ctl)
    jobs = job_cache(ctl).last
    if jobs is not u.jobs:
        u.jobs, u.held = jobs, _held(jobs)
        _flush_ended(ctl, u)
    return u


def observe_simulated(ctl: Controller, rt: NodeRuntime, now: float) -> None:
    """Fold the readings hsched.simulated just made up for `rt`'s simulated GPUs (hsched.controller.health.
    simulate_telemetry) into tallies marked `simulated`: profiles read them, `hsched eff`'s figures do not. A
    job that declared a nature (hsched.learn.profiles.SIM_NATURE_ENV) gets the readings of that nature, including
    memory bandwidth, interconnect traffic and its processes' CPU; any other, the plain busy readings only."""
    from hsched.learn.profiles import sim_nature
    from hsched.simulated import simulated_extras, simulated_processes

    u = _refresh(ctl)
    held = u.held.get(rt.name)
    if not held or u.jobs is None:
        return
    devices = {d.uuid: d for d in rt.node.devices if d.simulated and d.uuid in held}
    if not devices:
        return
    nvlinked = {x for link in rt.node.links if link.kind.upper().startswith("NV") for x in (link.a, link.b)}
    by_run: dict[tuple[int, int], list[str]] = {}
    for uuid in devices:
        by_run.setdefault(held[uuid], []).append(uuid)
    for key, uuids in by_run.items():
        job = u.jobs.active_by_id.get(key[0])
        nature = sim_nature(job.spec.env) if job is not None else None
        readings = {uuid: {"utilization_gpu": devices[uuid].utilization_gpu,
                           "memory_used_mib": devices[uuid].memory_used_mib,
                           **simulated_extras(devices[uuid], nature, uuid in nvlinked, now)} for uuid in uuids}
        tk = (key[0], key[1], rt.name)
        tally = u.tallies.get(tk)
        if tally is None:
            tally = _add(u, RunTally(key[0], key[1], rt.name, simulated=True))
        tally.simulated = True  # made by a cgroup reading first (_fold_run_usage): its GPU readings are made up
        fold(tally, now, readings, {uuid: devices[uuid].memory_total_mib for uuid in uuids},
             simulated_processes(nature, sorted(uuids), now))


def sim_natures(ctl: Controller, owners: Mapping[str, int]) -> dict[str, Profile]:
    """UUID -> the nature its holder declared for simulated readings (from the job cache's latest snapshot)."""
    from hsched.controller.jobcache import job_cache
    from hsched.learn.profiles import sim_nature

    jobs = job_cache(ctl).last
    if jobs is None:
        return {}
    out: dict[str, Profile] = {}
    for uuid, job_id in owners.items():
        job = jobs.active_by_id.get(job_id)
        nature = sim_nature(job.spec.env) if job is not None else None
        if nature is not None:
            out[uuid] = nature
    return out


def _flush_ended(ctl: Controller, u: Usage) -> None:
    """Write the tallies of jobs that no longer hold GPUs to the store, and forget them here."""
    assert u.jobs is not None
    live = {(j.id, j.restarts + 1) for j in u.jobs.active}
    for k in [k for k in u.idle if k not in live]:
        del u.idle[k]  # an idle flag ends with the attempt
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
                mine = u.by_job.get(t.job_id, {})
                mine.pop((t.attempt, t.node), None)
                if not mine:
                    u.by_job.pop(t.job_id, None)

    ctl.spawn(write())


def tallies_of(ctl: Controller, job_id: int, stored: list[dict[str, Any]]) -> list[RunTally]:
    """Job `job_id`'s tallies: those written to the store (`stored`, its run_usage bodies) and the live ones
    (a live one wins over a stored one of the same attempt and node)."""
    out = {(t.attempt, t.node): t for t in map(RunTally.from_dict, stored)}
    out.update(usage(ctl).by_job.get(job_id, {}))  # (a job's own: an end read every running job's, 512 of them)
    return [out[k] for k in sorted(out)]


IDLE_CHECK_S = 10.0
"""How often check_idle looks at the running jobs' tallies: an idle flag comes at most this late (after
`idle_after_s`, which is minutes), and looking at every sample of every node would cost for nothing."""


def idle_after_s(ctl: Controller) -> float:
    return ctl.settings.idle_after_s


@dataclass(frozen=True, slots=True)
class IdleChange:
    """A running attempt flagged idle (`idle`), or busy again after a flag."""

    job_id: int
    attempt: int
    idle: bool
    characterization: Characterization
    since: float
    """Idle since then (a flag), or was idle since then (busy again)."""


def idle_changes(ctl: Controller, now: float) -> list[IdleChange]:
    """The running attempts whose GPUs have just been idle past `idle_after_s` (each flagged once), and the
    flagged ones that just became busy again. At most every IDLE_CHECK_S; nothing is done to the jobs."""
    u = usage(ctl)
    looked = ctl.clock.monotonic()
    if u.idle_checked is not None and looked - u.idle_checked < IDLE_CHECK_S:
        return []
    u.idle_checked = looked
    limit = idle_after_s(ctl)
    by_attempt: dict[tuple[int, int], list[RunTally]] = {}
    for (job_id, attempt, _), t in u.tallies.items():
        by_attempt.setdefault((job_id, attempt), []).append(t)
    out = []
    for key, tallies in by_attempt.items():
        c = characterize(tallies, now, limit)
        idle_for = c.signals.idle_for_s
        flagged = key in u.idle
        if not flagged and c.profile is Profile.IDLE and idle_for is not None:
            u.idle[key] = now - idle_for
            out.append(IdleChange(key[0], key[1], True, c, u.idle[key]))
        elif flagged and idle_for is None:
            out.append(IdleChange(key[0], key[1], False, c, u.idle.pop(key)))
    return out


def profile_of(ctl: Controller, job_id: int, attempt: int, stored: list[dict[str, Any]],
               running: bool) -> dict[str, Any] | None:
    """The profile (hsched.learn.profiles.Characterization.to_dict, with `flagged`) of attempt `attempt` of job
    `job_id`, from its live tallies or those kept in the store (`stored`: its run_usage bodies); None when
    no tally exists."""
    mine = [t for t in tallies_of(ctl, job_id, stored) if t.attempt == attempt]
    if not mine:
        return None
    c = characterize(mine, ctl.clock.time() if running else None, idle_after_s(ctl))
    return {**c.to_dict(), "flagged": (job_id, attempt) in usage(ctl).idle}


def flagged_attempts(ctl: Controller, job_id: int) -> set[int]:
    """The attempts of job `job_id` flagged idle now."""
    return {a for j, a in usage(ctl).idle if j == job_id}


KIND_PROFILE_JOBS = 500
"""`hsched kinds` reads the profiles of this many of the latest jobs (an old kind's habits are old news)."""


def live_snapshot(ctl: Controller) -> dict[int, list[RunTally]]:
    """Job id -> copies of its live tallies, taken on the event loop for a reader on another thread."""
    out: dict[int, list[RunTally]] = {}
    for (job_id, _, _), t in usage(ctl).tallies.items():
        out.setdefault(job_id, []).append(RunTally.from_dict(t.to_dict()))
    return out


def kind_profiles(store: Any, live: Mapping[int, list[RunTally]],
                  idle_after_s: float = IDLE_AFTER_S) -> dict[str, list[Profile]]:
    """Kind -> the profile of the last attempt with a tally of each of its latest KIND_PROFILE_JOBS jobs (`live`:
    live_snapshot's, counted in). Runs on the store's thread: it reads the store once per job."""
    from hsched.serialize import job_kind

    out: dict[str, list[Profile]] = {}
    for job in store.jobs(limit=KIND_PROFILE_JOBS):
        tallies = {(t.attempt, t.node): t for t in map(RunTally.from_dict, store.run_usage(job.id))}
        for t in live.get(job.id, ()):
            tallies[(t.attempt, t.node)] = t
        if not any(t.devices for t in tallies.values()):
            continue  # no GPU read (a job without GPUs has its cgroup's figures only): no profile to count
        last = max(a for a, _ in tallies)
        c = characterize([t for (a, _), t in tallies.items() if a == last], None, idle_after_s)
        out.setdefault(job_kind(job), []).append(c.profile)
    return out
