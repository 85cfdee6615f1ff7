"""Issue 27, point 7 / "What a user may see": a line of a job's log (its own output, a 0600 file of its user)
is never shown to another lab member. The `gpu_oom` path quotes the log line that says a GPU ran out of
memory; before the fix it was written into the events' messages, which `hsched events` and `hsched show`
give to everyone. Now the owner, admins and root see it; any other member sees the event without it.

In-process lab controller on a fake clock (hsched.testing.Lab; run with asyncio.run, so that this folder needs
no conftest of its own), peers as SO_PEERCRED would give them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from hsched.config import Settings
from hsched.controller.api import Api
from hsched.testing import CannedNode, Lab

LAB1, LAB2, ADMIN = 50001, 50002, 50003
SECRET = "sk-live-4f1d2c9e"
LINE = (f"torch.OutOfMemoryError: CUDA out of memory while loading /home/lab1/private/{SECRET}.ckpt. "
        "Tried to allocate 2.00 GiB.")
FLEET = (CannedNode("small", "NVIDIA A100-SXM4-40GB", 1), CannedNode("big", "NVIDIA A100-SXM4-80GB", 1))


def api_for(lab: Lab) -> Api:
    api = Api(lab.ctl)
    api._users.update({LAB1: "lab1", LAB2: "lab2", ADMIN: "labadmin"})
    return api


async def views(api: Api, job_id: int, uid: int) -> tuple[str, str]:
    """What `uid` gets from `hsched show <job>` and from `hsched events`, as text."""
    shown = await api.handle("show", {"id": job_id}, uid)
    events = await api.handle("events", {"limit": 10_000}, uid)
    return json.dumps(shown), json.dumps(events)


async def submit(api: Api, uid: int, **resources: Any) -> int:
    spec = {"command": ["python3", "train.py"], "retries": 1, "resources": {"gpus": 1, **resources}}
    return int((await api.handle("submit", {"spec": spec}, uid))["id"])


def test_a_gpu_oom_log_line_is_shown_to_its_owner_and_admins_only(tmp_path: Path) -> None:
    asyncio.run(_owner_and_admins_only(tmp_path))


async def _owner_and_admins_only(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=FLEET, lab_mode=True, settings=Settings(admins=("labadmin",))) as lab:
        api = api_for(lab)
        # one job on one GPU (its end, retried on a bigger GPU) and a gang of two ranks (one rank's end stops
        # the other): every event of the gpu_oom path
        single = await submit(api, LAB1)
        await lab.round()
        (run,) = await lab.runs(single)
        lab.executors[run.node].finish(run.run_dir, 1, gpu_oom=LINE)
        await lab.round()
        gang = await submit(api, LAB1, nodes=2)
        await lab.round()
        lab.clock.advance(120.0)
        await lab.round()
        runs = [r for r in await lab.runs(gang) if r.state.is_live()]
        assert len(runs) == 2, runs
        lab.executors[runs[1].node].finish(runs[1].run_dir, 1, gpu_oom=LINE)
        await lab.round()
        kinds = {e["kind"] for job in (single, gang) for e in await lab.ctl.db(lab.ctl.store.events, job)}
        assert {"gpu_oom", "rank_ended"} <= kinds, kinds

        for job in (single, gang):
            shown, events = await views(api, job, LAB2)
            assert SECRET not in shown and SECRET not in events
            assert "out of GPU memory" in shown  # the event is there, without the line
            for uid in (LAB1, ADMIN, 0):
                shown, events = await views(api, job, uid)
                assert LINE in shown and LINE in events, uid


def test_events_written_before_the_rule_are_cut_for_others(tmp_path: Path) -> None:
    """A store written by an earlier version has the line in the messages themselves (events are
    append-only, never rewritten): other members get them without it."""
    asyncio.run(_legacy(tmp_path))


async def _legacy(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=FLEET, lab_mode=True, settings=Settings(admins=("labadmin",))) as lab:
        api = api_for(lab)
        job = await submit(api, LAB1)
        now = lab.clock.time()
        old = [("rank_ended", f"run rank 1 exited with code 1 (out of GPU memory: {LINE})"),
               ("stopping", f"rank 1 exited with code 1 (out of GPU memory: {LINE}): stopping the other 1 rank(s)"),
               ("failed", f"out of GPU memory (exit code 1); no retries left (1 used); its log: {LINE}")]
        for kind, message in old:
            await lab.ctl.db(lab.ctl.store.add_event, now, kind, message, job_id=job)
        shown, events = await views(api, job, LAB2)
        assert SECRET not in shown and SECRET not in events
        assert "stopping the other 1 rank(s)" in shown and "no retries left (1 used)" in events
        shown, events = await views(api, job, LAB1)
        assert shown.count(SECRET) == 3 and events.count(SECRET) == 3
