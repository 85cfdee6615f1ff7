"""Run profiles from telemetry (issue 14, item 3): the classifier on hand-made tallies, and in-process on a fake
clock: simulated GPUs read as their job's declared nature (HSCHED_SIM_NATURE) and each job is classified as
it declared; an idle job is flagged once its GPUs have been idle for `idle_after_s`, not before, and the flag
clears when it computes again; `show`, `eff` and `kinds` carry the profile."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from hsched.config import Settings
from hsched.controller import commands
from hsched.controller.api import Api
from hsched.controller.health import check_idle, record_sample, simulate_telemetry
from hsched.controller.launching import job_cache
from hsched.controller.usage import IDLE_CHECK_S, observe
from hsched.learn.efficiency import RunTally, figures, fold
from hsched.learn.profiles import (
    COMPUTE_BOUND_PCT,
    IDLE_UTIL_PCT,
    INPUT_GPU_MAX_PCT,
    MEMORY_BOUND_PCT,
    NVLINK_BUSY_MIB_S,
    PCIE_BUSY_MIB_S,
    Profile,
    characterize,
    most_common,
    sim_nature,
)
from hsched.model import Job, JobSpec, Resources
from hsched.testing import CannedNode, Lab

# ------------------------------------------------------------------------------------------ the classifier


def tally(n: int, *, util: float, mem: float | None = None, nvlink: float | None = None,
          pcie: float | None = None, cpu: float | None = None, gpus: int = 1, step: float = 10.0) -> RunTally:
    """A run of `n` samples `step` seconds apart reading these figures on each GPU (`cpu`: % of its process)."""
    t = RunTally(1, 1, "a")
    uuids = [f"g{i}" for i in range(gpus)]
    for i in range(n):
        r: dict[str, Any] = {"utilization_gpu": util, "memory_used_mib": 1000}
        if mem is not None:
            r["utilization_memory"] = mem
        if nvlink is not None:
            r |= {"nvlink_tx_mib_s": nvlink / 2, "nvlink_rx_mib_s": nvlink / 2}
        if pcie is not None:
            r["pcie_tx_mib_s"] = pcie  # only one direction read: counted alone
        procs = None if cpu is None else [{"pid": 7 + k, "uuid": u, "cpu_percent": cpu, "rss_mib": 10}
                                          for k, u in enumerate(uuids)]
        fold(t, 1000.0 + step * i, {u: r for u in uuids}, {u: 80_000 for u in uuids}, procs)
    return t


@pytest.mark.parametrize(("t", "profile"), [
    (tally(20, util=95, mem=30, nvlink=100, pcie=50, cpu=50), Profile.COMPUTE),
    (tally(20, util=COMPUTE_BOUND_PCT, mem=None), Profile.COMPUTE),  # memory bandwidth unknown: still compute
    (tally(20, util=85, mem=MEMORY_BOUND_PCT), Profile.MEMORY),
    (tally(20, util=80, mem=30, nvlink=NVLINK_BUSY_MIB_S), Profile.COMMUNICATION),
    (tally(20, util=80, mem=30, pcie=PCIE_BUSY_MIB_S), Profile.COMMUNICATION),
    # collectives keep the GPU "busy": the links, checked first, say what it waits on
    (tally(20, util=99, mem=70, nvlink=2 * NVLINK_BUSY_MIB_S), Profile.COMMUNICATION),
    (tally(20, util=20, mem=5, cpu=150, gpus=2), Profile.INPUT),
    # a busy GPU is never input-bound, however busy the host
    (tally(20, util=INPUT_GPU_MAX_PCT, cpu=400), Profile.UNKNOWN),
    # a slow GPU and an idle host: no bottleneck the readings can name
    (tally(20, util=30, mem=10, cpu=10), Profile.UNKNOWN),
    (tally(20, util=20, mem=5), Profile.UNKNOWN),  # the host's CPU not sampled: input-bound not claimed
    (tally(4, util=99, mem=10), Profile.UNKNOWN),  # too few readings
    (tally(200, util=0, cpu=1), Profile.IDLE),  # 1990 s of nothing, past the 30 min default
    (tally(100, util=0, cpu=1), Profile.UNKNOWN),  # 990 s: not yet
])
def test_classify(t: RunTally, profile: Profile) -> None:
    c = characterize([t])
    assert c.profile is profile, c.reason


def test_the_reason_says_what_was_not_measured() -> None:
    c = characterize([tally(20, util=95)])
    assert c.profile is Profile.COMPUTE
    assert "memory bandwidth not reported" in c.reason and "interconnect unknown" in c.reason
    assert "host CPU not sampled" in c.reason
    assert c.signals.nvlink_mib_s is None and c.to_dict()["nvlink_mib_s"] is None  # unknown, never 0


def test_idle_is_measured_from_the_last_busy_reading_up_to_now() -> None:
    t = tally(10, util=90)  # busy from 1000 to 1090
    fold(t, 1100.0, {"g0": {"utilization_gpu": 1.0}}, {"g0": 80_000}, None)
    fold(t, 1110.0, {"g0": {}}, {"g0": 80_000}, None)  # read, but no utilization: neither idle nor busy
    fold(t, 1120.0, {"g0": {"utilization_gpu": IDLE_UTIL_PCT - 0.1}}, {"g0": 80_000}, None)
    assert t.idle_since == 1100.0
    c = characterize([t], now=1100.0 + 600, idle_after_s=600)
    assert (c.profile, c.signals.idle_for_s) == (Profile.IDLE, 600.0)
    assert characterize([t], now=1100.0 + 599, idle_after_s=600).profile is not Profile.IDLE
    fold(t, 1130.0, {"g0": {"utilization_gpu": IDLE_UTIL_PCT}}, {"g0": 80_000}, None)
    assert t.idle_since is None and characterize([t], now=5000.0, idle_after_s=600).profile is Profile.COMPUTE


def test_a_gang_is_idle_only_when_every_node_is() -> None:
    a, b = tally(10, util=0), tally(10, util=90)
    b.node = "b"
    assert characterize([a, b], now=99_999.0, idle_after_s=60).signals.idle_for_s is None
    b2 = tally(10, util=0)
    b2.node = "b"
    fold(b2, 1200.0, {"g0": {"utilization_gpu": 0.0}}, {"g0": 80_000}, None)
    assert characterize([a, b2], now=1300.0, idle_after_s=60).signals.idle_for_s == 1300.0 - 1000.0


def test_new_sums_survive_the_store_and_old_rows_read_as_absent() -> None:
    t = tally(6, util=80, mem=60, nvlink=1000, pcie=10, cpu=50)
    t.simulated = True
    assert RunTally.from_dict(json.loads(json.dumps(t.to_dict()))) == t
    old = {"job_id": 1, "attempt": 1, "node": "a", "first_t": 1.0, "last_t": 9.0, "cpu_s": 0.0,
           "devices": {"g0": {"memory_total_mib": 80_000, "samples": 9, "util_sum": 900.0, "util_samples": 9,
                              "memory_peak_mib": 5}}}  # a row kept before profiles
    r = RunTally.from_dict(old)
    assert (r.simulated, r.idle_since, r.devices["g0"].mem_util_samples, r.devices["g0"].nvlink_samples) == (
        False, None, 0, 0)
    c = characterize([r])
    assert c.profile is Profile.COMPUTE and c.signals.memory_util is None and c.signals.pcie_mib_s is None


def test_simulated_tallies_feed_profiles_and_never_eff() -> None:
    t = tally(10, util=95, cpu=50)
    t.simulated = True
    f = figures([t])
    # made-up readings are no figures, but they were samples: counted as the profile counts them (issue 29)
    assert (f.utilization_mean, f.cpu_s, f.samples, f.simulated) == (None, None, 10, True)
    c = characterize([t])
    assert c.signals.samples == f.samples
    assert c.profile is Profile.COMPUTE and c.signals.simulated and c.reason.endswith("(simulated readings)")


def test_sim_nature_and_most_common() -> None:
    assert sim_nature((("A", "1"), ("HSCHED_SIM_NATURE", " Memory-Bound"))) is Profile.MEMORY
    assert sim_nature({"HSCHED_SIM_NATURE": "unknown"}) is None and sim_nature({"HSCHED_SIM_NATURE": "x"}) is None
    assert sim_nature(()) is None
    best, counts = most_common([Profile.UNKNOWN] * 3 + [Profile.INPUT, Profile.COMPUTE, Profile.INPUT])
    assert best is Profile.INPUT and counts == {"unknown": 3, "input-bound": 2, "compute-bound": 1}
    assert most_common([Profile.MEMORY, Profile.COMPUTE])[0] is Profile.COMPUTE  # a tie: Profile's order
    assert most_common([Profile.UNKNOWN]) == (None, {"unknown": 1})


# ------------------------------------------------------------------------------------------ in-process


async def submit(lab: Lab, nature: str | None, *, gpus: int = 1, kind: str = "") -> Job:
    env = (("HSCHED_SIM_NATURE", nature),) if nature else ()
    spec = JobSpec(command=("python", "train.py"), env=env, resources=Resources(gpus=gpus), kind=kind)
    return await commands.submit(lab.ctl, spec, "alice", None)


async def telemetry(lab: Lab, seconds: float, every: float = 10.0) -> None:
    """The health loop's simulated readings every `every` seconds for `seconds`, with its idle check after each."""
    ctl = lab.ctl
    for _ in range(int(seconds // every)):
        lab.clock.advance(every)
        jobs = await ctl.db(job_cache(ctl).read, ctl.store)
        simulate_telemetry(ctl, ctl.owners(jobs.active), lab.clock.time())
        await check_idle(ctl, lab.clock.time())


async def show(lab: Lab, job_id: int) -> dict[str, Any]:
    return json.loads(json.dumps(await Api(lab.ctl).handle("show", {"id": job_id}, os.getuid())))


@pytest.mark.parametrize("topology", ["nvswitch", "pcie"])
async def test_each_declared_nature_is_classified_as_declared(tmp_path: Path, topology: str) -> None:
    nodes = (CannedNode("a", "NVIDIA A100-SXM4-80GB", 8, topology=topology),)
    async with Lab.open(tmp_path, nodes=nodes) as lab:
        natures = [p for p in Profile if p not in (Profile.UNKNOWN, Profile.IDLE)]
        jobs = {p: await submit(lab, p.value, gpus=1 if p is Profile.COMPUTE else 2) for p in natures}
        plain = await submit(lab, None)
        await lab.round()
        await telemetry(lab, 300.0)
        for p, job in jobs.items():
            prof = (await show(lab, job.id))["profile"]
            assert prof["profile"] == p.value, prof
            assert prof["simulated"] is True and prof["flagged"] is False
            assert prof["reason"].endswith("(simulated readings)")
        comm = (await show(lab, jobs[Profile.COMMUNICATION].id))["profile"]
        # over NVLink where the GPUs have peers, else over PCIe
        assert (comm["nvlink_mib_s"] is not None) == (topology == "nvswitch")
        assert comm["pcie_mib_s"] >= (PCIE_BUSY_MIB_S if topology == "pcie" else 0)
        # no nature declared: the plain busy readings, without the figures a GPU tool may not give
        p = (await show(lab, plain.id))["profile"]
        assert (p["memory_util"], p["nvlink_mib_s"], p["pcie_mib_s"], p["cpu_cores"]) == (None, None, None, None)
        assert "interconnect unknown" in p["reason"]
        # eff keeps its rule: made-up readings are no samples for its figures, but it gives the profile
        e = await Api(lab.ctl).handle("eff", {"id": jobs[Profile.MEMORY].id}, os.getuid())
        assert (e["gpu_utilization"], e["cpu"]) == (None, None)
        assert e["profile"]["profile"] == "memory-bound" and e["runs"][0]["profile"] == e["profile"]


async def test_an_idle_job_is_flagged_after_its_threshold_and_not_before(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, settings=Settings(idle_after_s=600.0)) as lab:
        idle = await submit(lab, "idle")
        busy = await submit(lab, "compute-bound")
        await lab.round()
        started = lab.clock.time()
        # the first reading starts the idle spell, 10 s in; the flag may come up to a check interval after it
        await telemetry(lab, 600.0)
        assert "idle" not in await lab.events(idle.id)
        p = (await show(lab, idle.id))["profile"]
        assert p["profile"] == "unknown" and "idle for 9m50s so far" in p["reason"] and not p["flagged"]
        await telemetry(lab, 10.0 + IDLE_CHECK_S)
        assert lab.clock.time() - started <= 10.0 + 600.0 + IDLE_CHECK_S + 10.0
        assert (await lab.events(idle.id)).count("idle") == 1
        p = (await show(lab, idle.id))["profile"]
        assert p["profile"] == "idle" and p["flagged"] and p["idle_for_s"] >= 600.0
        (ev,) = [e for e in await lab.ctl.db(lab.ctl.store.events, idle.id) if e["kind"] == "idle"]
        assert "holds its GPUs and does nothing" in ev["message"] and ev["data"]["gpu_util"] == 0.0
        await telemetry(lab, 1200.0)
        assert (await lab.events(idle.id)).count("idle") == 1  # flagged once
        assert "idle" not in await lab.events(busy.id)
        assert (await show(lab, busy.id))["profile"]["profile"] == "compute-bound"
        assert (await lab.job(idle.id)).state.value == "RUNNING"  # nothing done to it


def sample(uuid: str, util: float) -> dict[str, Any]:
    return {"seq": 1, "boot_id": "b", "gpus": {"source": "nvml", "devices": [
        {"uuid": uuid, "utilization_gpu": util, "memory_used_mib": 1000, "utilization_memory": util / 3}]},
        "gpu_error": None, "processes": []}


async def test_the_flag_clears_when_real_gpus_compute_again(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, settings=Settings(idle_after_s=300.0)) as lab:
        job = await submit(lab, None)
        await lab.round()
        (run,) = await lab.runs(job.id)
        (uuid,) = (await lab.job(job.id)).placement[0].devices
        rt = lab.ctl.nodes[run.node]
        # the node's GPUs as a real node's: its readings are samples (hsched.controller.usage.observe)
        rt.node = dataclasses.replace(rt.node, devices=tuple(dataclasses.replace(d, simulated=False)
                                                             for d in rt.node.devices))

        async def feed(util: float, seconds: float) -> None:
            for _ in range(int(seconds // 10)):
                lab.clock.advance(10.0)
                await lab.ctl.db(job_cache(lab.ctl).read, lab.ctl.store)
                s = sample(uuid, util)
                record_sample(rt, s, lab.clock.time())
                observe(lab.ctl, rt, s, lab.clock.time())
                await check_idle(lab.ctl, lab.clock.time())

        await feed(90.0, 100.0)
        await feed(1.0, 290.0)
        assert "idle" not in await lab.events(job.id)
        await feed(1.0, 30.0)
        assert (await lab.events(job.id)).count("idle") == 1
        p = (await show(lab, job.id))["profile"]
        assert (p["profile"], p["flagged"], p["simulated"]) == ("idle", True, False)
        await feed(80.0, 20.0)
        assert (await lab.events(job.id))[-1] == "busy"
        p = (await show(lab, job.id))["profile"]
        assert p["flagged"] is False and p["idle_for_s"] is None and p["profile"] != "idle"
        await feed(1.0, 400.0)  # idle again past the threshold: flagged again
        assert (await lab.events(job.id)).count("idle") == 2


async def test_kinds_gives_each_kinds_usual_profile(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        a = [await submit(lab, "input-bound", kind="loader") for _ in range(2)]
        b = await submit(lab, "memory-bound", kind="attn")
        await lab.round()
        await telemetry(lab, 120.0)
        for j in (*a, b):
            await lab.finish(j.id, 0)
        await lab.round()
        await lab.ctl.db(job_cache(lab.ctl).read, lab.ctl.store)
        simulate_telemetry(lab.ctl, {}, lab.clock.time())  # the next readings write the ended tallies out
        await lab.settle_tasks()
        assert lab.ctl.store.run_usage(b.id)
        kinds = {k["kind"]: k for k in await Api(lab.ctl).handle("kinds", {}, os.getuid())}
        assert (kinds["loader"]["profile"], kinds["loader"]["profiles"]) == ("input-bound", {"input-bound": 2})
        assert kinds["attn"]["profile"] == "memory-bound"
        # an ended job's profile comes from the store
        assert (await show(lab, b.id))["profile"]["profile"] == "memory-bound"


class Recorder:
    replies: dict[str, Any] = {}

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def call(self, op: str, **args: Any) -> Any:
        return Recorder.replies[op]


def cli(monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    from hsched.cli import main

    monkeypatch.setattr("sys.argv", ["hsched", *argv])
    monkeypatch.setattr("hsched.cli.jobs._client", Recorder)
    monkeypatch.setattr("hsched.client.Client", Recorder)
    with pytest.raises(SystemExit) as ex:
        main()
    return int(ex.value.code or 0)


async def test_show_eff_and_kinds_print_the_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    async with Lab.open(tmp_path, settings=Settings(idle_after_s=60.0)) as lab:
        job = await submit(lab, "idle", kind="notebook")
        await lab.round()
        await telemetry(lab, 120.0)
        api = Api(lab.ctl)
        replies = {op: await api.handle(op, {"id": job.id}, os.getuid()) for op in ("show", "eff", "kinds")}
    Recorder.replies = json.loads(json.dumps(replies))
    Recorder.replies["show"]["display_id"] = Recorder.replies["eff"]["display_id"] = "5"
    assert cli(monkeypatch, "show", "5") == 0
    out = capsys.readouterr().out
    assert "profile: idle (flagged): every GPU under 5% for 1m" in out and "(simulated readings)" in out
    assert cli(monkeypatch, "eff", "5") == 0
    out = capsys.readouterr().out
    # simulated readings are not measured, but neither are they "no samples" beside a profile built on them
    assert "Profile: idle (flagged): every GPU under 5%" in out and "GPU utilization: no samples" not in out
    assert "GPU utilization: simulated GPUs: made-up readings, not measured" in out
    assert f"Samples: {replies['eff']['profile']['samples']}" in out and replies["eff"]["samples"] > 0
    assert cli(monkeypatch, "kinds") == 0
    lines = [x.split() for x in capsys.readouterr().out.splitlines() if x.startswith("notebook")]
    assert lines[0][:5] == ["notebook", "1", "0", "idle", "1/1"]  # one table: NOW, DONE, the usual profile
    assert cli(monkeypatch, "show", "5", "--json") == 0
    assert json.loads(capsys.readouterr().out)["profile"]["profile"] == "idle"


def test_the_dashboards_job_detail_has_a_profile_line() -> None:
    from hsched.tui.job_screen import detail_table
    from rich.console import Console

    def rendered(profile: dict[str, Any] | None) -> str:
        con = Console(width=160, record=True, color_system=None)
        con.print(detail_table({"id": 3, "name": "x", "state": "RUNNING", "profile": profile}))
        return con.export_text()

    (line,) = [x for x in rendered({"profile": "idle", "flagged": True, "reason": "every GPU under 5% for 31m00s"})
               .splitlines() if x.startswith("profile")]
    assert "idle (flagged)  every GPU under 5% for 31m00s" in line
    assert "- (no GPU readings)" in rendered(None)
