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
         "numa_nodes": 2, "message": "", "devices": h_devs, "links": nvswitch_links(h, 8),
         "host_load": host_load(41.5, 112, 421_888, 2 << 20), "processes": h100_processes(h)},
        {"name": a, "state": "DRAINED", "executor": "ssh", "host": "a100", "cpus": 64, "memory_total_mib": 1 << 19,
         "numa_nodes": 2, "message": "fan", "devices": a_devs, "links": pcie_links(a, 4),
         "host_load": host_load(88.0, 64, 498_000, 1 << 19),
         "processes": [process(a, 1, 90210, "carol", 3, 20_300, None, 6_100, "jupyter-lab --port 8888")]},
        {"name": "old-v100", "state": "UNREACHABLE", "executor": "ssh", "host": "v100", "cpus": None,
         "memory_total_mib": None, "numa_nodes": None, "message": "ssh: connection refused", "devices": [],
         "links": [], "host_load": None, "processes": None},
    ]
    return {"version": 7, "time": iso(NOW), "jobs": jobs, "nodes": nodes}


def host_load(cpu: float, cores: int, used: int, total: int) -> dict[str, Any]:
    return {"cpu_percent": cpu, "cpu_count": cores, "loadavg": [cores * cpu / 100, cores * 0.3, cores * 0.25],
            "memory_used_mib": used, "memory_total_mib": total, "memory_available_mib": total - used,
            "time": iso(NOW - 1)}


def process(node: str, gpu: int, pid: int, user: str, job: int | None, gpu_mib: int | None, cpu: float | None,
            rss_mib: int | None, command: str) -> dict[str, Any]:
    return {"uuid": f"GPU-{node}-{gpu:02d}", "pid": pid, "user": user, "job": job, "gpu_memory_mib": gpu_mib,
            "cpu_percent": cpu, "host_memory_mib": rss_mib, "command": command}


def h100_processes(h: str) -> list[dict[str, Any]]:
    """Job 1's four ranks (and rank 0's data loader on its GPU), job 2's two, and one process of no job."""
    train = "python -m torch.distributed.run --nproc-per-node 4 train.py --config llama-7b.yaml"
    out = [process(h, i, 41000 + i, "alice", 1, 9000 * i - 600 if i else 512, 98.0 + i, 14_800 + 100 * i, train)
           for i in range(4)]
    out.append(process(h, 0, 41100, "alice", 1, 600, 412.5, 3_900, "python train.py (data loader)"))
    out += [process(h, i, 52000 + i, "bob", 2, 9000 * i - 400, 100.0, 9_200, "python finetune.py --task mnli")
            for i in (4, 5)]
    out.append(process(h, 6, 61234, "dave", None, 30_000, 0.0, 2_048, "python my_notebook_kernel.py"))
    return out


def history(samples: int = 300) -> dict[str, Any]:
    """The controller's `history` answer: a sample a second for the last `samples` seconds, in patterns that
    are the same on every machine (integer arithmetic, no floating-point functions); dgx-h100's GPU 7 has a
    gap (its node did not answer for a while) and a100-box's GPU 3 no readings at all."""
    devices: dict[str, Any] = {}
    hosts: dict[str, Any] = {}
    times = [NOW - samples + 1 + k for k in range(samples)]
    for node, count, busy, total in (("dgx-h100", 8, {0, 1, 2, 3, 4, 5}, 81559), ("a100-box", 4, {1}, 40960)):
        for i in range(count):
            uuid = f"GPU-{node}-{i:02d}"
            if node == "a100-box" and i == 3:
                continue
            keep = [k for k in range(samples) if not (node == "dgx-h100" and i == 7 and 120 <= k < 170)]
            util = [float(40 + (k * 3 + i * 17) % 60) if i in busy and k > 40 * i else float((k // 50) % 2 * 5)
                    for k in keep]
            mem = [total * (30 + (k // 10 + i) % 50) // 100 if i in busy and k > 40 * i else 0 for k in keep]
            devices[uuid] = {"node": node, "t": [times[k] for k in keep], "utilization_gpu": util,
                             "memory_used_mib": mem}
        hosts[node] = {"t": times, "cpu_percent": [float(20 + (k * 7) % 50) for k in range(samples)],
                       "memory_used_mib": [400_000 + k * 100 for k in range(samples)]}
    return {"time": iso(NOW), "now": NOW, "interval_s": 1.0, "devices": devices, "hosts": hosts}


EVENTS = [
    {"id": 1, "time": iso(NOW - 60), "job_id": 5, "node": None, "kind": "submitted", "message": "submitted by alice"},
    {"id": 2, "time": iso(NOW - 59), "job_id": 2, "node": "dgx-h100", "kind": "preempting",
     "message": "preempting for job 5: SIGTERM, 30 s grace"},
    {"id": 3, "time": iso(NOW - 30), "job_id": None, "node": "old-v100", "kind": "node_down",
     "message": "node old-v100 unreachable: ssh: connection refused"},
    {"id": 4, "time": iso(NOW - 10), "job_id": 7, "node": "a100-box", "kind": "failed",
     "message": "run 1 exited 1"},
]


def frame(util_shift: float = 0.0, *, can_preempt: bool = True, served: bool = False, at: float = 0.0) -> Frame:
    """The canned snapshot; `served`: with the controller's history; `at`: seconds after NOW."""
    snap = snapshot(util_shift)
    snap["time"] = iso(NOW + at)
    return parse_snapshot(snap, EVENTS, can_preempt, history() if served else None)
