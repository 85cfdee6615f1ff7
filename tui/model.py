"""Immutable views of one controller snapshot: what every widget reads, built off the UI thread.

Frozen, slotted dataclasses so that a frame can be handed across threads and compared field by field:
widgets skip any row whose source object is equal to the one they drew last time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any


@dataclass(frozen=True, slots=True)
class DeviceView:
    uuid: str
    index: int
    model: str
    memory_total_mib: int | None
    memory_used_mib: int | None
    utilization_gpu: float | None  # percent, None when unreadable
    numa_node: int | None
    temperature_c: float | None
    power_w: float | None
    job: int | None
    simulated: bool = False


@dataclass(frozen=True, slots=True)
class LinkView:
    a: str
    b: str
    kind: str


@dataclass(frozen=True, slots=True)
class ProcessView:
    """One process on one GPU, as nvitop lists them (a process on two GPUs is two of these)."""

    node: str
    uuid: str
    gpu: int | None  # the device's index on its node; None for a device the node no longer lists
    pid: int
    user: str
    job: int | None  # the hsched job it belongs to; None for anything else on the GPU
    gpu_memory_mib: int | None
    cpu_percent: float | None  # of one core, as top shows it (a busy data loader reads 400 %)
    host_memory_mib: int | None  # resident
    command: str


@dataclass(frozen=True, slots=True)
class HostLoadView:
    """A node's host CPU and memory from its last monitoring sample."""

    cpu_percent: float | None  # of all its cores
    cpu_count: int | None
    loadavg: tuple[float, ...] | None
    memory_used_mib: int | None
    memory_total_mib: int | None


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    state: str
    executor: str
    cpus: int | None
    memory_total_mib: int | None
    numa_nodes: int | None
    message: str
    devices: tuple[DeviceView, ...]
    links: tuple[LinkView, ...]
    processes: tuple[ProcessView, ...] | None = None  # None: unknown (a controller or node that does not say)
    load: HostLoadView | None = None


@dataclass(frozen=True, slots=True)
class JobRow:
    id: int
    name: str
    state: str
    reason: str
    qos: str
    priority: int
    user: str
    gpus: int
    node: str  # first placement node, "" while pending
    devices: tuple[str, ...]
    submit_ts: float | None
    start_ts: float | None
    end_ts: float | None
    explanation: str


@dataclass(frozen=True, slots=True)
class EventView:
    id: int
    time: str
    kind: str
    job_id: int | None
    node: str | None
    message: str


class TransferWhy(StrEnum):
    """Why the controller copies a dataset to a node."""

    START = "start"  # a job waits for it to start
    PREFETCH = "prefetch"  # ahead of a job's start, while it still waits for GPUs
    RESUME = "resume"  # a copy the controller found half done when it started again


@dataclass(frozen=True, slots=True)
class TransferView:
    """A copy of a dataset to node `node` under way: `done` bytes of `total` in `seconds`."""

    dataset: str
    source: str
    node: str
    done: int
    total: int | None  # None (or 0): the controller does not know the size yet
    seconds: float | None
    job_id: int | None
    why: TransferWhy | None  # None: a reason this dashboard does not know (a newer controller)

    @property
    def fraction(self) -> float | None:
        return min(1.0, self.done / self.total) if self.total else None

    @property
    def mb_per_s(self) -> float | None:
        """Decimal MB a second since the copy began, as `hsched data` shows it."""
        return self.done / self.seconds / 1e6 if self.seconds and self.seconds > 0 else None


@dataclass(frozen=True, slots=True)
class ServiceView:
    """A service as the Services view shows it (the snapshot's `services`, issue 30)."""

    name: str
    user: str
    state: str
    ready: int
    wanted: int
    min_replicas: int
    max_replicas: int
    requests_per_s: float
    p99_ms: float | None
    slo_ms: float
    attainment: float | None
    address: str


Point = tuple[float, float | None, float | None]
"""One history sample: (epoch seconds, utilization % or host CPU %, memory used MiB)."""


@dataclass(frozen=True, slots=True)
class HistoryDelta:
    """Samples from the controller's `history` answer, oldest first: its per-device and per-host series."""

    devices: tuple[tuple[str, tuple[Point, ...]], ...] = ()
    hosts: tuple[tuple[str, tuple[Point, ...]], ...] = ()
    interval_s: float | None = None  # the controller's monitoring interval: one sample per interval


@dataclass(frozen=True, slots=True)
class Frame:
    """One snapshot as the dashboard sees it."""

    version: int
    time: str
    jobs: tuple[JobRow, ...]
    nodes: tuple[NodeView, ...]
    events: tuple[EventView, ...] = ()  # only the events new since the previous frame
    can_preempt: bool = False
    history: HistoryDelta | None = None  # the controller's samples new since the previous frame, if it serves them
    transfers: tuple[TransferView, ...] = ()  # dataset copies under way, by receiving node
    services: tuple[ServiceView, ...] = ()  # the services, by name (issue 30)

    def job(self, job_id: int) -> JobRow | None:
        return next((j for j in self.jobs if j.id == job_id), None)

    def node(self, name: str) -> NodeView | None:
        return next((n for n in self.nodes if n.name == name), None)


def ts(value: str | None) -> float | None:
    """ISO 8601 (with a Z) to epoch seconds; None stays None."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _device(d: dict[str, Any]) -> DeviceView:
    return DeviceView(
        uuid=str(d["uuid"]), index=int(d.get("index", 0)), model=str(d.get("model") or "unknown"),
        memory_total_mib=d.get("memory_total_mib"), memory_used_mib=d.get("memory_used_mib"),
        utilization_gpu=d.get("utilization_gpu"), numa_node=d.get("numa_node"),
        temperature_c=d.get("temperature_c"), power_w=d.get("power_w"), job=d.get("job"),
        simulated=bool(d.get("simulated", False)),
    )


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _whole(v: Any) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _process(node: str, index_of: dict[str, int], p: dict[str, Any]) -> ProcessView:
    uuid = str(p.get("uuid") or "")
    return ProcessView(
        node=node, uuid=uuid, gpu=index_of.get(uuid), pid=_whole(p.get("pid")) or 0, user=str(p.get("user") or ""),
        job=_whole(p.get("job")), gpu_memory_mib=_whole(p.get("gpu_memory_mib")),
        cpu_percent=_number(p.get("cpu_percent")), host_memory_mib=_whole(p.get("host_memory_mib")),
        command=str(p.get("command") or ""),
    )


def _load(h: Any) -> HostLoadView | None:
    if not isinstance(h, dict):
        return None
    avg = h.get("loadavg")
    return HostLoadView(
        cpu_percent=_number(h.get("cpu_percent")), cpu_count=_whole(h.get("cpu_count")),
        loadavg=tuple(x for x in map(_number, avg) if x is not None) if isinstance(avg, list) else None,
        memory_used_mib=_whole(h.get("memory_used_mib")), memory_total_mib=_whole(h.get("memory_total_mib")),
    )


def _node(n: dict[str, Any]) -> NodeView:
    name = str(n["name"])
    devices = tuple(sorted((_device(d) for d in n.get("devices", [])), key=lambda d: d.index))
    procs = n.get("processes")
    processes = None
    if isinstance(procs, list):
        index_of = {d.uuid: d.index for d in devices}
        # nvitop's order: by GPU, then by pid
        processes = tuple(sorted((_process(name, index_of, p) for p in procs if isinstance(p, dict)),
                                 key=lambda p: (p.gpu if p.gpu is not None else 1 << 30, p.uuid, p.pid)))
    return NodeView(
        name=name, state=str(n.get("state", "UP")), executor=str(n.get("executor", "")),
        cpus=n.get("cpus"), memory_total_mib=n.get("memory_total_mib"), numa_nodes=n.get("numa_nodes"),
        message=str(n.get("message") or ""), devices=devices,
        links=tuple(LinkView(str(lk["a"]), str(lk["b"]), str(lk["kind"])) for lk in n.get("links", [])),
        processes=processes, load=_load(n.get("host_load")),
    )


def job_from_dict(j: dict[str, Any]) -> JobRow:
    placement = j.get("placement") or []
    return JobRow(
        id=int(j["id"]), name=str(j.get("name") or ""), state=str(j.get("state", "")),
        reason=str(j.get("reason") or ""), qos=str(j.get("qos") or ""), priority=int(j.get("priority") or 0),
        user=str(j.get("user") or ""), gpus=int(j.get("gpus") or 0),
        node=",".join(p["node"] for p in placement),
        devices=tuple(d for p in placement for d in p.get("devices", [])),
        submit_ts=ts(j.get("submit_time")), start_ts=ts(j.get("start_time")), end_ts=ts(j.get("end_time")),
        explanation=str(j.get("placement_explanation") or ""),
    )


def event_from_dict(e: dict[str, Any]) -> EventView:
    return EventView(id=int(e.get("id", 0)), time=str(e.get("time") or ""), kind=str(e.get("kind", "")),
                     job_id=e.get("job_id"), node=e.get("node"), message=str(e.get("message", "")))


def _series(s: Any, a: str, b: str) -> tuple[Point, ...]:
    if not isinstance(s, dict):
        return ()
    t, x, y = s.get("t") or [], s.get(a) or [], s.get(b) or []
    if not (len(t) == len(x) == len(y)):
        return ()  # columns that do not line up are not a series
    out = []
    for ti, xi, yi in zip(t, x, y, strict=True):
        when = _number(ti)
        if when is not None:
            out.append((when, _number(xi), _number(yi)))
    return tuple(out)


def parse_history(reply: dict[str, Any]) -> HistoryDelta:
    """The controller's `history` answer (columns per device and per host) as one immutable delta."""
    devices = reply.get("devices") or {}
    hosts = reply.get("hosts") or {}
    return HistoryDelta(
        devices=tuple((str(uuid), _series(s, "utilization_gpu", "memory_used_mib")) for uuid, s in devices.items()),
        hosts=tuple((str(node), _series(s, "cpu_percent", "memory_used_mib")) for node, s in hosts.items()),
        interval_s=_number(reply.get("interval_s")),
    )


def _transfer(t: Any) -> TransferView | None:
    if not isinstance(t, dict) or not t.get("dataset") or not t.get("to"):
        return None  # not a copy this dashboard can name
    why = next((w for w in TransferWhy if w.value == t.get("why")), None)
    return TransferView(
        dataset=str(t["dataset"]), source=str(t.get("from") or ""), node=str(t["to"]),
        done=max(0, _whole(t.get("done")) or 0), total=_whole(t.get("total")), seconds=_number(t.get("seconds")),
        job_id=_whole(t.get("job_id")), why=why,
    )


def parse_transfers(rows: Any) -> tuple[TransferView, ...]:
    """The snapshot's `transfers` list, ordered by receiving node, dataset and source; () when the controller
    sends none (an older one has no such key)."""
    if not isinstance(rows, list):
        return ()
    views = (v for v in map(_transfer, rows) if v is not None)
    return tuple(sorted(views, key=lambda v: (v.node, v.dataset, v.source)))


def parse_snapshot(snap: dict[str, Any], events: list[dict[str, Any]] | None = None,
                   can_preempt: bool = False, history: dict[str, Any] | None = None) -> Frame:
    """The controller's `snapshot` answer (and new `events` rows, and its `history` answer) as one immutable
    frame."""
    return Frame(
        version=int(snap.get("version", 0)), time=str(snap.get("time") or ""),
        jobs=tuple(job_from_dict(j) for j in snap.get("jobs", [])),
        nodes=tuple(_node(n) for n in snap.get("nodes", [])),
        events=tuple(event_from_dict(e) for e in events or []),
        can_preempt=can_preempt,
        history=parse_history(history) if history is not None else None,
        transfers=parse_transfers(snap.get("transfers")),
        services=parse_services(snap.get("services")),
    )


def parse_services(rows: Any) -> tuple[ServiceView, ...]:
    """The snapshot's `services` list (hsched.controller.services' reports), by name; () when the controller sends
    none (an older one has no such key) or a row is not what it should be."""
    if not isinstance(rows, list):
        return ()
    out = []
    for s in rows:
        try:
            r = s["replicas"]
            out.append(ServiceView(
                name=str(s["name"]), user=str(s.get("user") or ""), state=str(s.get("state") or ""),
                ready=int(r["ready"]), wanted=int(r["wanted"]), min_replicas=int(r["min"]), max_replicas=int(r["max"]),
                requests_per_s=float(s.get("requests_per_s") or 0.0), p99_ms=_number(s.get("p99_ms")),
                slo_ms=float(s["slo_p99_ms"]), attainment=_number(s.get("slo_attainment")),
                address=str(s.get("address") or "")))
        except (KeyError, TypeError, ValueError):
            continue
    return tuple(sorted(out, key=lambda v: v.name))
