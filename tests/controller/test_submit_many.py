"""Submitting (issue 18): the submitter's environment is kept in the job's own transaction (once per distinct
environment), and `submit_many` queues many jobs in one request and one transaction: all of them or none."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from hsched.controller.api import SUBMIT_MANY_MAX, Api
from hsched.errors import UserError
from hsched.testing import Lab

ME = os.getuid()
ENV = {"PATH": "/bin", "PWD": "/data/me", "WANDB_MODE": "offline"}


def item(*command: str, **more: Any) -> dict[str, Any]:
    return {"spec": {"command": list(command), **more}, "source": "<script>"}


async def test_a_batch_is_queued_in_order_with_its_environment(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        api = Api(lab.ctl)
        jobs = await api.handle("submit_many", {"jobs": [item("a"), item("b", hold=True),
                                                         item("c", array="0-2")], "environ": ENV}, ME)
        assert [j["command"] for j in jobs] == [["a"], ["b"], ["c"]]
        assert [j["state"] for j in jobs] == ["PENDING"] * 3 and jobs[1]["reason"] == "JobHeldUser"
        assert jobs[2]["array_id"] == jobs[2]["id"]  # an array's first task stands for the array
        queued = await api.handle("queue", {}, ME)
        assert len(queued) == 5  # a, b and the array's three tasks
        for j in jobs:
            assert lab.ctl.load_env(j["id"]) == ENV
        one = await api.handle("submit", {"spec": {"command": ["d"]}, "environ": ENV}, ME)
        assert lab.ctl.load_env(one["id"]) == ENV
        # four jobs, one environment kept
        assert lab.ctl.store.db.execute("SELECT COUNT(*) FROM envs").fetchone()[0] == 1
        assert lab.ctl.store.db.execute("SELECT COUNT(*) FROM job_envs").fetchone()[0] == 4


async def test_one_refused_job_queues_none(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        api = Api(lab.ctl)
        before = await api.handle("queue", {"all": True}, ME)
        for jobs, words in [
            ([item("a"), item("b", priority="high")], "jobs[1]: <script>: priority"),
            ([item("a"), item("b"), item("c", qos="gold")], "jobs[2]: <script>: qos"),
            ([item("a", dependency="afterok:999")], "jobs[0]: dependency: job 999 does not exist"),
            ([item("a"), {"spec": "x"}], "jobs[1]: spec: expected a job spec object, found a string"),
            ([item("a"), 7], "jobs[1]: expected an object with spec and source, found a number"),
            ([item("a", resources={"gpus": 99})], "jobs[0]: job request cannot be satisfied by this fleet"),
        ]:
            with pytest.raises(UserError) as err:
                await api.handle("submit_many", {"jobs": jobs}, ME)
            assert words in str(err.value)
            assert all(p.startswith("jobs[") and "\n" not in p for p in err.value.problems)
        assert await api.handle("queue", {"all": True}, ME) == before


@pytest.mark.parametrize(("args", "words"), [
    ({}, "jobs: expected a list of {spec, source} objects, found null"),
    ({"jobs": {"spec": {}}}, "jobs: expected a list"),
    ({"jobs": []}, "jobs: expected at least one job"),
    ({"jobs": [item("a")] * (SUBMIT_MANY_MAX + 1)}, f"jobs: at most {SUBMIT_MANY_MAX} in one request"),
    ({"jobs": [item("a")], "environ": {"A": 1}}, "environ: expected an object of strings"),
])
async def test_bad_batch_arguments_are_one_line(tmp_path: Path, args: dict[str, Any], words: str) -> None:
    async with Lab.open(tmp_path) as lab:
        with pytest.raises(UserError) as err:
            await Api(lab.ctl).handle("submit_many", args, ME)
        assert words in str(err.value) and len(err.value.problems) == 1


async def test_the_environment_of_a_job_from_before_is_still_read_from_its_file(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("old")  # no environment in the store, as an older hsched left it
        assert lab.ctl.load_env(job.id) is None
        path = lab.ctl.env_file(job.id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"OLD": "1"}))
        assert lab.ctl.load_env(job.id) == {"OLD": "1"}
        lab.ctl.save_env(job.id, {"NEW": "2"})  # kept in the store from now on, which wins
        assert lab.ctl.load_env(job.id) == {"NEW": "2"}


async def test_environments_are_read_from_any_thread_while_the_store_writes(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        api = Api(lab.ctl)
        first = await api.handle("submit", {"spec": {"command": ["a"]}, "environ": ENV}, ME)
        seen: list[Any] = []
        stop = threading.Event()

        def reader() -> None:  # as the launcher reads it (asyncio.to_thread) while submits commit
            while not stop.is_set():
                seen.append(lab.ctl.load_env(first["id"]))

        t = threading.Thread(target=reader)
        t.start()
        try:
            for i in range(30):
                await api.handle("submit", {"spec": {"command": ["b"]}, "environ": {**ENV, "I": str(i)}}, ME)
        finally:
            stop.set()
            t.join()
        assert seen and all(e == ENV for e in seen)
