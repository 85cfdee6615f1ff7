"""eff and acct from the cgroup (issue 29, item 8), in-process on the fake clock:

- each run's cgroup readings (the samples' `run_usage`, and its exit record's last one) make seff's CPU and
  memory efficiency, for a job with GPUs or none, against --cpus/--mem or the node's share;
- one sample count: `hsched eff` never says "no samples" beside a profile built from 60 samples, and shows the
  profile's count;
- an ended job shows no time left (`show`'s progress, from its last report);
- `hsched acct` never shows an end before the start: a short job whose launch reply came back after the node's
  record of its end.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from hsched.cli import main
from hsched.controller.api import Api
from hsched.controller.launching import job_cache
from hsched.controller.usage import observe
from hsched.learn.efficiency import Allocation, RunTally, allocation, figures, figures_to_dict, fold_usage
from hsched.model import Job, JobSpec, JobState, Resources
from hsched.testing import CannedNode, Lab
from tests.controller.test_profiles import telemetry


def reading(cpu_s: float, peak_mib: float, **extra: Any) -> dict[str, Any]:
    return {"cpu_s": cpu_s, "memory_peak_mib": peak_mib, "memory_mib": peak_mib, "source": "cgroup", **extra}


async def _feed_usage(lab: Lab, node: str, run_dir: str, r: dict[str, Any]) -> None:
    """One monitoring sample carrying a cgroup reading of the run (as the node helper's watch sends every few
    samples, its run folder mapped by the executor)."""
    await lab.ctl.db(job_cache(lab.ctl).read, lab.ctl.store)
    observe(lab.ctl, lab.ctl.nodes[node], {"seq": 1, "gpus": {"source": None, "devices": []}, "processes": [],
                                           "run_usage": [{**r, "run_dir": run_dir, "job_run_dir": run_dir}]},
            lab.clock.time())


def test_usage_folds_are_cumulative_and_the_final_reading_wins_over_late_ones() -> None:
    t = RunTally(1, 1, "a")
    fold_usage(t, 10.0, "r0", reading(1.0, 100))
    fold_usage(t, 10.0, "r1", reading(2.0, 50))  # the same sample, another rank: one sample
    fold_usage(t, 15.0, "r0", reading(3.0, 80))  # the peak stays the highest seen
    fold_usage(t, 16.0, "r0", {**reading(3.5, 120), "final": True})
    fold_usage(t, 17.0, "r0", reading(9.0, 900))  # a stale sample after the end changes nothing
    assert t.samples == 3 and t.usage["r0"].final and not t.usage["r1"].final
    f = figures([t])
    assert (f.cpu_s, f.host_memory_peak_mib, f.source, f.final) == (5.5, 170, "cgroup", False)
    assert RunTally.from_dict(json.loads(json.dumps(t.to_dict()))) == t
    # a row kept before the cgroup figures: none, and its count from its GPUs
    old = RunTally.from_dict({"job_id": 1, "attempt": 1, "node": "a",
                              "devices": {"g": {"samples": 7, "util_samples": 7, "util_sum": 7.0}}})
    assert (old.samples, old.usage, figures([old]).source) == (7, {}, None)


def test_allocation_is_asked_or_the_nodes_share() -> None:
    def job(**res: Any) -> Job:
        return Job(1, JobSpec(command=("x",), resources=Resources(**res)), "u", JobState.COMPLETED, "", 0.0)

    nodes = {"a": (64, 512 * 1024, 8), "cpu": (16, 64 * 1024, 0)}
    asked = allocation(job(gpus=2, cpus=4, memory_mib=8192), {"a": 2}, 100.0, nodes)
    assert (asked.cores, asked.cores_from, asked.core_s, asked.memory_mib) == (4, "asked", 400.0, 8192.0)
    share = allocation(job(gpus=2), {"a": 2}, 100.0, nodes)  # 2 of 8 GPUs: a quarter of the node
    assert (share.cores, share.cores_from, share.memory_mib, share.memory_from) == (16.0, "node share",
                                                                                    128 * 1024.0, "node share")
    whole = allocation(job(), {"cpu": 0}, 10.0, nodes)  # a node without GPUs: all of it
    assert (whole.cores, whole.memory_mib) == (16.0, 64 * 1024.0)
    gone = allocation(job(), {"gone": 0}, 10.0, nodes)
    assert (gone.core_s, gone.memory_mib, gone.cores_from) == (None, None, "")
    t = RunTally(1, 1, "a")
    fold_usage(t, 1.0, "r0", reading(50.0, 2048))
    d = figures_to_dict(figures([t]), None, None, Allocation(400.0, 4.0, "asked", 8192.0, "asked", 100.0))
    assert d["cpu"]["efficiency"] == 0.125 and d["cpu"]["cores_mean"] == 0.5 and d["host_memory"]["ratio"] == 0.25


async def test_eff_has_cpu_and_memory_from_the_cgroup_for_a_job_without_gpus(tmp_path: Path) -> None:
    # today's eff showed no CPU or memory figure although every run has a cgroup that has them
    async with Lab.open(tmp_path, nodes=(CannedNode("a", "NVIDIA A100-SXM4-80GB", 8, cpus=64),)) as lab:
        job = await lab.submit("python", "prep.py", gpus=0, cpus=4, memory_mib=4096)
        await lab.round()
        (run,) = await lab.runs(job.id)
        for i in range(1, 6):
            lab.clock.advance(10.0)  # 2 cores busy: 20 CPU-s every 10 s
            await _feed_usage(lab, run.node, run.run_dir, reading(20.0 * i, 1000.0 + i))
        lab.clock.advance(3.0)  # asked between two readings: the figures are as of the last one, 50 s in
        running = await Api(lab.ctl).handle("eff", {"id": job.id}, os.getuid())
        assert running["samples"] == 5 and running["cpu"]["used_s"] == 100.0 and not running["final"]
        assert running["cpu"]["covered_s"] == 50.0 and running["runs"][0]["elapsed_s"] == 53.0
        assert running["cpu"]["efficiency"] == pytest.approx(100.0 / (4 * 50.0), abs=1e-4)
        lab.clock.advance(7.0)
        # the exit record's last reading: the cgroup's totals once every process was gone
        lab.executors[run.node].runs[run.run_dir].usage = {**reading(118.0, 3000.0), "final": True}
        await lab.finish(job.id, 0)
        await lab.round()
        await lab.ctl.db(job_cache(lab.ctl).read, lab.ctl.store)
        observe(lab.ctl, lab.ctl.nodes[run.node], {"seq": 2}, lab.clock.time())  # a sample: the tally is written out
        await lab.settle_tasks()
        assert lab.ctl.store.run_usage(job.id)
        e = await Api(lab.ctl).handle("eff", {"id": job.id}, os.getuid())
    assert e["state"] == "COMPLETED" and e["final"] and e["samples"] == 5
    (r,) = e["runs"]
    assert r["elapsed_s"] == pytest.approx(60.0)
    assert e["cpu"] == {"used_s": 118.0, "covered_s": 60.0, "cores_mean": pytest.approx(1.97, abs=0.01), "cpus": 4,
                        "cpus_from": "asked", "core_s": 240.0, "efficiency": pytest.approx(118 / 240, abs=1e-4),
                        "source": "cgroup"}
    assert e["host_memory"] == {"peak_mib": 3000, "requested_mib": 4096, "requested_from": "asked",
                                "ratio": pytest.approx(3000 / 4096, abs=1e-4), "source": "cgroup"}
    assert e["profile"]["samples"] == e["samples"]


async def test_eff_counts_the_samples_its_profile_was_built_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # today: "GPU utilization: no samples" beside a profile of 60 samples (a simulated node's readings)
    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("python", "train.py", gpus=1)
        await lab.round()
        (run,) = await lab.runs(job.id)
        lab.clock.advance(5.0)
        # the run's cgroup is real on a simulated node: read once before the GPUs' made-up readings come
        await _feed_usage(lab, run.node, run.run_dir, reading(4.0, 900.0))
        await telemetry(lab, 600.0)  # 60 readings, 10 s apart
        e = await Api(lab.ctl).handle("eff", {"id": job.id}, os.getuid())
    assert e["profile"]["samples"] == e["samples"] == e["runs"][0]["samples"] == 61
    assert e["simulated"] and e["gpu_utilization"] is None  # made up, so not a measured figure
    assert e["profile"]["reason"].endswith("(simulated readings)")  # the tally the cgroup reading began stays so
    assert (e["cpu"]["used_s"], e["cpu"]["source"], e["host_memory"]["peak_mib"]) == (4.0, "cgroup", 900)
    monkeypatch.setattr("sys.argv", ["hsched", "eff", str(job.id)])
    monkeypatch.setattr("hsched.cli.jobs._client", lambda: _Reply(json.loads(json.dumps(e))))
    with pytest.raises(SystemExit) as ex:
        main()
    out = capsys.readouterr().out
    assert ex.value.code in (0, None)
    assert "Samples: 61" in out and "GPU utilization: simulated GPUs" in out
    assert "GPU utilization: no samples" not in out and "GPU memory peak: no samples" not in out


class _Reply:
    def __init__(self, reply: dict[str, Any]) -> None:
        self.reply = reply

    def __enter__(self) -> _Reply:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        assert op == "eff"
        return self.reply


async def test_an_ended_job_shows_no_time_left(tmp_path: Path) -> None:
    # today: a completed job's `show` still carried its last report's "remaining_s" (about 0m04s left)
    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("python", "train.py", gpus=1)
        await lab.round()
        await lab.finish(job.id, 0)
        await lab.round()
        await lab.ctl.db(lab.ctl.store.save_run_progress, job.id, 1, {
            "attempt": 1, "step": 96.0, "total": 100.0, "steps_per_s": 1.0, "remaining_s": 4.0, "gpus": 1,
            "gpu_type": "A100", "class": "single", "reports": 9})
        d = await Api(lab.ctl).handle("show", {"id": job.id}, os.getuid())
    assert d["state"] == "COMPLETED"
    assert d["progress"]["step"] == 96.0 and d["progress"]["remaining_s"] is None


async def test_acct_never_shows_an_end_before_the_start(tmp_path: Path) -> None:
    # today: a job's start was when the launch's reply came back; a short job's node-recorded end (clamped only
    # to its run's start, before the launch) could come before it
    async with Lab.open(tmp_path) as lab:
        ex = lab.executors["a"]
        launch = ex.launch

        async def slow_reply(req: Any) -> Any:
            handle = await launch(req)
            lab.clock.advance(3.0)  # the node started it at once; its reply took 3 s to come back
            return handle

        ex.launch = slow_reply  # type: ignore[method-assign]
        job = await lab.submit("true", gpus=1)
        await lab.round()
        (run,) = await lab.runs(job.id)
        assert run.start_time is not None
        await lab.finish(job.id, 0, end_time=run.start_time + 1.0)  # it ran for one second
        await lab.round()
        ended = await lab.job(job.id)
        reply = await Api(lab.ctl).handle("acct", {"since": 0.0}, os.getuid())
    assert ended.start_time is not None and ended.end_time is not None
    assert ended.start_time <= ended.end_time and ended.end_time - ended.start_time == pytest.approx(1.0)
    (j,) = reply["jobs"]
    assert j["start_time"] <= j["end_time"]
