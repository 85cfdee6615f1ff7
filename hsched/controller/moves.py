"""The simulator's policy, live (issue 14, item 5): which running jobs the round may move or time-share, what a
move costs each of them, and what the controller does with a `Move`.

A job may be stopped by the policy (moved to faster free GPUs, or time-shared away for a job of its QoS class that
has had less service) only once it has *proved* it checkpoints: a run of it exited with the checkpoint exit code,
when preempted or on its own (hsched.lifecycle: a job that saves and exits 85 resumes where it was). A job that has
not, whatever signal it declares, is never moved: it could lose its work. The settings say whether the policy may
(`moves`) and after how long an attempt may be stopped (`move_min_run_s`: the live quantum).

What a move costs a job is measured: the time from a preemption's decision to its GPUs free (the stop, in the
`preempted` event's data), plus the time from its restart to its first progress report (the restore, from
hsched.controller.learning); a part not measured yet counts half of the settings' `move_cost_s`. The policy
moves a job only when its predicted remaining time times the speed it stops wasting is worth twice that
(hsched.sched.policies.hsched.Hsched.move_gain).

A move is a preemption with a destination: the job's stop is recorded (event `move`, with where from and to, the
expected gain and the cost; `hsched show` lists them), the new devices are held for it while it stops (nobody else
is given them: `FleetView.held`), and when it is requeued the round starts it there first.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from hsched.controller.metrics import recorder
from hsched.controller.state import Moves
from hsched.lifecycle import StopReason
from hsched.model import Job, JobState, Placement

if TYPE_CHECKING:
    from hsched.controller.core import Controller
    from hsched.sched.live import Move

log = logging.getLogger("hsched.moves")

HOLD_MARGIN_S = 120.0
"""How long past a moving job's grace (and SIGKILL's delay) its new devices stay held for it: a stop that takes
longer than that (a node that does not answer) gives them back to everyone."""


def moves_of(ctl: Controller) -> Moves:
    return ctl.state.moves


async def _proven(ctl: Controller) -> set[int]:
    mv = moves_of(ctl)
    if mv.proven is None:
        found = await ctl.db(ctl.store.checkpointers, ctl.settings.checkpoint_exit_code)
        mv.proven = set(found)
        mv.stop_s.update({i: s for i, s in found.items() if s is not None})
    return mv.proven


async def proven(ctl: Controller) -> set[int]:
    """The jobs that proved they checkpoint (read from the store once, then kept up to date)."""
    return await _proven(ctl)


def cost_of(ctl: Controller, job_id: int) -> float:
    """What a checkpoint and restart costs the job: its measured stop and restore, half the settings' `move_cost_s`
    for each part not measured yet."""
    mv, half = moves_of(ctl), ctl.settings.move_cost_s / 2
    return mv.stop_s.get(job_id, half) + mv.restore_s.get(job_id, half)


async def round_fields(ctl: Controller, active: Iterable[Job], pending: Iterable[Job], now: float,
                       requeued: Mapping[int, Job]
                       ) -> tuple[dict[int, float], dict[int, tuple[Placement, ...]], dict[int, float]]:
    """The round's (movable running jobs and their costs, devices held for moving jobs, attained service of
    requeued jobs). `now`: on the controller's timeline (Controller.timeline); `requeued`: those of `active` and
    `pending` that ran before, by id (the job cache keeps them, `Jobs.requeued`: looking through 2,500 jobs for them
    was ~0.2 ms of the event loop a poll, issue 33; only they, and the few held for, are looked at twice). Call with
    ctl.lock held (reads the store when a requeued job is new to it)."""
    mv = moves_of(ctl)
    active = list(active)
    if not mv.held_read:
        await _read_held(ctl, active, pending)
    if mv.held:
        # the held devices of jobs no longer stopping or waiting (started, cancelled) or past their time go back
        stopping = {j.id for j in active if j.state is JobState.PREEMPTING} | {j.id for j in pending}
        for jid, (_ps, until) in list(mv.held.items()):
            if jid not in stopping or until < now:
                del mv.held[jid]
    held = {jid: ps for jid, (ps, _until) in mv.held.items()}
    # attained service of requeued jobs, read once per attempt
    todo = [jid for jid, j in requeued.items() if mv.attained.get(jid, (-1, 0.0))[0] != j.restarts]
    if todo:
        got = await ctl.db(ctl.store.attained, todo)
        for jid in todo:
            mv.attained[jid] = (requeued[jid].restarts, got.get(jid, 0.0))
    if len(mv.attained) > len(requeued):
        for jid in [i for i in mv.attained if i not in requeued]:
            del mv.attained[jid]  # (ended jobs do not pile up)
    attained = {jid: s for jid, (_r, s) in mv.attained.items()}
    movable: dict[int, float] = {}
    if ctl.settings.moves and ctl.settings.policy:
        proven = await _proven(ctl)
        movable = {j.id: cost_of(ctl, j.id) for j in active
                   if j.id in proven and j.state is JobState.RUNNING and len(j.placement) == 1}
    return movable, held, attained


async def _read_held(ctl: Controller, active: Sequence[Job], pending: Iterable[Job]) -> None:
    """After a restart: the devices a previous controller's moves promised jobs still stopping or waiting to start
    again, from their `move` events (the holds were in its memory only), while their time has not run out; a job that
    restarted since its move is no longer held for."""
    mv = moves_of(ctl)
    mv.held_read = True
    stopping = [j for j in active if j.state is JobState.PREEMPTING] + [j for j in pending if j.restarts]
    if not stopping:
        return
    found = await ctl.db(ctl.store.last_events, "move", [j.id for j in stopping])
    for kind in ("grow", "shrink"):
        # an elastic job's resize holds its new devices as a move does (hsched.controller.resizing): the latest counts
        for jid, last in (await ctl.db(ctl.store.last_events, kind, [j.id for j in stopping])).items():
            if jid not in found or last[0] > found[jid][0]:
                found[jid] = last
    for job in stopping:
        got = found.get(job.id)
        if got is None or job.id in mv.held:
            continue
        at, data = got
        if any(r.start_time is not None and r.start_time > at for r in await ctl.db(ctl.store.runs, job.id)):
            continue  # started again after the move: nothing is held for it any more
        ck = job.spec.checkpoint_signal
        # (the recorded move, converted once onto the controller's timeline, as the round compares it)
        until = ctl.timeline.since(at) + ck.grace_s + ctl.settings.kill_after_s + HOLD_MARGIN_S
        nodes, devices = data.get("nodes") or [], data.get("devices") or []
        if len(nodes) != 1 or not devices or until < ctl.timeline.now():
            continue
        cpus = tuple(int(c) for c in data.get("cpus") or ())
        mv.held[job.id] = ((Placement(str(nodes[0]), tuple(map(str, devices)), cpus=cpus),), until)


async def may_move(ctl: Controller, active: Iterable[Job], now: float) -> bool:
    """Whether a round with nothing waiting could still move a job: a job that proved it checkpoints has run its
    `move_min_run_s` and some device of the fleet is free (else such a round would only cost its time). `now`: on the
    controller's timeline."""
    if not (ctl.settings.moves and ctl.settings.policy):
        return False
    proven = await _proven(ctl)
    if not proven:
        return False
    active = list(active)
    old_enough = any(j.id in proven and j.state is JobState.RUNNING
                     and now - ctl.attempt_started(j) >= ctl.settings.move_min_run_s
                     for j in active)
    if not old_enough:
        return False
    busy = {u for j in active for p in j.placement for u in p.devices}
    busy.update(u for ps, _until in moves_of(ctl).held.values() for p in ps for u in p.devices)
    return any(d.uuid not in busy and d.uuid not in rt.foreign for rt in ctl.nodes.values() for d in rt.node.devices)


def note_ended(ctl: Controller, job: Job, exit_codes: Iterable[int | None], data: Mapping[str, object]) -> None:
    """An attempt ended: a checkpoint exit (asked or not) proves the job checkpoints; a preemption's time to free
    its GPUs is its stop's measured cost."""
    mv = moves_of(ctl)
    if ctl.settings.checkpoint_exit_code in exit_codes:
        if mv.proven is not None:
            mv.proven.add(job.id)
        free = data.get("time_to_free_s")
        if isinstance(free, int | float):
            mv.stop_s[job.id] = max(float(free), mv.stop_s.get(job.id, 0.0))


def note_restored(ctl: Controller, job_id: int, attempt: int, seconds: float) -> None:
    """A restarted attempt's first progress report came `seconds` after its start: its restore's measured cost."""
    if attempt > 1 and seconds >= 0:
        moves_of(ctl).restore_s[job_id] = seconds


def forget(ctl: Controller, job_id: int) -> None:
    """The job ended for good."""
    mv = moves_of(ctl)
    if mv.proven is not None:
        mv.proven.discard(job_id)
    for d in (mv.stop_s, mv.restore_s, mv.held, mv.attained):
        d.pop(job_id, None)


def hold_for(ctl: Controller, job_id: int, placements: tuple[Placement, ...], victims: Iterable[Job]) -> None:
    """A time-sharing stop's devices, held for the waiting job it makes room for while the victims stop (as a move's:
    the round starts it there first, `hsched.sched.pipeline.held_starts`, and gives them to nobody else)."""
    grace = max((v.spec.checkpoint_signal.grace_s for v in victims), default=0.0)
    moves_of(ctl).held[job_id] = (placements, ctl.timeline.now() + grace + ctl.settings.kill_after_s + HOLD_MARGIN_S)


async def apply(ctl: Controller, job: Job, d: Move) -> None:
    """Move a running job: record why (event `move`), hold its new devices, and stop it as a preemption (its
    checkpoint signal, grace, escalation). Call with ctl.lock held."""
    from hsched.controller.stopping import begin_stop

    now = ctl.clock.time()
    ck = job.spec.checkpoint_signal
    hold_for(ctl, job.id, d.placements, [job])  # (the mover holds its own new devices while it stops)
    data = {"from": d.from_type, "to": d.to_type, "gain_s": None if d.gain_s == float("inf") else round(d.gain_s, 1),
            "cost_s": round(d.cost_s, 1), "nodes": [p.node for p in d.placements],
            "devices": [u for p in d.placements for u in p.devices],
            # (a restarted controller holds them again from this event: hsched.controller.moves._read_held)
            "cpus": [c for p in d.placements for c in p.cpus]}
    await ctl.db(ctl.store.add_event, now, "move", d.why, job_id=job.id, data=data)
    recorder(ctl).moves += 1
    log.info("job %d: %s", job.id, d.why)
    await begin_stop(ctl, job, StopReason.PREEMPTED,
                     f"moving to faster GPUs: SIG{ck.signal}, {ck.grace_s:g} s to checkpoint")
