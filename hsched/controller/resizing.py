"""Elastic jobs, live (issue 31): what the round needs to resize them, and what the controller does with a `Resize`.

The round's elastic stage (hsched.sched.stages.elastic) decides; a `Resize` is carried out by the moves' own
checkpoint-and-restart path (hsched.controller.moves): the job's stop is recorded (event `grow` or `shrink`, with the
reason, the sizes, the throughput at each (measured, or the stated prior) and the gain), the new devices are held for
it while it stops (`Moves.held`: nobody else is given them), it is stopped with its checkpoint signal, grace and
escalation, and when it is requeued the round starts it there first (hsched.sched.pipeline.held_starts), with the new
size in its environment (hsched.controller.launching.job_env: `HSCHED_GPUS`, `WORLD_SIZE`, `CUDA_VISIBLE_DEVICES`,
torchrun's `PET_*`). Only jobs that proved they checkpoint (`FleetView.movable`, as moves) are resized.

Throughput per size: the job's kind's learned speeds (hsched.controller.learning, per kind, GPU type and GPU count, from
the jobs' progress reports) at each GPU count, on the GPU type the job runs on.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping

from hsched.controller import learning
from hsched.controller.core import Controller
from hsched.controller.metrics import recorder
from hsched.controller.moves import HOLD_MARGIN_S, moves_of
from hsched.controller.stopping import begin_stop
from hsched.lifecycle import StopReason
from hsched.model import Job, JobState
from hsched.sched.stages.elastic import Resize

log = logging.getLogger("hsched.resizing")


def scaling(ctl: Controller, active: Iterable[Job], movable: Mapping[int, float]) -> dict[int, dict[int, float]]:
    """Running elastic job id -> {GPU count: steps/s} its kind measured on its GPU type (the placement class with the
    most runs at each count); every running elastic job that may be resized is a key, measured or not."""
    elastic = [j for j in active if j.id in movable and j.state is JobState.RUNNING and j.spec.resources.elastic]
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


async def apply(ctl: Controller, job: Job, d: Resize) -> None:
    """Resize a running elastic job: record why (event `grow`/`shrink`), hold its new devices, stop it as a
    preemption (its checkpoint signal, grace, escalation); it starts again on them. Call with ctl.lock held."""
    now = ctl.clock.time()
    ck = job.spec.checkpoint_signal
    until = ctl.timeline.now() + ck.grace_s + ctl.settings.kill_after_s + HOLD_MARGIN_S
    moves_of(ctl).held[job.id] = (d.placements, until)
    kind = "grow" if d.grow else "shrink"
    data = {"from": d.was, "to": d.size, "steps_per_s_from": _num(d.rate_was), "steps_per_s_to": _num(d.rate_now),
            "speedup": _num(d.rate_now / d.rate_was) if d.rate_was > 0 else None,
            "scaling": "measured" if d.measured else "prior", "gain_s": _num(d.gain_s), "cost_s": _num(d.cost_s),
            "for_jobs": list(d.for_jobs), "nodes": [p.node for p in d.placements],
            "devices": [u for p in d.placements for u in p.devices],
            "cpus": [c for p in d.placements for c in p.cpus]}
    speed = (f"; {d.rate_now / d.rate_was:.2f}x the steps/s ({'measured' if d.measured else 'prior'})"
             if d.rate_was > 0 and not d.grow else "")  # (a grow's reason says its speedup already)
    await ctl.db(ctl.store.add_event, now, kind, d.why + speed, job_id=job.id, data=data)
    recorder(ctl).moves += 1
    log.info("job %d: %s", job.id, d.why)
    await begin_stop(ctl, job, StopReason.PREEMPTED,
                     f"resizing {d.was} -> {d.size} GPUs: SIG{ck.signal}, {ck.grace_s:g} s to checkpoint")
