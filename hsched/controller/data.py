"""Datasets live: where each one is, copies to the node a job runs on (before it starts, or ahead of time), their
progress, eviction under a node's quota, and the figures placement reads (issue 15, items 1 and 2).

Where a dataset is: the fleet file's declaration (`[[dataset]] nodes/paths`: hsched.datasets), what `hsched data
scan` found at the declared paths, and the copies hsched made (under the node's `data_dir`). The last two are rows of
the store (`data_places`), so a restarted controller knows them, and resumes a copy it was making.

Copies go through the controller over the node helpers' channels (hsched.controller.datacopy): resumable, atomic
(a reader sees the old tree or the whole new one), throttled by settings `data_limit_mbps`. Each copy's speed is
folded into the pair's measured link speed (`link_speeds`), which the next round's placement reads (hsched.sched
`data_copy_s`): the modelled copy time it weighs against waiting for a node that holds the data.

Prefetch: after each round the pure `prefetch_targets` names the waiting jobs predicted to start soon on a node
that lacks their data (by the running jobs' predicted ends); a copy starts there at once, so the data is in place
when the job starts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from hsched.controller import datacopy
from hsched.controller.core import Controller
from hsched.controller.fleet import NodeRuntime
from hsched.controller.metrics import recorder
from hsched.controller.state import DataState, Transfer
from hsched.datasets import DataPlace, Dataset, PlaceOrigin, PlaceState, copy_path, env_name, show_bytes
from hsched.errors import ExecutorError, HelperError
from hsched.model import Job, JobState, NodeState, Run
from hsched.sched.live import Decision, Wait

log = logging.getLogger("hsched.data")

MIN_MEASURED_BYTES = 1 << 20
"""A copy shorter than this says more about round trips than about the link: not folded into its speed."""


class DataUnavailable(Exception):
    """A run cannot have its data on its node (no holder up, no space, over quota, a copy failed)."""


WAITING_FOR_A_HOLDER = "Data (waiting for "


def state(ctl: Controller) -> DataState:
    return ctl.state.data


async def load(ctl: Controller) -> DataState:
    """The store's places and link speeds, read once."""
    st = state(ctl)
    if not st.loaded and ctl.fleet_cfg.datasets:
        places = await ctl.db(ctl.store.data_places)
        st.places = {(p.dataset, p.node): p for p in places}
        st.links = await ctl.db(ctl.store.link_speeds)
        st.loaded = True
    return st


def datasets(ctl: Controller) -> dict[str, Dataset]:
    return {d.name: d for d in ctl.fleet_cfg.datasets}


def path_on(ctl: Controller, ds: Dataset, node: str) -> str | None:
    """Where `node` has the dataset ready (its declared path, or a scan's or copy's place), else None."""
    place = state(ctl).places.get((ds.name, node))
    if place is not None:
        return place.path if place.state is PlaceState.READY else None
    return ds.declared_path(node)


def size_of(ctl: Controller, ds: Dataset) -> int:
    """The dataset's size: the largest a scan or a copy measured, else the declared one (0: unknown)."""
    measured = [p.bytes for (name, _n), p in state(ctl).places.items()
                if name == ds.name and p.bytes and p.state is PlaceState.READY]
    return max(measured) if measured else (ds.size_bytes or 0)


def view_fields(ctl: Controller, now: float, pending: Iterable[Job]) -> dict[str, Any]:
    """What the round's FleetView needs of the data: holders, sizes, copies under way, link speeds, how long each
    waiting job has waited for a holder (`pending`: the jobs that may start; others are forgotten)."""
    st = state(ctl)
    if st.waiting_since:
        ids = {j.id for j in pending}
        st.waiting_since = {i: t for i, t in st.waiting_since.items() if i in ids}
    at: dict[str, frozenset[str]] = {}
    sizes: dict[str, int] = {}
    for ds in ctl.fleet_cfg.datasets:
        if ds.shared:
            continue  # every node sees it: placement ignores it
        at[ds.name] = frozenset(n for n in ctl.nodes if path_on(ctl, ds, n) is not None)
        sizes[ds.name] = size_of(ctl, ds)
    copying = {key: max(0, t.total - t.done) for key, t in st.transfers.items()}
    return {"data_at": at, "data_bytes": sizes, "data_copying": copying, "link_bps": dict(st.links),
            "default_bps": ctl.settings.data_link_mbps * 1e6 / 8,
            "data_waited": {i: max(0.0, now - t) for i, t in st.waiting_since.items()}}


def note_waits(ctl: Controller, decisions: Iterable[Decision], now: float) -> None:
    """After a round: when each job the round made wait for a holder first did so; a job that starts is forgotten."""
    since = state(ctl).waiting_since
    for d in decisions:
        if isinstance(d, Wait):
            if d.reason.startswith(WAITING_FOR_A_HOLDER):
                since.setdefault(d.job_id, now)
        elif d.job_id in since:
            del since[d.job_id]


def prefer(ctl: Controller, jobs: Iterable[Job]) -> dict[int, str]:
    """Job -> the node holding the most of its data (placement tries it first, as a checkpoint's home)."""
    out: dict[int, str] = {}
    known = {d.name: d for d in ctl.fleet_cfg.datasets if not d.shared}
    sizes = {name: size_of(ctl, ds) or 1 for name, ds in known.items()}  # (once, not per job and node)
    for job in jobs:
        best: tuple[int, str] | None = None
        for node in ctl.nodes:
            held = sum(sizes[name] for name in job.spec.data
                       if (ds := known.get(name)) is not None and path_on(ctl, ds, node) is not None)
            if held and (best is None or held > best[0]):
                best = (held, node)
        if best is not None:
            out[job.id] = best[1]
    return out


async def data_dir(ctl: Controller, rt: NodeRuntime) -> str:
    """Where copies go on the node: its `data_dir`, else a `data/<node>` folder of the controller's home as the node
    sees it (each node its own, even where several share this machine's disk)."""
    if rt.config.data_dir:
        return rt.config.data_dir
    # a service account's confined helper writes datasets only under ROOT/data (nodehelper.data_root says where)
    try:
        confined = (await rt.executor.data("root", {})).get("root")
    except HelperError:  # a node that keeps no datasets of its own (Slurm), or a helper from before datasets
        confined = None
    if confined:
        return f"{confined}/{rt.name}"
    return await rt.executor.remote_path(str(ctl.home.root / "data" / rt.name))


def _up(ctl: Controller, name: str) -> NodeRuntime | None:
    rt = ctl.nodes.get(name)
    return rt if rt is not None and rt.node.state is NodeState.UP else None


def _source(ctl: Controller, ds: Dataset, target: str) -> tuple[NodeRuntime, str] | None:
    """The up holder to copy from: the declared source first, then the fastest link to the target."""
    st = state(ctl)
    holders = [(n, p) for n in ctl.nodes if n != target and (p := path_on(ctl, ds, n)) is not None and _up(ctl, n)]
    if not holders:
        return None
    default = ctl.settings.data_link_mbps * 1e6 / 8
    holders.sort(key=lambda h: (h[0] != ds.source, -st.links.get((h[0], target), default)))
    name, path = holders[0]
    return ctl.nodes[name], path


async def ensure(ctl: Controller, job: Job, run: Run) -> dict[str, str]:
    """Before `run` starts: every dataset of the job on its node (waiting for a copy under way, or making one), and
    the environment that says where: HSCHED_DATA_<NAME>. DataUnavailable when one cannot be had."""
    if not job.spec.data:
        return {}
    await load(ctl)
    known = datasets(ctl)
    env: dict[str, str] = {}
    for name in job.spec.data:
        ds = known.get(name)
        if ds is None:
            raise DataUnavailable(f"dataset {name!r} is no longer in the fleet file")
        path = path_on(ctl, ds, run.node)
        if path is None:
            place = await copy(ctl, ds, run.node, job_id=job.id, why="start")
            path = place.path
        env[env_name(name)] = path
        await _used(ctl, ds, run.node)
    return env


async def _used(ctl: Controller, ds: Dataset, node: str) -> None:
    st = state(ctl)
    place = st.places.get((ds.name, node))
    if place is not None:
        place = replace(place, last_used=ctl.clock.time())
        st.places[(ds.name, node)] = place
        await ctl.db(ctl.store.set_data_place, place)


async def copy(ctl: Controller, ds: Dataset, node: str, *, job_id: int | None, why: str) -> DataPlace:
    """The dataset on `node`, by a copy: the one under way, else a new one. DataUnavailable if it fails."""
    st = await load(ctl)
    key = (ds.name, node)
    t = st.transfers.get(key)
    if t is None or t.task is None:
        t = start_copy(ctl, ds, node, job_id=job_id, why=why)
        if t is None:
            raise DataUnavailable(f"dataset {ds.name} is on no node that is up")
    assert t.task is not None
    place = await asyncio.shield(t.task)
    if place.state is not PlaceState.READY:
        raise DataUnavailable(place.message or f"the copy of {ds.name} to {node} failed")
    return place


def start_copy(ctl: Controller, ds: Dataset, node: str, *, job_id: int | None, why: str) -> Transfer | None:
    """Start copying the dataset to `node` in the background (None: no holder is up); one copy per (dataset, node)."""
    st = state(ctl)
    key = (ds.name, node)
    if key in st.transfers:
        return st.transfers[key]
    found = _source(ctl, ds, node)
    if found is None:
        return None
    src, src_path = found
    t = Transfer(ds.name, node, src.name, "", size_of(ctl, ds), started=ctl.clock.monotonic(), job_id=job_id,
                 why=why)
    st.transfers[key] = t
    t.task = ctl.spawn(_copy(ctl, ds, t, src, src_path))
    return t


async def _copy(ctl: Controller, ds: Dataset, t: Transfer, src: NodeRuntime, src_path: str) -> DataPlace:
    st = state(ctl)
    key = (ds.name, t.node)
    dst = ctl.nodes[t.node]
    now = ctl.clock.time
    place = DataPlace(ds.name, t.node, "", PlaceOrigin.COPY, PlaceState.FAILED, t.total or None, 0, src.name,
                      now(), None)
    try:
        try:
            t.path = copy_path(await data_dir(ctl, dst), ds.name)
            info = await datacopy.scan(src.executor, src_path)
            if not info.exists:
                raise DataUnavailable(f"{src.name} has no {ds.name} at {src_path} (hsched data scan updates "
                                      "where it is)")
            t.total = info.bytes
            await _make_room(ctl, ds, dst, info.bytes)
            place = replace(place, path=t.path, state=PlaceState.COPYING, bytes=info.bytes, updated=now())
            st.places[key] = place
            for_job = f" for job {t.job_id}" if t.job_id is not None else ""
            await ctl.db(ctl.store.set_data_place, place, job_id=t.job_id, event=(
                "data_copy", f"copying {ds.name} ({show_bytes(info.bytes)}) {src.name} -> {t.node}"
                             f"{' (prefetch)' if t.why == 'prefetch' else ''}{for_job}",
                {"dataset": ds.name, "from": src.name, "to": t.node, "bytes": info.bytes, "why": t.why}))
            limit = ctl.settings.data_limit_mbps * 1e6 / 8 or None

            async def progress(done: int, total: int) -> None:
                t.done, t.total = done, total

            t0 = ctl.clock.monotonic()
            result = await datacopy.copy_tree(src.executor, src_path, dst.executor, t.path, limit_bps=limit,
                                              progress=progress)
            seconds = ctl.clock.monotonic() - t0
        except Exception as e:
            # whatever went wrong, the copy fails as a copy: the run waiting for it is told, never left launching; an
            # unexpected error is logged whole
            if not isinstance(e, ExecutorError | OSError | DataUnavailable):
                log.exception("copy of %s to %s failed", ds.name, t.node)
            rec = recorder(ctl)
            rec.data_copies["failed"] = rec.data_copies.get("failed", 0) + 1
            place = replace(place, state=PlaceState.FAILED, updated=now(), message=str(e))
            st.places[key] = place
            await ctl.db(ctl.store.set_data_place, place, job_id=t.job_id, event=(
                "data_copy_failed", f"copy of {ds.name} {src.name} -> {t.node} failed: {e}",
                {"dataset": ds.name, "from": src.name, "to": t.node}))
            return place
        rec = recorder(ctl)
        rec.data_copies["copied"] = rec.data_copies.get("copied", 0) + 1
        rec.data_bytes += result.bytes_copied
        rec.data_copy_s += seconds
        place = replace(place, state=PlaceState.READY, bytes=result.bytes_total, done_bytes=result.bytes_total,
                        updated=now())
        st.places[key] = place
        speed = result.bytes_copied / seconds if seconds > 0 and result.bytes_copied >= MIN_MEASURED_BYTES else None
        await ctl.db(ctl.store.set_data_place, place, job_id=t.job_id, event=(
            "data_copied", f"{ds.name} copied {src.name} -> {t.node}: {show_bytes(result.bytes_copied)} in "
                           f"{seconds:.1f} s" + (f" ({show_bytes(result.resumed_bytes)} were there already)"
                                                 if result.resumed_bytes else ""),
            {"dataset": ds.name, "from": src.name, "to": t.node, "bytes": result.bytes_copied,
             "resumed_bytes": result.resumed_bytes, "seconds": seconds}))
        if speed is not None:
            st.links[(src.name, t.node)] = await ctl.db(ctl.store.learn_link, src.name, t.node, speed, now())
        return place
    finally:
        st.transfers.pop(key, None)
        ctl.poke()  # a job waiting for this copy (or for a node holding the data) may start now


async def _make_room(ctl: Controller, ds: Dataset, rt: NodeRuntime, need: int) -> None:
    """Within the node's `data_quota`: evict its copies least recently used first (never one a job on the node
    holding GPUs reads); DataUnavailable when that is not enough. The disk's own free space is copy_tree's check."""
    quota = rt.config.data_quota_bytes
    if quota is None:
        return
    st = state(ctl)
    copies = [p for (name, node), p in st.places.items()
              if node == rt.name and name != ds.name and p.origin is PlaceOrigin.COPY
              and p.state in (PlaceState.READY, PlaceState.COPYING)]
    used = sum(p.bytes or 0 for p in copies)
    if used + need <= quota:
        return
    jobs = await ctl.db(ctl.store.jobs, states=list(_HOLDING))
    in_use = {name for j in jobs for name in j.spec.data if any(p.node == rt.name for p in j.placement)}
    for p in sorted((p for p in copies if p.state is PlaceState.READY and p.dataset not in in_use),
                    key=lambda p: p.last_used or p.updated):
        if used + need <= quota:
            break
        try:
            await datacopy.remove(rt.executor, p.path)
        except ExecutorError as e:
            log.warning("could not evict %s from %s: %s", p.dataset, rt.name, e)
            continue
        used -= p.bytes or 0
        st.places.pop((p.dataset, rt.name), None)
        await ctl.db(ctl.store.drop_data_place, p.dataset, rt.name, ctl.clock.time(), event=(
            "data_evicted", f"{p.dataset} evicted from {rt.name} ({show_bytes(p.bytes)}, least recently used) "
                            f"to make room for {ds.name} under data_quota {show_bytes(quota)}",
            {"dataset": p.dataset, "bytes": p.bytes, "for": ds.name}))
    if used + need > quota:
        raise DataUnavailable(f"{rt.name}: {ds.name} ({show_bytes(need)}) does not fit its data_quota "
                              f"({show_bytes(quota)}, {show_bytes(used)} held by copies in use)")


_HOLDING = tuple(s for s in JobState if s.is_active() and s is not JobState.PENDING)
"""The states of jobs that hold devices (their datasets on their nodes are in use)."""


async def resume(ctl: Controller) -> None:
    """Once after a (re)start: copies the last controller left under way go on where their bytes stopped."""
    st = await load(ctl)
    if st.resumed:
        return
    st.resumed = True
    known = datasets(ctl)
    for (name, node), p in list(st.places.items()):
        ds = known.get(name)
        if p.state is PlaceState.COPYING and ds is not None and _up(ctl, node):
            start_copy(ctl, ds, node, job_id=None, why="resume")


def prefetch(ctl: Controller, targets: Sequence[tuple[int, str, tuple[str, ...]]]) -> None:
    """Start the copies the round's `prefetch_targets` asked for (job, node, datasets), once each."""
    if not ctl.settings.prefetch:
        return
    known = datasets(ctl)
    st = state(ctl)
    for job_id, node, names in targets:
        for name in names:
            ds = known.get(name)
            if ds is None or (name, node) in st.transfers or path_on(ctl, ds, node) is not None:
                continue
            if not _up(ctl, node):
                continue
            start_copy(ctl, ds, node, job_id=job_id, why="prefetch")


# ------------------------------------------------------------------------------------------------ `hsched data`

async def listing(ctl: Controller) -> list[dict[str, Any]]:
    """Every dataset: its size, where it is (and how it got there), the copies under way with their progress."""
    st = await load(ctl)
    out = []
    for ds in ctl.fleet_cfg.datasets:
        where = []
        for node in ctl.nodes:
            place = st.places.get((ds.name, node))
            declared = ds.declared_path(node)
            if place is not None:
                where.append({"node": node, "path": place.path, "origin": place.origin.value,
                              "state": place.state.value, "bytes": place.bytes, "last_used": place.last_used,
                              "message": place.message})
            elif declared is not None and not ds.shared:
                where.append({"node": node, "path": declared, "origin": "declared", "state": "ready",
                              "bytes": None, "last_used": None, "message": ""})
        transfers = [{"node": t.node, "from": t.source, "done": t.done, "total": t.total, "job_id": t.job_id,
                      "why": t.why, "seconds": ctl.clock.monotonic() - t.started}
                     for (name, _n), t in st.transfers.items() if name == ds.name]
        out.append({"name": ds.name, "size": size_of(ctl, ds) or None, "declared_size": ds.size_bytes,
                    "shared": ds.shared, "path": ds.path, "where": where, "transfers": transfers})
    return out


async def scan(ctl: Controller) -> list[dict[str, Any]]:
    """Look at every dataset's declared path on every up node that may hold it (the fleet file's `path` on each,
    `paths` entries on theirs): record its size there, or that it is absent. Copies hsched made are not looked at."""
    st = await load(ctl)
    found: list[dict[str, Any]] = []
    for ds in ctl.fleet_cfg.datasets:
        for name, rt in ctl.nodes.items():
            path = ds.paths.get(name, ds.path)
            if path is None or rt.node.state is not NodeState.UP or rt.config.executor == "slurm":
                continue
            place = st.places.get((ds.name, name))
            if place is not None and place.origin is PlaceOrigin.COPY:
                continue
            try:
                info = await datacopy.scan(rt.executor, path)
            except ExecutorError as e:
                found.append({"dataset": ds.name, "node": name, "path": path, "error": str(e)})
                continue
            state_ = PlaceState.READY if info.exists else PlaceState.ABSENT
            place = DataPlace(ds.name, name, path, PlaceOrigin.SCAN, state_, info.bytes if info.exists else None, 0,
                              None, ctl.clock.time(), place.last_used if place else None)
            st.places[(ds.name, name)] = place
            await ctl.db(ctl.store.set_data_place, place)
            found.append({"dataset": ds.name, "node": name, "path": path, "present": info.exists,
                          "bytes": info.bytes if info.exists else None, "files": info.files})
    await ctl.event("data_scan", f"data scan: {sum(1 for f in found if f.get('present'))} places found, "
                                 f"{sum(1 for f in found if f.get('present') is False)} absent")
    ctl.poke()
    return found
