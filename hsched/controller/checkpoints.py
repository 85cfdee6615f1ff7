"""Where a job's checkpoint folder lives, and moving it to the node its next run lands on.

Every job has one checkpoint folder, `$HSCHED_HOME/checkpoints/<id>` on the controller, which is the folder
itself for this machine's nodes (they share the disk). A remote node gets a mirror under its own hsched
folder, unless the fleet file declares the path shared there (`shared_paths`). When a run starts on a
node other than the one that ran the job last, the folder is brought along through the controller
(the executors' get, then put); bytes and seconds go into the job's events. Every copy is data only, made
for the job's user (hsched/node/safefiles.py): a checkpoint folder carries no setuid program, link, FIFO or
device to the next node, what lands there is the user's from its first byte, and nothing the user put in
the folder is opened on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from pathlib import Path

from hsched.controller.core import Controller
from hsched.controller.fleet import NodeRuntime
from hsched.errors import ExecutorError
from hsched.model import Job, Run

log = logging.getLogger("hsched.checkpoints")


def is_shared(rt: NodeRuntime, path: Path) -> bool:
    """Whether the node sees the controller's file `path` as it is: this machine's nodes do (but through a
    service account's installed helper, which keeps its own folders), others where the fleet file says so."""
    if rt.config.executor == "local" and rt.executor.home_shared:
        return True
    return _declared(rt, path)


def sees(rt: NodeRuntime, path: Path) -> bool:
    """Whether a user's file `path` (their working folder) is there on the node: this machine's disk, or a
    path the fleet file declares shared."""
    return rt.config.executor == "local" or _declared(rt, path)


def _declared(rt: NodeRuntime, path: Path) -> bool:
    return any(str(path) == p or str(path).startswith(p.rstrip("/") + "/") for p in rt.config.shared_paths)


async def path_on(ctl: Controller, rt: NodeRuntime, job_id: int) -> str:
    """The job's checkpoint folder as the node `rt` sees it."""
    local = ctl.checkpoint_dir(job_id)
    if is_shared(rt, local):
        return str(local)
    return str(await rt.executor.remote_path(str(local)))


def _size(path: Path) -> int:
    """The bytes of the regular files under `path` (a link is not followed: it may lead anywhere as root)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                st = (Path(root) / f).lstat()
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


async def bring_along(ctl: Controller, job: Job, run: Run) -> None:
    """Before `run` starts: if the job last ran on another node, move its checkpoint to this one."""
    target = ctl.nodes.get(run.node)
    if target is None or job.restarts == 0:
        return
    key = (job.id, run.attempt, run.node)
    if key in ctl.moved:
        return
    ctl.moved.add(key)
    previous = [r for r in await ctl.db(ctl.store.runs, job.id) if r.attempt < run.attempt]
    if not previous:
        return
    source_name = previous[-1].node
    source = ctl.nodes.get(source_name)
    local = ctl.checkpoint_dir(job.id)
    if source is None or source_name == run.node:
        return
    if is_shared(source, local) and is_shared(target, local):
        return  # one folder both nodes see
    user = job.user if ctl.home.lab else None  # personal mode: the controller's own files, as launches are
    t0 = ctl.clock.monotonic()
    try:
        if not is_shared(source, local):
            remote = await source.executor.remote_path(str(local))
            await source.executor.get(remote, local, user=user)
        if not is_shared(target, local):
            remote = await target.executor.remote_path(str(local))
            await asyncio.to_thread(local.mkdir, parents=True, exist_ok=True)
            await target.executor.put(local, remote, user=user)
    except (ExecutorError, OSError) as e:
        await ctl.event("checkpoint",
                     f"could not move the checkpoint from {source_name} to {run.node}: {e}; "
                     "the run starts with what is there", job_id=job.id, node=run.node)
        return
    seconds = ctl.clock.monotonic() - t0
    size = await asyncio.to_thread(_size, local)
    await ctl.event("checkpoint_moved",
                 f"checkpoint moved {source_name} -> {run.node}: {size} bytes in {seconds:.2f} s",
                 job_id=job.id, node=run.node, data={"bytes": size, "seconds": seconds, "from": source_name})
