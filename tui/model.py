"""Immutable views of one controller snapshot: what every widget reads, built off the UI thread.

Frozen, slotted dataclasses so that a frame can be handed across threads and compared field by field:
widgets skip any row whose source object is equal to the one they drew last time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
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


@dataclass(frozen=True, slots=True)
class LinkView:
    a: str
    b: str
    kind: str


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


@dataclass(frozen=True, slots=True)
class JobView:
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


@dataclass(frozen=True, slots=True)
class Frame:
    """One snapshot as the dashboard sees it."""

    version: int
    time: str
    jobs: tuple[JobView, ...]
    nodes: tuple[NodeView, ...]
    events: tuple[EventView, ...] = ()  # only the events new since the previous frame
    can_preempt: bool = False

    def job(self, job_id: int) -> JobView | None:
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
    )


def _node(n: dict[str, Any]) -> NodeView:
    return NodeView(
        name=str(n["name"]), state=str(n.get("state", "UP")), executor=str(n.get("executor", "")),
        cpus=n.get("cpus"), memory_total_mib=n.get("memory_total_mib"), numa_nodes=n.get("numa_nodes"),
        message=str(n.get("message") or ""),
        devices=tuple(sorted((_device(d) for d in n.get("devices", [])), key=lambda d: d.index)),
        links=tuple(LinkView(str(lk["a"]), str(lk["b"]), str(lk["kind"])) for lk in n.get("links", [])),
    )


def job_from_dict(j: dict[str, Any]) -> JobView:
    placement = j.get("placement") or []
    return JobView(
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


def parse_snapshot(snap: dict[str, Any], events: list[dict[str, Any]] | None = None,
                   can_preempt: bool = False) -> Frame:
    """The controller's `snapshot` answer (and new `events` rows) as one immutable frame."""
    return Frame(
        version=int(snap.get("version", 0)), time=str(snap.get("time") or ""),
        jobs=tuple(job_from_dict(j) for j in snap.get("jobs", [])),
        nodes=tuple(_node(n) for n in snap.get("nodes", [])),
        events=tuple(event_from_dict(e) for e in events or []),
        can_preempt=can_preempt,
    )
