"""Predictions from the real round (issue 29, item 5): `submit --test-only` and `queue --start` step a copy of the
round's snapshot forward with the round itself (hsched.controller.forecast), so a reservation, an interconnect
request and a node only one job fits at a time are what the round makes of them; then the controller is run forward
on the fake clock and what it did is compared with what was predicted. In-process."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from hsched.controller import commands, forecast
from hsched.controller.api import Api
from hsched.model import Job, JobState
from hsched.serialize import iso
from hsched.testing import CannedNode, Lab

A100 = "NVIDIA A100-SXM4-80GB"


def _spec(*command: str, gpus: int = 1, **resources: Any) -> dict[str, Any]:
    return {"command": list(command), "resources": {"gpus": gpus, **resources}}


async def _test_only(lab: Lab, spec: dict[str, Any], user: str = "alice") -> dict[str, Any]:
    """`submit --test-only` as `user` (Lab.submit's): fair share orders the round, so the user matters."""
    return await forecast.test_only(lab.ctl, Api(lab.ctl)._spec({"spec": spec}), user)


async def _submit(lab: Lab, spec: dict[str, Any], user: str = "alice") -> Job:
    return await commands.submit(lab.ctl, Api(lab.ctl)._spec({"spec": spec}), user, None)


async def _starts(lab: Lab) -> dict[str, dict[str, Any]]:
    got: dict[str, dict[str, Any]] = await Api(lab.ctl).handle("starts", {"detail": True}, os.getuid())
    return got


async def test_a_job_behind_a_reservation_is_not_said_to_start_now(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=(CannedNode("box", A100, 8),)) as lab:
        small = [await lab.submit("python3", "s.py", gpus=1, time_limit_s=100.0) for _ in range(8)]
        await lab.round()
        t0 = lab.clock.time()
        gang = await lab.submit("python3", "ddp.py", gpus=8, time_limit_s=500.0)
        await lab.round()
        # one small job ends early: its GPU is free, but reserved for the gang from t0 + 100
        lab.clock.advance(50.0)
        await lab.finish(small[0].id, 0)
        await lab.round()
        assert "reserved" in (await lab.job(gang.id)).reason
        guess = await _test_only(lab, _spec("python3", "serve.py"))
        # an endless job would hold a reserved GPU: the round starts it after the gang, on box
        assert not guess["now"], guess
        assert guess["start_time"] == iso(t0 + 600.0) and guess["nodes"] == ["box"]
        assert guess["waits_for"] == [gang.id]
        # and it does: the rest end at their limits, the gang runs its 500 s, then the job starts
        job = await lab.submit("python3", "serve.py", gpus=1)
        await lab.round()
        assert not (await lab.job(job.id)).placement
        lab.clock.advance(t0 + 100.0 - lab.clock.time())
        for j in small[1:]:
            await lab.finish(j.id, 0)
        await lab.round()
        await lab.round()
        assert (await lab.job(gang.id)).state is JobState.RUNNING
        assert not (await lab.job(job.id)).placement
        lab.clock.advance(500.0)
        await lab.finish(gang.id, 0)
        await lab.round()
        await lab.round()
        started = await lab.job(job.id)
        assert started.start_time == pytest.approx(t0 + 600.0) and started.placement[0].node == "box"


async def test_an_nvlink_job_is_never_predicted_onto_a_pcie_node(tmp_path: Path) -> None:
    nodes = (CannedNode("pci", A100, 4, topology="pcie"), CannedNode("nv", A100, 4))
    async with Lab.open(tmp_path, nodes=nodes) as lab:
        busy = await lab.submit("python3", "train.py", gpus=4, time_limit_s=300.0)
        await lab.round()
        assert (await lab.job(busy.id)).placement[0].node == "nv"  # (NVLink first for a 4-GPU job)
        t0 = (await lab.job(busy.id)).start_time
        assert t0 is not None
        guess = await _test_only(lab, _spec("python3", "ddp.py", gpus=2, interconnect="nvlink"))
        assert guess["nodes"] == ["nv"] and guess["start_time"] == iso(t0 + 300.0) and not guess["now"], guess
        # without the request it would start now on the PCIe node
        plain = await _test_only(lab, _spec("python3", "ddp.py", gpus=2))
        assert plain["now"] and plain["nodes"] == ["pci"]
        # and the round does what was predicted: the job waits for nv, not on pci
        job = await _submit(lab, _spec("python3", "ddp.py", gpus=2, interconnect="nvlink"))
        await lab.round()
        assert not (await lab.job(job.id)).placement
        lab.clock.advance(t0 + 300.0 - lab.clock.time())
        await lab.finish(busy.id, 0)
        await lab.round()
        await lab.round()
        started = await lab.job(job.id)
        assert started.start_time == pytest.approx(t0 + 300.0) and started.placement[0].node == "nv"


async def test_two_eight_gpu_jobs_on_the_only_eight_gpu_node_one_after_the_other(tmp_path: Path) -> None:
    nodes = (CannedNode("big", A100, 8), CannedNode("small", A100, 4))
    async with Lab.open(tmp_path, nodes=nodes) as lab:
        wide = await lab.submit("python3", "w.py", gpus=4, time_limit_s=5000.0)
        await lab.round()
        one = await lab.submit("python3", "o.py", gpus=1, time_limit_s=100.0)
        await lab.round()
        assert [(await lab.job(j.id)).placement[0].node for j in (wide, one)] == ["small", "big"]
        t0 = (await lab.job(one.id)).start_time
        assert t0 is not None
        first = await lab.submit("python3", "a.py", gpus=8, time_limit_s=1000.0)
        second = await lab.submit("python3", "b.py", gpus=8, time_limit_s=1000.0)
        endless = await lab.submit("python3", "serve.py", gpus=1)
        await lab.round()
        got = await _starts(lab)
        # the first 8-GPU job holds a reservation on big: the endless job does not take one of its free GPUs
        # (it starts when the second ends); the two run one after the other, each at the one before's predicted end
        # (its time limit: nothing else is known of it)
        assert [got[str(j.id)]["start_time"] for j in (first, second, endless)] == [
            iso(t0 + 100.0), iso(t0 + 1100.0), iso(t0 + 2100.0)], got
        assert [got[str(j.id)]["nodes"] for j in (first, second, endless)] == [["big"], ["big"], ["big"]]
        assert got[str(second.id)]["waits_for"] == [first.id]
        # the plain answer (older clients): the ISO times
        plain = await Api(lab.ctl).handle("starts", {}, os.getuid())
        assert plain[str(second.id)] == iso(t0 + 1100.0)
        # the controller then does so
        for at, ended in ((100.0, one), (1100.0, first)):
            lab.clock.advance(t0 + at - lab.clock.time())
            await lab.finish(ended.id, 0)
            await lab.round()
            await lab.round()
        for j, at in ((first, 100.0), (second, 1100.0)):
            started = await lab.job(j.id)
            assert started.start_time == pytest.approx(t0 + at) and started.placement[0].node == "big"
        assert not (await lab.job(endless.id)).placement
