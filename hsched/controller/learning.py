"""What the controller learns from the jobs' progress reports: each run's speed, each kind's (hsched.learn.kinds).

A job reports progress into its run folder (hsched.progress); every node's monitoring stream carries the new
reports of its active runs every few seconds (nodehelper `watch`), and `observe` keeps, per attempt of a job,
its first and last report (rank 0's: a gang's ranks step together). The speed of a run is the steps between
them over the seconds between them, once they span hsched.learn.kinds.MIN_WINDOW_S (start-up is not a speed).
When the job no longer holds that attempt's GPUs the run's speed joins its kind's moving average in the
store (kind, GPU type, GPU count, placement class), and its progress is kept (`hsched show`).

The live policy reads `throughput(ctl)`: the kinds' speeds as a throughput model (hsched.learn.kinds.learned_model),
the running jobs' current speeds counted in, rebuilt at most every MODEL_EVERY_S (a round may run ten times a
second; a model that changes every round would defeat what the policy keeps from round to round).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hsched.controller.state import ControllerState, End, Learning, RateKey, RunProgress
from hsched.learn.kinds import (
    KindRate,
    PlacementClass,
    _fallback,
    averaged,
    catalog_prior,
    learned_model,
    measured_prior,
    placement_class,
    run_speed,
)
from hsched.serialize import job_kind

if TYPE_CHECKING:
    from hsched.controller.core import Controller
    from hsched.controller.fleet import NodeRuntime
    from hsched.controller.jobcache import Jobs
    from hsched.model import Job
    from hsched.sched.throughput import ThroughputModel

log = logging.getLogger("hsched.learning")

MODEL_EVERY_S = 30.0


def learning(ctl: Controller) -> Learning:
    return ctl.state.learning


def run_of_folder(run_dir: str | None) -> tuple[int, int, int] | None:
    """(job id, attempt, rank) from a run folder's name (`JOB-ATTEMPT-rRANK-MS`, hsched.controller.launching)."""
    if not run_dir:
        return None
    parts = run_dir.rstrip("/").rpartition("/")[2].split("-")
    if len(parts) < 3 or not (parts[0].isdigit() and parts[1].isdigit() and parts[2][:1] == "r"
                              and parts[2][1:].isdigit()):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2][1:])


def rate_key(ctl: Controller, job: Job) -> RateKey | None:
    """What a run of `job` as placed now measures: its kind, GPU type, GPU count and placement class."""
    from hsched.sched.live import gpu_type_of

    devices = [d for p in job.placement for d in p.devices]
    if not devices:
        return None
    models = set()
    nvlinked: list[tuple[str, str]] = []
    for p in job.placement:
        rt = ctl.nodes.get(p.node)
        if rt is None:
            return None
        mine = set(p.devices)
        models |= {d.model for d in rt.node.devices if d.uuid in mine}
        nvlinked += [(lk.a, lk.b) for lk in rt.node.links
                     if lk.kind.upper().startswith(("NV", "XGMI")) and lk.a in mine and lk.b in mine]
    if len(models) != 1:
        return None  # GPUs of several models run at the slowest one's pace: no figure for either
    klass = placement_class([p.devices for p in job.placement], nvlinked)
    return job_kind(job), gpu_type_of(models.pop()), len(devices), klass.value


def observe(ctl: Controller, rt: NodeRuntime, sample: Mapping[str, Any], now: float, jobs: Jobs | None) -> None:
    """Take the progress reports of one monitoring sample (`progress`, run folders mapped to the controller's
    as `job_run_dir`); learn from the runs that ended since the job cache's snapshot `jobs` last changed."""
    lr = learning(ctl)
    if jobs is not None and jobs is not lr.jobs:
        lr.jobs = jobs
        _flush_ended(ctl, lr, now)
    reports = sample.get("progress")
    if not isinstance(reports, list) or jobs is None:
        return
    for rep in reports:
        if not isinstance(rep, dict):
            continue
        ids = run_of_folder(rep.get("job_run_dir"))
        if ids is None or ids[2] != 0:
            continue
        job = jobs.active_by_id.get(ids[0])
        if job is None or job.restarts + 1 != ids[1]:
            continue  # a report of an attempt that is over: its figure was taken
        step = rep.get("step", rep.get("samples"))
        if not isinstance(step, int | float):
            continue
        rp = lr.runs.get((ids[0], ids[1]))
        if rp is None:
            key = rate_key(ctl, job)
            if key is None:
                continue
            rp = lr.runs[(ids[0], ids[1])] = RunProgress(ids[0], ids[1], key)
        t = rep.get("t")
        point = (float(t) if isinstance(t, int | float) else now, float(step))
        if rp.first is None:
            rp.first = point
            started = ctl.attempt_start.get(job.id)
            if ids[1] > 1 and started is not None:
                # a restart's first report: how long its restore took (what a move costs it, with its stop)
                from hsched.controller import moves

                # (the report's time, the node's wall clock, converted onto the timeline the start is on)
                moves.note_restored(ctl, job.id, ids[1], ctl.timeline.since(point[0]) - started)
        rp.last = point
        total, loss = rep.get("total"), rep.get("loss")
        rp.total = float(total) if isinstance(total, int | float) else rp.total
        rp.loss = float(loss) if isinstance(loss, int | float) else rp.loss
        reps = rep.get("reports")
        rp.reports += int(reps) if isinstance(reps, int | float) else 1


def _flush_ended(ctl: Controller, lr: Learning, now: float) -> None:
    """Runs whose attempt no longer holds GPUs: their speed to their kind's average, their progress to the
    store; forgotten here once written."""
    assert lr.jobs is not None
    live = {(j.id, j.restarts + 1) for j in lr.jobs.active}
    # (a requeued job waits: it is queued, not active. Kept for the active ones alone, every waiting job's figure was
    # dropped here, so the policy never ranked a waiting job by its progress: issue 33)
    waiting, active = lr.jobs.queued_by_id, lr.jobs.active_by_id
    if lr.left:
        for jid in [i for i in lr.left if i not in active and i not in waiting]:
            del lr.left[jid]  # (ended jobs do not pile up)
    done = [rp for k, rp in lr.runs.items() if k not in live]
    if not done:
        return
    for rp in done:
        del lr.runs[(rp.job_id, rp.attempt)]
        # what its progress says is left, for the policy to rank it by while it waits (waiting_left)
        if ((rp.job_id in waiting or rp.job_id in active) and (left := _left_at_last(lr, rp)) is not None
                and left > 0):
            lr.left[rp.job_id] = (left, rp.key[1])

    async def write() -> None:
        for rp in done:
            try:
                await ctl.db(ctl.store.save_run_progress, rp.job_id, rp.attempt, rp.to_dict())
                speed = rp.steps_per_s
                if speed is not None and rp.key[0]:  # a job of no kind (a shell line of echo, id...) teaches nothing
                    rate = await ctl.db(ctl.store.learn_kind_rate, *rp.key, speed, now)
                    table = await rates(ctl)
                    table[rp.key] = rate
                    lr.model_at = float("-inf")  # a run's figure is in: the next round's model has it
                    log.info("kind %r on %d x %s (%s): %.3g steps/s (%d runs)", rate.kind, rate.gpus,
                             rate.gpu_type, rate.klass.value, rate.steps_per_s, rate.runs)
            except Exception:  # a figure lost is no reason to disturb the controller
                log.exception("cannot keep the progress of job %d, attempt %d", rp.job_id, rp.attempt)

    ctl.spawn(write())


async def rates(ctl: Controller) -> dict[RateKey, KindRate]:
    """The kinds' learned speeds (the store's, read on first use)."""
    lr = learning(ctl)
    if lr.rates is None:
        stored = await ctl.db(ctl.store.kind_rates)
        lr.rates = {(r.kind, r.gpu_type, r.gpus, r.klass.value): r for r in stored}
    return lr.rates


def current_rates(ctl: Controller) -> list[KindRate]:
    """The stored speeds with each running job's current speed counted in as one more run (not stored)."""
    lr = learning(ctl)
    out = dict(lr.rates or {})
    for rp in lr.runs.values():
        speed = rp.steps_per_s
        if speed is None:
            continue
        old = out.get(rp.key)
        runs = old.runs if old else 0
        out[rp.key] = KindRate(rp.key[0], rp.key[1], rp.key[2], PlacementClass(rp.key[3]),
                               averaged(old.steps_per_s if old else None, runs, speed), runs + 1,
                               rp.last[0] if rp.last else 0.0)
    return list(out.values())


def throughput(ctl: Controller, now: float, gpu_types: list[str]) -> ThroughputModel | None:
    """The learned speeds as the policy's throughput model; None while nothing is learned (the policy's
    accelerator-table prior alone). Rebuilt at most every MODEL_EVERY_S, and when a run's figure is stored."""
    lr = learning(ctl)
    if now - lr.model_at < MODEL_EVERY_S:
        return lr.model
    lr.model_at = now
    known = current_rates(ctl)
    if not known:
        lr.model = None
        return None
    # a kind's speed on GPU types it has not run on: from the types' relative speeds as measured so far (the
    # accelerator table's are rough: on ed69ec 8+8+8 they cost 4.7% of average JCT against the oracle, 0.5%
    # measured); a kind nothing measured keeps the accelerator table's (one odd kind must not send every unknown
    # job to the GPU it happened to like); and a prior rate for a kind at a GPU count nothing measured (a kind
    # seen only as a 4-GPU gang would otherwise have no rate anywhere: never placed)
    prior = catalog_prior()
    lr.model = _fallback(learned_model(known, gpu_types, prior, completion=measured_prior(known, prior, gpu_types)))
    return lr.model


def progress_of(ctl: Controller, job_id: int, attempt: int) -> dict[str, Any] | None:
    """A running attempt's progress as `hsched show` gives it (None: no report yet)."""
    rp = learning(ctl).runs.get((job_id, attempt))
    return rp.to_dict() if rp is not None and rp.last is not None else None


# ------------------------------------------------------------------------------------------- durations


async def history_of(ctl: Controller, kind: str) -> list[tuple[str, float]]:
    """(user, running time) of the kind's last completed jobs (the store's, read once per kind)."""
    if not kind:
        return []  # jobs of no kind share no history (a store from before kinds were refused may hold some)
    lr = learning(ctl)
    got = lr.history.get(kind)
    if got is None:
        got = lr.history[kind] = await ctl.db(ctl.store.durations, kind)
    return got


def expected_of(history: Sequence[tuple[str, float]], user: str) -> float | None:
    from hsched.learn.predict import expected_duration

    return expected_duration([d for u, d in history if u == user], [d for _u, d in history])


async def expected(ctl: Controller, job: Job) -> float | None:
    """How long `job` is expected to run (hsched.learn.predict), from its kind's history; None: no history."""
    return expected_of(await history_of(ctl, job_kind(job)), job.user)


async def note_start(ctl: Controller, job: Job) -> None:
    """A job's first start: what is predicted now is what its prediction error is measured against."""
    lr = learning(ctl)
    if job.id not in lr.predicted:
        lr.predicted[job.id] = await expected(ctl, job)


async def note_end(ctl: Controller, job: Job, running_s: float, now: float,
                   peaks: tuple[int | None, int | None] = (None, None)) -> None:
    """A job completed after `running_s` of running (all its attempts): its kind's history gains it, with the
    prediction made at its start (a controller restart in between loses that one) and its GPU and host memory
    peaks (MiB, from its monitoring samples: None where none read them)."""
    lr = learning(ctl)
    kind = job_kind(job)
    predicted = lr.predicted.pop(job.id, None)
    if not kind:
        return  # no kind, no history: unrelated shell lines must not predict one another
    history = await history_of(ctl, kind)
    history.append((job.user, running_s))
    del history[:-200]
    try:
        await ctl.db(ctl.store.add_job_duration, job.id, kind, job.user, running_s, now, predicted, *peaks)
    except Exception:  # a figure lost is no reason to disturb the controller
        log.exception("cannot keep the duration of job %d", job.id)


MEMORY_MARGIN = 0.10
"""What a job without a GPU memory request is given over its kind's learned peak: a run's peak varies."""


async def learned_gpu_memory(ctl: Controller, kind: str) -> int | None:
    """The GPU memory (MiB) a job of `kind` that asks for none needs: the highest peak of its last measured
    runs, plus MEMORY_MARGIN; None while none was measured."""
    peaks = [g for g, _h in await ctl.db(ctl.store.memory_peaks, kind) if g]
    return int(max(peaks) * (1 + MEMORY_MARGIN)) + 1 if peaks else None




OVERRUN_SHARE = 0.5
"""A running job past its expected duration by up to this share of it is predicted to end SOON_S from now."""
SOON_S = 30.0


def progress_speed(lr: Learning, rp: RunProgress) -> float | None:
    """The speed a run's remaining time is counted at: its own, measured (`RunProgress.steps_per_s`), else its kind's
    learned speed for where it runs (the store's figure for its key, else the throughput model's measured one); None
    where neither is known.

    Why the kind's: a run's own speed counts only once its reports span MIN_WINDOW_S (5 s), and a time-compressed
    replay's quantum is shorter (4.2 s at 29,000x): every requeued job and every running one at its quantum's end
    had no remaining time, so the policy ranked those by attained service and the others by remaining time, and
    jobs swapped back and forth (issue 33: 330 stops against the simulator's 103). The simulator knows a job's speed
    from the round it starts; the kind's learned speed is what the controller knows of it then."""
    speed = rp.steps_per_s
    if speed:
        return speed
    kind, gpu_type, gpus, _klass = rp.key
    got = (lr.rates or {}).get(rp.key)
    if got is not None and got.steps_per_s > 0:
        return got.steps_per_s
    model = lr.model
    if kind and model is not None and model.measured(kind, gpus):
        return model.rate(kind, gpus, gpu_type)
    return None


def _left_at_last(lr: Learning, rp: RunProgress) -> float | None:
    """Seconds a run's last report said were left, at `progress_speed` (None: no total, or no speed)."""
    if rp.last is None or rp.total is None:
        return None
    speed = progress_speed(lr, rp)
    if not speed:
        return None
    from hsched.learn.predict import remaining

    return remaining(0.0, None, rp.last[1], rp.total, speed)


def running_left(ctl: Controller, movable: Iterable[int]) -> dict[int, tuple[float, float, str]]:
    """The round's `FleetView.running_left`: per running job of `movable` (the jobs the round may time-share or move:
    only theirs are read) whose current attempt reported progress with a total, (when it last reported, on the
    controller's timeline; the seconds left then, at `progress_speed`; the GPU type it runs on). The policy's
    remaining time for a running job, as the simulator's: the work left over its speed there, counted down since
    (hsched.sched.stages.plan.remaining_times)."""
    lr = learning(ctl)
    jobs = lr.jobs
    out: dict[int, tuple[float, float, str]] = {}
    if jobs is None:
        return out
    since = ctl.timeline.since
    for jid in movable:
        job = jobs.active_by_id.get(jid)
        rp = lr.runs.get((jid, job.restarts + 1)) if job is not None else None
        if rp is None or rp.last is None or rp.total is None:
            continue
        left = _left_at_last(lr, rp)
        if left is not None:
            out[jid] = (since(rp.last[0]), max(0.0, left), rp.key[1])
    return out


def waiting_left(ctl: Controller) -> dict[int, tuple[float, str]]:
    """The round's `FleetView.left`: per job whose last ended attempt reported progress with a total, the seconds
    that progress said were left and the GPU type it ran on (the round reads only its waiting jobs'). A copy: the
    round reads it in its own thread while the loop learns."""
    return dict(learning(ctl).left)


def predicted_ends(ctl: Controller, jobs: Iterable[Job], now: float) -> dict[int, float]:
    """Each running job's predicted end (the live round's `FleetView.ends`, for the reservation of the first blocked
    job), by forecast.predicted_end's rules without reading the store: its progress (`total` known), else its
    kind's history as cached (`learning(ctl).history`; a kind not read yet has none; a job a little past it: soon,
    OVERRUN_SHARE), capped by its time limit,
    else its time limit; a job nothing predicts is left out (never ending). Synchronous and cheap: a round runs ten
    times a second, so the figures are kept per job while its progress and its kind's history do not change. `now` and
    the ends: on the controller's timeline (Controller.timeline), as the attempts' starts."""
    from hsched.model import JobState

    jobs = tuple(jobs)
    for j in jobs:
        if j.state is JobState.RUNNING and j.id not in ctl.attempt_start:
            ctl.attempt_started(j)  # (converted once and recorded: on the event loop)
    return ends_of(ends_input(ctl, dict(ctl.attempt_start)), jobs, now)


@dataclass(frozen=True, slots=True)
class EndsInput:
    """What `ends_of` reads, taken on the event loop (`ends_input`), so that the round's thread can predict the ends
    while runs report progress and jobs end on the loop (issue 33: ~0.6 ms of the loop a poll at 512 running jobs)."""

    state: ControllerState
    """The controller's state, for its cache of predictions (`ends`: only rounds use it, one at a time)."""
    starts: Mapping[int, float]
    """The attempts' starts (a copy), every running job's there."""
    progress: Mapping[tuple[int, int], tuple[tuple[float, float] | None, tuple[float, float] | None, float | None]]
    """(job id, attempt) -> its progress's (first, last, total), as reported so far."""
    histories: Mapping[str, tuple[int, int, tuple[tuple[str, float], ...]]]
    """Kind -> (the id and length of its history's list, as the cache's key; its entries then)."""


def ends_input(ctl: Controller, starts: Mapping[int, float]) -> EndsInput:
    """`ends_of`'s input, now (on the event loop; `starts`: a copy of the attempts' starts, every running job's
    there). Each kind's history is copied (a list of at most 200: a copy is ~1 us)."""
    lr = learning(ctl)
    return EndsInput(ctl.state, starts, {k: (rp.first, rp.last, rp.total) for k, rp in lr.runs.items()},
                     {k: (id(h), len(h), tuple(h)) for k, h in lr.history.items()})


def ends_of(inp: EndsInput, jobs: Iterable[Job], now: float) -> dict[int, float]:
    """`predicted_ends` from what `ends_input` took (pure but for the cache in `inp.state`, which it updates in
    place: in any thread, one call at a time, as rounds and forecasts run: in the round's thread)."""
    from hsched.learn.predict import remaining
    from hsched.model import JobState

    last = inp.state.ends
    kept: dict[int, End] = {}
    out: dict[int, float] = {}
    runs, histories, starts = inp.progress, inp.histories, inp.starts
    none = (id(None), -1, ())
    by_user: dict[tuple[str, str], float | None] = {}
    running = JobState.RUNNING
    for j in jobs:
        if j.state is not running:
            continue
        started = starts[j.id]
        rp = runs.get((j.id, j.restarts + 1))
        hit = last.get(j.id)
        kind = hit.kind if hit is not None and hit.job is j else job_kind(j)
        hid, hlen, history = histories.get(kind, none)
        first, reported, total = rp if rp is not None else (None, None, None)
        key = (started, reported, total)
        if hit is None or hit.job is not j or hit.key != key:
            by_progress = None
            speed = run_speed(first, reported) if first and reported else None
            if rp is not None and reported is not None and total is not None and speed:
                left = remaining(0.0, None, reported[1], total, speed)
                by_progress = now + left if left is not None else None
            hit = End(j, kind, key, by_progress, None, None)
        if hit.history != (hid, hlen):
            # the kind's history changed (a job of the kind ended): only the figure from history is made again, in
            # place (a new End per running job of the kind was ~1 ms a churning round at 512, issue 33), and one
            # figure per (kind, user) a call: recomputing it for each job took 25 ms a round
            expected: float | None = None
            if history:
                memo = (kind, j.user)
                if memo in by_user:
                    expected = by_user[memo]
                else:
                    expected = by_user[memo] = expected_of(history, j.user)
            hit.by_history = started + expected if expected is not None and started is not None else None
            hit.history = (hid, hlen)
        kept[j.id] = hit
        end = hit.by_progress
        if end is None and hit.by_history is not None:
            if hit.by_history >= now:
                end = hit.by_history
            elif started is not None and now - hit.by_history <= OVERRUN_SHARE * (hit.by_history - started):
                # a little past its expected duration (runs of a kind vary): it ends any moment now. Its time limit
                # instead (below) moved the reservation of the job waiting for its GPUs far out, let other jobs
                # backfill there, and the waiting job started well after its predicted start (issue 29, item 5:
                # with run lengths 5% off their kind's, a third of the predicted starts were then more than 10% off)
                end = now + SOON_S
            # (further past it, history no longer tells: as predict.remaining)
        limit = j.spec.time_limit_s
        if limit is not None and started is not None:
            end = started + limit if end is None else min(end, started + limit)
        if end is not None:
            out[j.id] = end
    inp.state.ends = kept
    return out
