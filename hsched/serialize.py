"""Domain objects to and from JSON-able dicts: the store's columns and the contract's job/node objects."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import UTC, datetime
from typing import Any

from hsched.model import (
    ArraySpec,
    CheckpointSignal,
    Component,
    Device,
    Interconnect,
    Job,
    JobSpec,
    Link,
    Nic,
    NicKind,
    Node,
    NodeState,
    Placement,
    Resources,
    Run,
    RunHandle,
    workload_of,  # issue 30 (its own line: several branches add to the list above)
)


def iso(ts: float | None) -> str | None:
    """ISO 8601 UTC with a Z, or None."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def spec_to_dict(spec: JobSpec) -> dict[str, Any]:
    r = spec.resources
    return {
        "name": spec.name,
        "command": list(spec.command),
        "workdir": spec.workdir,
        "env": dict(spec.env),
        "resources": {
            "gpus": r.gpus,
            "gpu_types": list(r.gpu_types),
            "gpu_memory_mib": r.gpu_memory_mib,
            "cpus": r.cpus,
            "memory_mib": r.memory_mib,
            "nodes": r.nodes,
            "interconnect": r.interconnect.value,
            "tasks_per_node": r.tasks_per_node,
            "constraint": r.constraint,
            **({"offload": True} if r.offload else {}),
            **({"shared": True} if r.shared else {}),
            **({"gpus_max": r.gpus_max} if r.gpus_max is not None else {}),
            **({"nodes_max": r.nodes_max} if r.nodes_max is not None else {}),
        },
        "qos": spec.qos,
        "priority": spec.priority,
        **({"priority_by": spec.priority_by} if spec.priority_by else {}),
        **({"priority_admin": True} if spec.priority_admin else {}),
        "checkpoint_signal": str(spec.checkpoint_signal),
        "time_limit_s": spec.time_limit_s,
        "warn_signal": str(spec.warn_signal) if spec.warn_signal else None,
        "hold": spec.hold,
        "retries": spec.retries,
        "dependency": spec.dependency_text,
        "kill_on_invalid_dep": spec.kill_on_invalid_dep,
        "array": str(spec.array) if spec.array else None,
        "kind": spec.kind,
        "output": spec.output,
        "error": spec.error,
        "open_mode": "append" if spec.output_append else "truncate",
        "data": list(spec.data),
        **({"ntasks": spec.ntasks} if spec.ntasks is not None else {}),
        **({"components": [component_to_dict(c) for c in spec.components]} if spec.components else {}),
        **({"service": spec.service} if spec.service else {}),
        **({"replica": spec.replica} if spec.replica is not None else {}),
        **({"workload": spec.workload} if spec.workload else {}),
        **({"resize_signal": spec.resize_signal} if spec.resize_signal else {}),
    }


def spec_from_dict(d: dict[str, Any]) -> JobSpec:
    r = d.get("resources", {})

    def signal_of(text: str) -> CheckpointSignal:
        batch_only = text.startswith("B:")
        sig, _, grace = text.removeprefix("B:").partition("@")
        return CheckpointSignal(sig or "TERM", float(grace or 30), batch_only)

    return JobSpec(
        command=tuple(d["command"]),
        name=d.get("name", ""),
        workdir=d.get("workdir"),
        env=tuple((k, v) for k, v in d.get("env", {}).items()),
        resources=Resources(
            gpus=r.get("gpus", 0),
            gpu_types=tuple(r.get("gpu_types", ())),
            gpu_memory_mib=r.get("gpu_memory_mib"),
            cpus=r.get("cpus"),
            memory_mib=r.get("memory_mib"),
            nodes=r.get("nodes", 1),
            interconnect=Interconnect(r.get("interconnect", "any")),
            tasks_per_node=r.get("tasks_per_node", 1),
            constraint=r.get("constraint") or "",
            offload=bool(r.get("offload", False)),
            shared=bool(r.get("shared", False)),
            gpus_max=r.get("gpus_max"),
            nodes_max=r.get("nodes_max"),
        ),
        qos=d.get("qos", "normal"),
        priority=d.get("priority", 0),
        priority_by=str(d.get("priority_by") or ""),
        priority_admin=bool(d.get("priority_admin", False)),
        checkpoint_signal=signal_of(str(d.get("checkpoint_signal", "TERM@30"))),
        time_limit_s=d.get("time_limit_s"),
        warn_signal=signal_of(d["warn_signal"]) if d.get("warn_signal") else None,
        hold=bool(d.get("hold", False)),
        retries=d.get("retries"),
        **_dependency_of(d),
        array=_array_of(d.get("array")),
        kind=d.get("kind") or "",
        output=d.get("output"),
        error=d.get("error"),
        output_append=d.get("open_mode") == "append",
        data=tuple(d.get("data") or ()),
        ntasks=d.get("ntasks"),
        components=tuple(component_from_dict(c) for c in d["components"]) if d.get("components") else (),
        service=str(d.get("service") or ""),
        replica=d.get("replica"),
        workload=str(d.get("workload") or ""),
        resize_signal=d.get("resize_signal") or None,
    )


def component_to_dict(c: Component) -> dict[str, Any]:
    """One component of a heterogeneous job, as a stored spec keeps it (its resources as the spec's)."""
    return {"command": list(c.command), "resources": spec_to_dict(JobSpec(command=(), resources=c.resources))[
        "resources"], "env": dict(c.env), "workdir": c.workdir}


def component_from_dict(d: dict[str, Any]) -> Component:
    base = spec_from_dict({"command": d.get("command", []), "resources": d.get("resources", {})})
    return Component(command=tuple(d.get("command", ())), resources=base.resources,
                     env=tuple((k, v) for k, v in (d.get("env") or {}).items()), workdir=d.get("workdir"))


def components_to_list(job: Job) -> list[dict[str, Any]]:
    """The contract's `components` of a heterogeneous job (`queue --json`, `show --json`): each one's id as squeue
    shows it (`12+1`), command, resources and placement; [] for an ordinary job."""
    s = job.spec
    if not s.components:
        return []  # (every job of a listing passes here: 10,000 of them)
    from hsched.model import component_placements

    out = []
    for i, (c, ps) in enumerate(zip(s.components, component_placements(s, job.placement), strict=True)):
        r = c.resources
        out.append({"component": i, "display_id": job.component_id(i), "command": list(c.command),
                    "label": c.label, "gpus": r.gpus, "nodes": r.nodes, "gpu_types": list(r.gpu_types),
                    "cpus": r.cpus, "memory_mib": r.memory_mib, "tasks_per_node": r.tasks_per_node,
                    "constraint": r.constraint or None, "state": job.state.value,
                    "placement": [{"node": p.node, "devices": list(p.devices)} for p in ps]})
    return out


def _array_of(text: str | None) -> ArraySpec | None:
    from hsched.spec.arrays import parse_array

    return parse_array(text) if text else None


def _dependency_of(d: dict[str, Any]) -> dict[str, Any]:
    from hsched.spec.dependencies import parse_dependency

    text = d.get("dependency") or ""
    deps, any_of = parse_dependency(text) if text else ((), False)
    return {"dependency": deps, "dependency_any": any_of, "kill_on_invalid_dep": bool(d.get("kill_on_invalid_dep"))}


def placement_to_list(placement: tuple[Placement, ...]) -> list[dict[str, Any]]:
    return [{"node": p.node, "devices": list(p.devices), "explanation": p.explanation, "cpus": list(p.cpus)}
            for p in placement]


def placement_from_list(items: list[dict[str, Any]]) -> tuple[Placement, ...]:
    return tuple(
        Placement(node=i["node"], devices=tuple(i["devices"]), explanation=i.get("explanation", ""),
                  cpus=tuple(i.get("cpus") or ()))
        for i in items
    )


def job_kind(job: Job) -> str:
    """The job's kind: the one it named, else the one its command looks like (hsched.learn.kinds)."""
    from hsched.spec.jobkind import kind_of

    return kind_of(job.spec.kind, job.spec.command)


def job_to_dict(job: Job) -> dict[str, Any]:
    """The contract's job object."""
    s = job.spec
    return {
        "id": job.id,
        "name": job.name,
        "state": job.state.value,
        "reason": job.reason,
        "qos": s.qos,
        "priority": s.priority,
        # who set the priority, and whether as an admin (then it orders the job across users; a member's orders
        # only their own jobs)
        "priority_by": s.priority_by or None,
        "priority_admin": s.priority_admin,
        "user": job.user,
        "gpus": s.resources.gpus,
        "nodes": s.resources.nodes,
        "gpu_types": list(s.resources.gpu_types),
        "constraint": s.resources.constraint or None,
        "interconnect": s.resources.interconnect.value,
        "command": list(s.command),
        "workdir": s.workdir,
        # sbatch's -o/-e patterns as given (scontrol's StdOut/StdErr); None: `hsched logs` only
        "output": s.output,
        "error": s.error,
        "data": list(s.data),
        "ntasks": s.ntasks,
        "submit_time": iso(job.submit_time),
        "start_time": iso(job.start_time),
        "end_time": iso(job.end_time),
        "exit_code": job.exit_code,
        "restarts": job.restarts,
        "retries": s.retries,
        "retries_used": job.failures,
        "dependency": s.dependency_text or None,
        "array_id": job.array_id,
        "array_task": job.array_task,
        "display_id": job.display_id,
        "array_limit": s.array.max_running if s.array else None,
        "begin_time": iso(job.begin_time),
        "time_limit_s": s.time_limit_s,
        "checkpoint_signal": str(s.checkpoint_signal),
        "warn_signal": str(s.warn_signal) if s.warn_signal else None,
        "placement": [{"node": p.node, "devices": list(p.devices)} for p in job.placement],
        "kind": job_kind(job),
        "placement_explanation": "; ".join(p.explanation for p in job.placement if p.explanation) or None,
        "components": components_to_list(job),
        # issue 30: the workload class (said, or inferred: a service's replica is inference; None unknown), and the
        # service and replica a replica belongs to
        "workload": workload_of(s) or None,
        "service": s.service or None,
        "replica": s.replica,
        **elastic_fields(job),
    }


def elastic_fields(job: Job) -> dict[str, Any]:
    """An elastic job's range and the size it runs at now (its placement's GPUs per node and nodes; None while it
    holds none): `gpus_min`/`gpus_max`, `nodes_min`/`nodes_max`, `gpus_now`, `nodes_now`. Nothing for a rigid job."""
    r = job.spec.resources
    if not r.elastic:
        return {}
    held = [p for p in job.placement if p.devices or not r.gpus]
    return {"elastic": True, "gpus_min": r.gpus, "gpus_max": r.gpus_max if r.gpus_max is not None else r.gpus,
            "nodes_min": r.nodes, "nodes_max": r.nodes_max if r.nodes_max is not None else r.nodes,
            "gpus_now": max((len(p.devices) for p in held), default=None) if held else None,
            "nodes_now": len(held) or None}


def handle_to_dict(h: RunHandle | None) -> dict[str, Any] | None:
    if h is None:
        return None
    return {"run_dir": h.run_dir, "pid": h.pid, "pgid": h.pgid, "start_ticks": h.start_ticks, "boot_id": h.boot_id}


def handle_from_dict(d: dict[str, Any] | None) -> RunHandle | None:
    if not d:
        return None
    return RunHandle(run_dir=d["run_dir"], pid=int(d["pid"]), pgid=int(d["pgid"]),
                     start_ticks=int(d["start_ticks"]), boot_id=str(d["boot_id"]))


def run_to_dict(run: Run) -> dict[str, Any]:
    return {
        "id": run.id,
        "attempt": run.attempt,
        "node": run.node,
        "devices": list(run.devices),
        "rank": run.rank,
        "world": run.world,
        "state": run.state,
        "reason": run.reason,
        "run_dir": run.run_dir,
        "pid": run.handle.pid if run.handle else None,
        "start_time": iso(run.start_time),
        "end_time": iso(run.end_time),
        "exit_code": run.exit_code,
    }


def device_to_dict(d: Device, job: int | None = None) -> dict[str, Any]:
    return {
        "uuid": d.uuid,
        "index": d.index,
        "model": d.model,
        "memory_total_mib": d.memory_total_mib,
        "memory_used_mib": d.memory_used_mib,
        "utilization_gpu": d.utilization_gpu,
        "numa_node": d.numa_node,
        "pci_bus_id": d.pci_bus_id,
        "temperature_c": d.temperature_c,
        "power_w": d.power_w,
        "simulated": d.simulated,
        "cpu_affinity": _cpulist(d.cpu_affinity),
        "host": d.host,
        "job": job,
    }


def device_from_dict(d: dict[str, Any]) -> Device:
    return Device(
        uuid=d["uuid"], index=int(d["index"]), model=d.get("model") or "unknown",
        memory_total_mib=d.get("memory_total_mib"), memory_used_mib=d.get("memory_used_mib"),
        utilization_gpu=d.get("utilization_gpu"), numa_node=d.get("numa_node"), pci_bus_id=d.get("pci_bus_id"),
        compute_capability=d.get("compute_capability"), temperature_c=d.get("temperature_c"),
        power_w=d.get("power_w"), simulated=bool(d.get("simulated", False)),
        cpu_affinity=_parse_cpulist(d.get("cpu_affinity")),
        host=d.get("host"),  # (absent from rows stored before it was: None)
    )


def _cpulist(cpus: tuple[int, ...]) -> str | None:
    from hsched.topo.topology import format_cpulist

    return format_cpulist(cpus) or None


def _parse_cpulist(text: str | None) -> tuple[int, ...]:
    from hsched.topo.topology import parse_cpulist

    return parse_cpulist(text or "")


def node_to_dict(n: Node, owners: dict[str, int] | None = None) -> dict[str, Any]:
    owners = owners or {}
    return {
        "name": n.name,
        "state": n.state.value,
        "executor": n.executor,
        "host": n.host,
        "cpus": n.cpus,
        "memory_total_mib": n.memory_total_mib,
        "numa_nodes": n.numa_nodes,
        "message": n.message,
        "devices": [device_to_dict(d, owners.get(d.uuid)) for d in n.devices],
        "links": [{"a": lk.a, "b": lk.b, "kind": lk.kind} for lk in n.links],
        "nics": [nic_to_dict(x) for x in n.nics],
    }


def nic_to_dict(x: Nic) -> dict[str, Any]:
    return {"name": x.name, "kind": x.kind.value, "rate_gbps": x.rate_gbps, "active": x.active,
            "netdev": x.netdev, "near": list(x.near)}


def nic_from_dict(d: dict[str, Any]) -> Nic:
    return Nic(name=d["name"], kind=NicKind(d["kind"]), rate_gbps=float(d["rate_gbps"]),
               active=bool(d.get("active", True)), netdev=d.get("netdev"),
               near=tuple(int(i) for i in d.get("near", ())))


def node_from_dict(d: dict[str, Any]) -> Node:
    return Node(
        name=d["name"], executor=d["executor"], state=NodeState(d["state"]), cpus=d.get("cpus"),
        memory_total_mib=d.get("memory_total_mib"), numa_nodes=d.get("numa_nodes"),
        devices=tuple(device_from_dict(x) for x in d.get("devices", [])),
        links=tuple(Link(a=x["a"], b=x["b"], kind=x["kind"]) for x in d.get("links", [])),
        host=d.get("host"), message=d.get("message", ""),
        # (a row stored before issue 32 has no NICs)
        nics=tuple(nic_from_dict(x) for x in d.get("nics", [])),
    )


# ---------------------------------------------------------------------------------- the dashboard's extras


def host_load_to_dict(load: dict[str, Any], sampled: float | None) -> dict[str, Any] | None:
    """A node's host CPU and memory from its last monitoring sample (nodehelper.watch's `cpu` and `memory`);
    None before the first sample, or from a node whose samples carry neither."""
    cpu = load.get("cpu") or {}
    mem = load.get("memory") or {}
    if not cpu and not mem:
        return None
    loadavg = cpu.get("loadavg")
    return {"cpu_percent": cpu.get("util"), "cpu_count": cpu.get("count"),
            "loadavg": list(loadavg) if isinstance(loadavg, list | tuple) else None,
            "memory_used_mib": mem.get("used_mib"), "memory_total_mib": mem.get("total_mib"),
            "memory_available_mib": mem.get("available_mib"), "time": iso(sampled)}


def job_of_run_dir(run_dir: str | None) -> int | None:
    """The job id in a run folder's name: hsched.controller.launching names them `JOB-ATTEMPT-rRANK-MS`."""
    if not run_dir:
        return None
    head = run_dir.rstrip("/").rpartition("/")[2].partition("-")[0]
    return int(head) if head.isdigit() else None


def _job_of_process(p: dict[str, Any], uuid: str, owners: dict[str, int], runs_root: str) -> int | None:
    # the run folder says which run a process belongs to; only this controller's run folders name its jobs
    # (another hsched on the same machine numbers its jobs too), or one whose job holds the very device
    local = p.get("job_run_dir") or p.get("run_dir")
    job = job_of_run_dir(local)
    if job is None:
        return None
    if str(local).startswith(runs_root.rstrip("/") + "/") or owners.get(uuid) == job:
        return job
    return None


def gpu_processes_to_list(by_uuid: dict[str, list[dict[str, Any]]] | None, owners: dict[str, int],
                          runs_root: str) -> list[dict[str, Any]] | None:
    """A node's GPU processes as the dashboard lists them (nvitop's process list): one object per process and
    device, with the hsched job it belongs to (null for one that is not a run of this controller's). None
    while the node's processes are unknown (no sample listed them: no NVML or nvidia-smi there)."""
    if by_uuid is None:
        return None
    out = []
    for uuid, procs in by_uuid.items():
        for p in procs:
            out.append({"uuid": uuid, "pid": p.get("pid"), "user": p.get("user"),
                        "job": _job_of_process(p, uuid, owners, runs_root),
                        "gpu_memory_mib": p.get("used_memory_mib"), "cpu_percent": p.get("cpu_percent"),
                        "host_memory_mib": p.get("rss_mib"), "command": p.get("command") or p.get("name")})
    return out


def node_live_to_dict(n: Node, owners: dict[str, int], *, host_load: dict[str, Any] | None,
                      processes: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The snapshot's node object: the contract's node object, plus `host_load` (host_load_to_dict) and
    `processes` (gpu_processes_to_list), each null where unknown."""
    return {**node_to_dict(n, owners), "host_load": host_load, "processes": processes}


def history_to_dict(series: Any, since: float, names: tuple[str, str]) -> dict[str, list[Any]]:
    """One device's (or host's) samples at or after `since`, oldest first, as columns: `t` (epoch seconds)
    and the two readings under `names`. `series` is a deque of (time, reading, reading), oldest first."""
    newer = []
    for point in reversed(series):  # from the newest: a frame's catch-up costs what is new, not the window
        if point[0] < since:
            break
        newer.append(point)
    newer.reverse()
    return {"t": [round(p[0], 3) for p in newer], names[0]: [p[1] for p in newer],
            names[1]: [p[2] for p in newer]}


def pick_jobs(jobs: Iterable[dict[str, Any]], *, users: Collection[str] | None = None,
              states: Collection[str] | None = None, ids: Collection[str] | None = None) -> list[dict[str, Any]]:
    """The contract's job objects that `hsched queue` shows: of these users, in these states, with these ids
    (`12`: a job or a whole array, `12_3`: one task). The controller filters with it (`queue` with `users`,
    `states`, `ids`) and so does the CLI against a controller that does not."""
    out = list(jobs)
    if users is not None:
        out = [j for j in out if j["user"] in users]
    if states is not None:
        out = [j for j in out if j["state"] in states]
    if ids is not None:
        out = [j for j in out if str(j["id"]) in ids or str(j.get("array_id")) in ids
               or f"{j.get('array_id')}_{j.get('array_task')}" in ids]
    return out


def components_with_runs(job: Job, runs: Iterable[Run]) -> list[dict[str, Any]]:
    """`components_to_list` with each component's own state from its runs of the job's last attempt (`show`): a
    component that failed says EXITED and its exit code while the others say how they were stopped."""
    from hsched.model import component_ranks

    out = components_to_list(job)
    which = component_ranks(job.spec)
    last = max((r.attempt for r in runs), default=None)
    mine: dict[int, list[Run]] = {}
    for r in runs:
        if r.attempt == last and r.rank < len(which):
            mine.setdefault(which[r.rank][0], []).append(r)
    # the component whose failure ended the job (its run's reason says so: hsched.controller.ending)
    cause = next((which[r.rank][0] for r in runs if r.attempt == last and r.reason and r.rank < len(which)), None)
    for c in out:
        rs = mine.get(c["component"], [])
        c["runs"] = [{"rank": x.rank, "node": x.node, "state": x.state.value, "exit_code": x.exit_code} for x in rs]
        if rs and job.state.is_terminal():
            # ended: its own end (else, pending or running, the job's state is each component's), as sacct's rows:
            # the failing component FAILED, those stopped because of it CANCELLED
            bad = [r for r in rs if r.exit_code not in (0, None)]
            r = bad[0] if bad else rs[0]
            state = r.state.value if r.state.value != "EXITED" else "FAILED"
            if job.state.value == "FAILED" and cause is not None and c["component"] != cause and bad:
                state = "CANCELLED"
            c["state"], c["exit_code"] = state, r.exit_code
    return out
