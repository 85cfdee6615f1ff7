"""`hsched eff` (issue 16, seff's role): monitoring samples folded into per-run tallies while a job runs, kept in
the store once it ends, and the figures (GPU utilization, GPU memory peak, CPU efficiency, host memory peak)
checked against the samples injected here; a figure no sample carried is None ("no samples"), never 0."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from hsched.cli import main
from hsched.controller.api import Api
from hsched.controller.health import record_sample
from hsched.controller.launching import job_cache
from hsched.controller.usage import observe
from hsched.learn.efficiency import RunTally, figures, fold
from hsched.testing import Lab

ROOT = "/fake/runs/a"


def proc(pid: int, uuid: str, run_dir: str, cpu: float | None, rss: int) -> dict[str, Any]:
    return {"pid": pid, "uuid": uuid, "used_memory_mib": 100, "name": "python", "run_dir": run_dir,
            "user": "alice", "command": "python train.py", "cpu_percent": cpu, "rss_mib": rss}


def sample(devices: list[dict[str, Any]], processes: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {"seq": 1, "boot_id": "b", "cpu": {"util": 10.0, "count": 64, "loadavg": [1.0, 1.0, 1.0]},
            "memory": {"total_mib": 262144, "available_mib": 200000, "used_mib": 62144},
            "gpus": {"source": "nvml", "devices": devices}, "gpu_error": None, "processes": processes}


def test_fold_means_peaks_and_cpu_time() -> None:
    t = RunTally(1, 1, "a")
    totals = {"g0": 80_000, "g1": 80_000}
    readings = [({"g0": 20, "g1": 0}, {"g0": 1000, "g1": 10}), ({"g0": 60, "g1": 0}, {"g0": 5000, "g1": 10}),
                ({"g0": 100, "g1": 0}, {"g0": 3000, "g1": 10})]
    cpus = [None, 150.0, 250.0]  # a process's first sample has no CPU % yet
    for i, ((util, mem), cpu) in enumerate(zip(readings, cpus, strict=True)):
        fold(t, 100.0 + 2 * i, {u: {"utilization_gpu": util[u], "memory_used_mib": mem[u]} for u in util}, totals,
             [proc(7, "g0", "x/1-1-r0-5", cpu, 1000 + i), proc(7, "g1", "x/1-1-r0-5", cpu, 1000 + i),
              proc(8, "g1", "x/1-1-r0-5", 50.0 if cpu else None, 500)])
    f = figures([t])
    g0, g1 = f.gpus
    assert g0.utilization_mean == pytest.approx(60.0) and g1.utilization_mean == 0.0
    assert f.utilization_mean == pytest.approx(30.0)  # an idle GPU the job holds pulls the mean down
    assert (f.busiest(), f.idlest()) == (g0, g1)
    assert g0.memory_peak_mib == 5000 and f.memory_peak() == g0
    # (150 + 50) % for 2 s, then (250 + 50) % for 2 s; pid 7 counted once though listed on two GPUs
    assert f.cpu_s == pytest.approx(2.0 * 2 + 3.0 * 2) and f.cpu_covered_s == pytest.approx(4.0)
    assert f.host_memory_peak_mib == 1002 + 500
    # a gap in the stream is not counted as covered time
    fold(t, 200.0, {}, totals, [proc(7, "g0", "x", 400.0, 10)])
    assert figures([t]).cpu_s == pytest.approx(10.0)
    assert RunTally.from_dict(json.loads(json.dumps(t.to_dict()))) == t


def test_nothing_read_is_none_not_zero() -> None:
    t = RunTally(1, 1, "a")
    fold(t, 1.0, {}, {"g0": 80_000}, None)  # a sample that read no GPU and listed no processes
    f = figures([t])
    assert (f.utilization_mean, f.cpu_s, f.host_memory_peak_mib, f.memory_peak()) == (None, None, None, None)


async def _real_gpus(lab: Lab, node: str) -> None:
    """The node's GPUs as a real node's (the canned fleet's are simulated, whose readings are not samples)."""
    rt = lab.ctl.nodes[node]
    rt.node = dataclasses.replace(rt.node, devices=tuple(dataclasses.replace(d, simulated=False)
                                                         for d in rt.node.devices))


async def _feed(lab: Lab, node: str, s: dict[str, Any]) -> None:
    """One monitoring sample as health.monitor takes it: recorded, then folded (after the loop's cache read)."""
    await lab.ctl.db(job_cache(lab.ctl).read, lab.ctl.store)
    record_sample(lab.ctl.nodes[node], s, lab.clock.time())
    observe(lab.ctl, lab.ctl.nodes[node], s, lab.clock.time())


async def test_eff_of_an_ended_job_from_the_samples_of_its_run(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("train", gpus=2, cpus=4, memory_mib=8192)
        await lab.round()
        (run,) = await lab.runs(job.id)
        busy, idle = (await lab.job(job.id)).placement[0].devices
        await _real_gpus(lab, run.node)
        for util, mem, cpu, rss in ((None, 100, None, 900), (90.0, 70_000, 300.0, 2000), (70.0, 40_000, 100.0, 1500)):
            lab.clock.advance(1.0)
            await _feed(lab, run.node, sample(
                [{"uuid": busy, "utilization_gpu": util, "memory_used_mib": mem},
                 {"uuid": idle, "utilization_gpu": 0.0, "memory_used_mib": 5}],
                [proc(100, busy, run.run_dir, cpu, rss)]))
        lab.clock.advance(597.0)
        await lab.finish(job.id, 3)
        await lab.round()
        await _feed(lab, run.node, sample([], []))  # the job holds nothing now: its tally is written out
        await lab.settle_tasks()
        assert lab.ctl.store.run_usage(job.id)
        e = await Api(lab.ctl).handle("eff", {"id": job.id}, os.getuid())
        assert (e["state"], e["exit_code"]) == ("FAILED", 3)
        (r,) = e["runs"]
        assert r["elapsed_s"] == pytest.approx(600.0) and r["gpus"] == 2
        assert r["gpu_hours"] == pytest.approx(2 * 600 / 3600, abs=1e-3) == e["gpu_hours"]
        util = e["gpu_utilization"]
        assert util["mean"] == pytest.approx((90 + 70 + 0 + 0 + 0) / 5, abs=0.1)
        assert (util["busiest"]["uuid"], util["busiest"]["mean"]) == (busy, 80.0)
        assert (util["idlest"]["uuid"], util["idlest"]["mean"]) == (idle, 0.0)
        mem = e["gpu_memory"]
        assert (mem["peak_mib"], mem["total_mib"], mem["uuid"]) == (70_000, 81920, busy)
        assert mem["ratio"] == pytest.approx(70_000 / 81920, abs=1e-4)
        cpu = e["cpu"]  # 300 % then 100 %, one second each: 4 CPU-s over 2 s of 4 CPUs asked
        assert (cpu["used_s"], cpu["covered_s"], cpu["cores_mean"]) == (4.0, 2.0, 2.0)
        assert cpu["efficiency"] == pytest.approx(0.5)
        assert e["host_memory"] == {"peak_mib": 2000, "requested_mib": 8192, "ratio": pytest.approx(2000 / 8192,
                                                                                                  abs=1e-4),
                                    "requested_from": "asked", "source": "gpu processes"}  # no cgroup read here
        assert r["gpu_utilization"] == util  # one run: its figures are the job's
    # a restarted controller finds them in the store
    async with Lab.open(tmp_path, clock=lab.clock) as again:
        e2 = await Api(again.ctl).handle("eff", {"id": job.id}, os.getuid())
        assert e2["gpu_utilization"] == e["gpu_utilization"] and e2["cpu"] == e["cpu"]


async def test_a_simulated_node_and_a_running_job_say_no_samples(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("train", gpus=1)
        await lab.round()
        (run,) = await lab.runs(job.id)
        (uuid,) = (await lab.job(job.id)).placement[0].devices
        lab.clock.advance(30.0)
        # the node helper says 0 % of a simulated GPU and lists no GPU tool: neither is a sample of the job
        await _feed(lab, run.node, {**sample([{"uuid": uuid, "utilization_gpu": 0.0, "memory_used_mib": 0}], None),
                                    "gpus": {"source": None, "devices": []}})
        e = await Api(lab.ctl).handle("eff", {"id": job.id}, os.getuid())
        assert e["state"] == "RUNNING" and e["runs"][0]["elapsed_s"] == pytest.approx(30.0)
        assert (e["gpu_utilization"], e["gpu_memory"], e["cpu"], e["host_memory"]) == (None, None, None, None)
        assert e["gpus"] and e["runs"][0]["gpus"] == 1


class Recorder:
    reply: dict[str, Any] = {}

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        assert op == "eff" and args == {"id": 5}
        return Recorder.reply


def cli(monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    monkeypatch.setattr("sys.argv", ["hsched", *argv])
    monkeypatch.setattr("hsched.cli.jobs._client", Recorder)
    with pytest.raises(SystemExit) as ex:
        main()
    return int(ex.value.code or 0)


async def test_the_cli_prints_each_figure_or_no_samples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("train", gpus=2, cpus=4, name="bert")
        await lab.round()
        (run,) = await lab.runs(job.id)
        a, b = (await lab.job(job.id)).placement[0].devices
        await _real_gpus(lab, run.node)
        for util in (40.0, 60.0):
            lab.clock.advance(1.0)
            await _feed(lab, run.node, sample([{"uuid": a, "utilization_gpu": util, "memory_used_mib": 2048},
                                               {"uuid": b, "utilization_gpu": 10.0, "memory_used_mib": 1024}], []))
        reply = await Api(lab.ctl).handle("eff", {"id": job.id}, os.getuid())
    Recorder.reply = json.loads(json.dumps({**reply, "id": 5, "display_id": "5"}))
    assert cli(monkeypatch, "eff", "5") == 0
    out = capsys.readouterr().out
    assert "Job 5 (bert) of alice" in out and "State: RUNNING" in out
    assert "GPU utilization: 30.0% mean (busiest GPU 50.0%, idlest 10.0%)" in out
    assert "GPU memory peak: 2.0 GiB of 80.0 GiB (2%)" in out
    # the processes were listed but none is the job's with a CPU reading: no CPU figure, said so
    assert "CPU efficiency: no samples" in out and "Host memory peak: no samples" in out
    assert cli(monkeypatch, "eff", "5", "--json") == 0
    assert json.loads(capsys.readouterr().out) == Recorder.reply
    assert cli(monkeypatch, "eff", "x5") == 2
    assert "expected a job id" in capsys.readouterr().err
