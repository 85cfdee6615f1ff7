"""A fixed snapshot, as the controller's `snapshot` op answers it, for the snapshot tests and the benchmark."""

from __future__ import annotations

from typing import Any

from hsched.tui.model import Frame, parse_snapshot

NOW = 1_780_000_000.0  # the fixed clock of the snapshot tests


def iso(ts: float | None) -> str | None:
    from hsched.serialize import iso as _iso

    return _iso(ts)


def device(node: str, i: int, model: str, mem: int, *, util: float | None, used: int | None, numa: int | None,
           temp: float | None = None, power: float | None = None, job: int | None = None) -> dict[str, Any]:
    return {"uuid": f"GPU-{node}-{i:02d}", "index": i, "model": model, "memory_total_mib": mem,
            "memory_used_mib": used, "utilization_gpu": util, "numa_node": numa, "pci_bus_id": None,
            "temperature_c": temp, "power_w": power, "simulated": True, "job": job}


def nvswitch_links(node: str, n: int) -> list[dict[str, str]]:
    return [{"a": f"GPU-{node}-{i:02d}", "b": f"GPU-{node}-{j:02d}", "kind": "NV18"}
            for i in range(n) for j in range(i + 1, n)]


def pcie_links(node: str, n: int) -> list[dict[str, str]]:
    out = []
    for i in range(n):
        for j in range(i + 1, n):
            kind = "PIX" if i // 2 == j // 2 else "SYS"
            out.append({"a": f"GPU-{node}-{i:02d}", "b": f"GPU-{node}-{j:02d}", "kind": kind})
    return out


def job(jid: int, name: str, state: str, *, user: str = "alice", gpus: int = 1, qos: str = "normal",
        priority: int = 0, reason: str = "", node: str | None = None, devices: list[str] | None = None,
        started: float | None = None, explanation: str | None = None) -> dict[str, Any]:
    return {"id": jid, "name": name, "state": state, "reason": reason, "qos": qos, "priority": priority,
            "user": user, "gpus": gpus, "nodes": 1, "gpu_types": [], "interconnect": "any", "command": [name],
            "workdir": "/tmp", "submit_time": iso(NOW - 3600), "start_time": iso(started), "end_time": None,
            "exit_code": None, "restarts": 0, "time_limit_s": None, "checkpoint_signal": "TERM@30",
            "placement": [{"node": node, "devices": devices or []}] if node else [],
            "placement_explanation": explanation}


def snapshot(util_shift: float = 0.0) -> dict[str, Any]:
    """Two nodes (8 NVSwitch H100s, 4 PCIe A100s) and jobs in most states."""
    h = "dgx-h100"
    a = "a100-box"
    h_devs = [device(h, i, "NVIDIA H100 80GB HBM3", 81559, util=min(100.0, (i * 13 + util_shift) % 101),
                     used=i * 9000, numa=i // 4, temp=40.0 + i, power=100.0 + 30 * i,
                     job=1 if i < 4 else (2 if i < 6 else None)) for i in range(8)]
    a_devs = [device(a, i, "NVIDIA A100-PCIE-40GB", 40960, util=None if i == 3 else 50.0 * (i % 2),
                     used=None if i == 3 else 20480 * (i % 2), numa=i // 2, job=3 if i == 1 else None)
              for i in range(4)]
    jobs = [
        job(1, "llama-pretrain", "RUNNING", gpus=4, qos="prod", priority=10, node=h,
            devices=[f"GPU-{h}-{i:02d}" for i in range(4)], started=NOW - 7322,
            explanation="GPU0-3: all pairs NV18, NUMA 0"),
        job(2, "bert-finetune", "PREEMPTING", user="bob", gpus=2, qos="scavenger", node=h,
            devices=[f"GPU-{h}-04", f"GPU-{h}-05"], started=NOW - 65, reason="Preempted by job 5"),
        job(3, "notebook", "RUNNING", user="carol", node=a, devices=[f"GPU-{a}-01"], started=NOW - 90061),
        job(4, "sweep-17", "PENDING", user="bob", gpus=8, reason="Resources"),
        job(5, "eval", "PENDING", gpus=2, qos="prod", priority=5, reason="Priority"),
        job(6, "held-job", "PENDING", user="carol", reason="JobHeldUser"),
    ]
    nodes = [
        {"name": h, "state": "UP", "executor": "local", "host": None, "cpus": 112, "memory_total_mib": 2 << 20,
         "numa_nodes": 2, "message": "", "devices": h_devs, "links": nvswitch_links(h, 8)},
        {"name": a, "state": "DRAINED", "executor": "ssh", "host": "a100", "cpus": 64, "memory_total_mib": 1 << 19,
         "numa_nodes": 2, "message": "fan", "devices": a_devs, "links": pcie_links(a, 4)},
        {"name": "old-v100", "state": "UNREACHABLE", "executor": "ssh", "host": "v100", "cpus": None,
         "memory_total_mib": None, "numa_nodes": None, "message": "ssh: connection refused", "devices": [],
         "links": []},
    ]
    return {"version": 7, "time": iso(NOW), "jobs": jobs, "nodes": nodes}


EVENTS = [
    {"id": 1, "time": iso(NOW - 60), "job_id": 5, "node": None, "kind": "submitted", "message": "submitted by alice"},
    {"id": 2, "time": iso(NOW - 59), "job_id": 2, "node": "dgx-h100", "kind": "preempting",
     "message": "preempting for job 5: SIGTERM, 30 s grace"},
    {"id": 3, "time": iso(NOW - 30), "job_id": None, "node": "old-v100", "kind": "node_down",
     "message": "node old-v100 unreachable: ssh: connection refused"},
    {"id": 4, "time": iso(NOW - 10), "job_id": 7, "node": "a100-box", "kind": "failed",
     "message": "run 1 exited 1"},
]


def frame(util_shift: float = 0.0, *, can_preempt: bool = True) -> Frame:
    return parse_snapshot(snapshot(util_shift), EVENTS, can_preempt)
