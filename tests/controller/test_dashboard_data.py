"""What the dashboard reads beyond the contract's node object (issue 16, item 8): each node's host CPU and
memory and its GPU processes in the snapshot, and the controller's per-device history through `history`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hsched.controller.api import Api
from hsched.controller.health import record_sample, simulate_telemetry
from hsched.serialize import job_of_run_dir
from hsched.testing import Lab


def sample(processes: list[dict[str, Any]], *, cpu: float = 37.5, used_mib: int = 1000) -> dict[str, Any]:
    """A monitoring sample as hsched.node.watch sends it (GPU numbers from nvidia-smi, so processes count)."""
    return {"seq": 1, "boot_id": "b", "cpu": {"util": cpu, "count": 64, "loadavg": [3.0, 2.0, 1.0]},
            "memory": {"total_mib": 262144, "available_mib": 262144 - used_mib, "used_mib": used_mib},
            "gpus": {"source": "nvidia-smi", "devices": []}, "gpu_error": None, "processes": processes}


def proc(pid: int, uuid: str, run_dir: str | None, **extra: Any) -> dict[str, Any]:
    return {"pid": pid, "uuid": uuid, "used_memory_mib": 1234, "name": "python", "run_dir": run_dir,
            "user": "alice", "command": "python train.py", "cpu_percent": 99.5, "rss_mib": 2048, **extra}


async def snapshot_node(lab: Lab, name: str) -> dict[str, Any]:
    snap = await Api(lab.ctl).handle("snapshot", {}, os.getuid())
    return next(n for n in snap["nodes"] if n["name"] == name)


async def test_the_snapshot_lists_each_gpus_processes_with_their_job_and_the_hosts_load(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("train", gpus=2)
        await lab.round()
        (run,) = await lab.runs(job.id)
        mine, other = (await lab.job(job.id)).placement[0].devices
        rt = lab.ctl.nodes[run.node]
        free = next(d.uuid for d in rt.node.devices if d.uuid not in (mine, other))
        record_sample(rt, sample([
            proc(100, mine, run.run_dir),
            proc(101, other, None, user="bob", command=None),  # nothing of hsched's: no job, its name shown
            # a run of another hsched on the same machine, on a device this controller's job does not hold
            proc(102, free, f"/home/carol/.local/share/hsched/runs/{run.node}/{job.id}-1-r0-5"),
        ]), lab.clock.time())
        node = await snapshot_node(lab, run.node)
        assert node["host_load"] == {"cpu_percent": 37.5, "cpu_count": 64, "loadavg": [3.0, 2.0, 1.0],
                                     "memory_used_mib": 1000, "memory_total_mib": 262144,
                                     "memory_available_mib": 261144, "time": node["host_load"]["time"]}
        assert node["host_load"]["time"] is not None
        rows = {p["pid"]: p for p in node["processes"]}
        assert rows[100] == {"uuid": mine, "pid": 100, "user": "alice", "job": job.id, "gpu_memory_mib": 1234,
                             "cpu_percent": 99.5, "host_memory_mib": 2048, "command": "python train.py"}
        assert (rows[101]["job"], rows[101]["user"], rows[101]["command"]) == (None, "bob", "python")
        assert rows[102]["job"] is None
        # the contract's node fields are all still there
        assert {"name", "state", "executor", "cpus", "memory_total_mib", "devices"} <= set(node)
        # a node with none: an empty list; one whose samples never listed them (no NVML, no nvidia-smi): null
        quiet = next(n for n in lab.ctl.nodes if n != run.node)
        assert (await snapshot_node(lab, quiet))["processes"] == []
        lab.ctl.nodes[quiet].gpu_processes = None
        lab.ctl.nodes[quiet].host_load = {}
        assert (await snapshot_node(lab, quiet))["processes"] is None
        assert (await snapshot_node(lab, quiet))["host_load"] is None


async def test_history_serves_the_controllers_samples_and_only_the_new_ones_when_asked(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("train", gpus=1)
        await lab.round()
        (uuid,) = (await lab.job(job.id)).placement[0].devices
        node = (await lab.job(job.id)).placement[0].node
        start = lab.clock.time()
        for i in range(5):
            simulate_telemetry(lab.ctl, {uuid: job.id}, lab.clock.time())
            record_sample(lab.ctl.nodes[node], sample([], cpu=10.0 * i, used_mib=100 * i), lab.clock.time())
            lab.clock.advance(1.0)
        api = Api(lab.ctl)
        full = await api.handle("history", {}, os.getuid())
        dev = full["devices"][uuid]
        assert dev["node"] == node
        assert len(dev["t"]) == len(dev["utilization_gpu"]) == len(dev["memory_used_mib"]) >= 5
        assert dev["t"] == sorted(dev["t"]) and dev["t"][-1] == start + 4
        assert all(u is not None and u > 50 for u in dev["utilization_gpu"][-5:])  # a busy simulated GPU
        host = full["hosts"][node]
        assert host["cpu_percent"] == [0.0, 10.0, 20.0, 30.0, 40.0]
        assert host["memory_used_mib"] == [0, 100, 200, 300, 400]
        assert full["interval_s"] == lab.ctl.settings.monitor_interval_s
        # what is new since a time: a dashboard's catch-up, not the whole window again
        newer = await api.handle("history", {"since": start + 3}, os.getuid())
        assert newer["devices"][uuid]["t"] == [start + 3, start + 4]
        assert newer["hosts"][node]["cpu_percent"] == [30.0, 40.0]


async def test_a_sample_leaves_simulated_devices_readings_to_the_simulation(tmp_path: Path) -> None:
    # the node helper says 0 % for a simulated GPU; the history must not jump between that and the simulation
    async with Lab.open(tmp_path) as lab:
        rt = lab.ctl.nodes["a"]
        uuid = rt.node.devices[0].uuid
        simulate_telemetry(lab.ctl, {uuid: 1}, lab.clock.time())
        busy = rt.node.devices[0].utilization_gpu
        s = sample([])
        s["gpus"]["devices"] = [{"uuid": uuid, "utilization_gpu": 0.0, "memory_used_mib": 0}]
        record_sample(rt, s, lab.clock.time())
        assert rt.node.devices[0].utilization_gpu == busy and busy
        assert [u for _, u, _ in rt.history[uuid]] == [busy]


def test_the_job_of_a_run_folder() -> None:
    assert job_of_run_dir("/h/runs/dgx/42-1-r0-1780000000000") == 42
    assert job_of_run_dir("/h/runs/users/bob/dgx/7-3-r1-17/") == 7
    assert job_of_run_dir("/h/runs/dgx/notes") is None
    assert job_of_run_dir(None) is None
