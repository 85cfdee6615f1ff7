"""Elastic jobs, live (issue 31): what the round needs to resize them, and what the controller does with a `Resize`.

The round's elastic stage (hsched.sched.stages.elastic) decides; a `Resize` is carried out by the moves' own
checkpoint-and-restart path (hsched.controller.moves): the job's stop is recorded (event `grow` or `shrink`, with the
reason, the sizes, the throughput at each (measured, or the stated prior) and the gain), the new devices are held for
it while it stops (`Moves.held`: nobody else is given them), it is stopped with its checkpoint signal, grace and
escalation, and when it is requeued the round starts it there first (hsched.sched.pipeline.held_starts), with the new
size in its environment (hsched.controller.launching.job_env: `HSCHED_GPUS`, `WORLD_SIZE`, `CUDA_VISIBLE_DEVICES`,
torchrun's `PET_*`). Only jobs that proved they checkpoint (as moves require) or resize in place (`--resize-signal`:
see `in_place`) are resized (`round_fields`: `FleetView.resize_cost`).

Throughput per size: the job's kind's learned speeds (hsched.controller.learning, per kind, GPU type and GPU count, from
the jobs' progress reports) at each GPU count, on the GPU type the job runs on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
from collections.abc import Iterable

from hsched.controller import learning, moves
from hsched.controller.checkpoints import is_shared
from hsched.controller.core import Controller
from hsched.controller.metrics import recorder
from hsched.controller.moves import HOLD_MARGIN_S, moves_of
from hsched.controller.stopping import begin_stop, send
from hsched.errors import ExecutorError
from hsched.lifecycle import StopReason
from hsched.model import Job, JobState
from hsched.sched.stages.elastic import IN_PLACE_COST_S, Resize

log = logging.getLogger("hsched.resizing")


RESIZE_FILE = "resize.json"
"""In the job's checkpoint folder (`$HSCHED_RESIZE_FILE`): an in-place resize's new devices, for the job to read on its
resize signal."""


async def round_fields(ctl: Controller, active: Iterable[Job], pending: Iterable[Job] = ()
                       ) -> tuple[dict[int, dict[int, float]], dict[int, float]]:
    """The round's (scaling of the running ones, resize costs) of the elastic jobs it may resize: those that proved
    they checkpoint (a restart loses nothing; the cost is a move's, measured) and those that resize in place; none
    with `moves = false`. Waiting ones are among the costs too: only such a job starts bigger than its MIN (it can
    give the GPUs back). Call with ctl.lock held."""
    if not ctl.settings.moves:
        return {}, {}
    # (`gpus_max`/`nodes_max` first: the cheapest test, over a queue of thousands)
    elastic = [j for js in (active, pending) for j in js
               if (j.spec.resources.gpus_max is not None or j.spec.resources.nodes_max is not None)
               and j.spec.resources.elastic and j.state in (JobState.RUNNING, JobState.PENDING)]
    if not elastic:
        return {}, {}
    if any(j.spec.resize_signal is None for j in elastic):
        done = await moves.proven(ctl)
    else:
        done = set()
    costs = {j.id: IN_PLACE_COST_S if j.spec.resize_signal is not None else moves.cost_of(ctl, j.id)
             for j in elastic if j.spec.resize_signal is not None or j.id in done}
    running = [j for j in elastic if j.id in costs and j.state is JobState.RUNNING]
    return scaling(ctl, running), costs


def scaling(ctl: Controller, elastic: Iterable[Job]) -> dict[int, dict[int, float]]:
    """Job id -> {GPU count: steps/s} its kind measured on its GPU type (the placement class with the most runs at
    each count); every job given is a key, measured or not."""
    elastic = list(elastic)
    if not elastic:
        return {}
    rates = learning.current_rates(ctl)
    out: dict[int, dict[int, float]] = {}
    for job in elastic:
        key = learning.rate_key(ctl, job)
        best: dict[int, tuple[int, float]] = {}
        if key is not None:
            kind, gpu_type = key[0], key[1]
            for r in rates:
                if r.kind == kind and r.gpu_type == gpu_type and r.runs >= best.get(r.gpus, (0, 0.0))[0]:
                    best[r.gpus] = (r.runs, r.steps_per_s)
        out[job.id] = {n: v for n, (_runs, v) in best.items()}
    return out


def _num(x: float) -> float | None:
    return None if math.isinf(x) or math.isnan(x) else round(x, 3)


def may_grow(ctl: Controller, active: Iterable[Job], now: float) -> bool:
    """Whether a round with nothing waiting could grow a job that resizes in place (a job that proved it checkpoints
    is `moves.may_move`'s): one runs below its MAX, has run `move_min_run_s`, and some device is free."""
    jobs = [j for j in active]
    grow = [j for j in jobs if j.spec.resize_signal is not None and j.state is JobState.RUNNING
            and j.spec.resources.gpus_max and any(len(p.devices) < j.spec.resources.gpus_max for p in j.placement)
            and now - ctl.attempt_started(j) >= ctl.settings.move_min_run_s]
    if not grow or not ctl.settings.moves:
        return False
    busy = {u for j in jobs for p in j.placement for u in p.devices}
    return any(d.uuid not in busy and d.uuid not in ctl.nodes[p.node].foreign
               for j in grow for p in j.placement if p.node in ctl.nodes for d in ctl.nodes[p.node].node.devices)


async def apply(ctl: Controller, job: Job, d: Resize) -> None:
    """Resize a running elastic job: record why (event `grow`/`shrink`), hold its new devices, stop it as a
    preemption (its checkpoint signal, grace, escalation); it starts again on them. A job that resizes in place
    (`--resize-signal`) is not stopped: see `in_place`. Call with ctl.lock held."""
    now = ctl.clock.time()
    kind = "grow" if d.grow else "shrink"
    data = _data(d)
    speed = (f"; {d.rate_now / d.rate_was:.2f}x the steps/s ({'measured' if d.measured else 'prior'})"
             if d.rate_was > 0 and not d.grow else "")  # (a grow's reason says its speedup already)
    recorder(ctl).moves += 1
    log.info("job %d: %s", job.id, d.why)
    if job.spec.resize_signal is not None:
        await in_place(ctl, job, d, kind, d.why + speed, data)
        return
    ck = job.spec.checkpoint_signal
    until = ctl.timeline.now() + ck.grace_s + ctl.settings.kill_after_s + HOLD_MARGIN_S
    moves_of(ctl).held[job.id] = (d.placements, until)
    await ctl.db(ctl.store.add_event, now, kind, d.why + speed, job_id=job.id, data=data)
    await begin_stop(ctl, job, StopReason.PREEMPTED,
                     f"resizing {d.was} -> {d.size} {d.unit}: SIG{ck.signal}, {ck.grace_s:g} s to checkpoint")


async def in_place(ctl: Controller, job: Job, d: Resize, kind: str, why: str, data: dict[str, object]) -> None:
    """Resize a job that resizes in place: its placement (and its runs' devices) become the new ones with the event,
    durably; its new devices go to `$HSCHED_RESIZE_FILE` (written, fsynced and renamed into its checkpoint folder, on
    its node too where that folder is not shared); then it gets its resize signal, every process of the run. A shrink's
    GPUs are given to others from the next round: the job lets go of those its file no longer names on the signal."""
    now = ctl.clock.time()
    attempt = job.restarts + 1
    await ctl.db(ctl.store.resize_in_place, job.id, d.placements, now, (kind, why + "; in place"),
                 {**data, "in_place": True})
    body = {"job_id": job.id, "run": attempt, "seq": int(now * 1000), "gpus": d.size, "was": d.was,
            "world_size": sum(len(p.devices) for p in d.placements),
            "devices": {p.node: list(p.devices) for p in d.placements},
            "cuda_visible_devices": ",".join(u for p in d.placements for u in p.devices)}
    await _write_resize_file(ctl, job, d, body)
    # the speed this attempt measured so far was at the old size: its figure starts again at the new one
    learning.learning(ctl).runs.pop((job.id, attempt), None)
    sig = job.spec.resize_signal or "USR2"
    sent = await send(ctl, job.id, sig, all_processes=True, batch_only=False, purpose="resize")
    await ctl.db(ctl.store.add_event, now, "signal",
                 f"SIG{sig} sent to every process of the run: resize to {d.size} GPUs" if sent
                 else f"SIG{sig} for the resize could not be sent", job_id=job.id)


async def _write_resize_file(ctl: Controller, job: Job, d: Resize, body: dict[str, object]) -> None:
    local = ctl.checkpoint_dir(job.id)

    def write() -> None:
        local.mkdir(parents=True, exist_ok=True)
        tmp = local / (RESIZE_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump(body, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, local / RESIZE_FILE)

    await asyncio.to_thread(write)
    for p in d.placements:
        rt = ctl.nodes.get(p.node)
        if rt is None or is_shared(rt, local):
            continue
        try:
            remote = await rt.executor.remote_path(str(local))
            await rt.executor.put(local, remote, user=job.user if ctl.home.lab else None)
        except (ExecutorError, OSError) as e:
            log.warning("job %d: cannot write its resize file on %s: %s", job.id, p.node, e)


def _data(d: Resize) -> dict[str, object]:
    return {**({"unit": d.unit} if d.unit != "GPUs" else {}),
            "from": d.was, "to": d.size, "steps_per_s_from": _num(d.rate_was), "steps_per_s_to": _num(d.rate_now),
            "speedup": _num(d.rate_now / d.rate_was) if d.rate_was > 0 else None,
            "scaling": "measured" if d.measured else "prior", "gain_s": _num(d.gain_s), "cost_s": _num(d.cost_s),
            "for_jobs": list(d.for_jobs), "nodes": [p.node for p in d.placements],
            "devices": [u for p in d.placements for u in p.devices],
            "cpus": [c for p in d.placements for c in p.cpus]}
