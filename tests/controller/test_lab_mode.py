"""Lab mode in-process (hsched.testing.Lab on a fake clock): who may act on which job, identities from the
peer's uid only, admins, users absent on a node, and the launch request that makes a node run a job as its
owner. The real thing (real users, real setuid, real sshd) is tests/e2e/test_lab.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from hsched.config import Settings
from hsched.controller.api import Api
from hsched.errors import PermissionDenied
from hsched.model import JobState
from hsched.testing import CannedNode, Lab

LAB1, LAB2, ADMIN = 50001, 50002, 50003
"""Peer uids as SO_PEERCRED gives them; their names are filled in the Api's cache (no accounts needed)."""


def api_for(lab: Lab) -> Api:
    api = Api(lab.ctl)
    api._users.update({LAB1: "lab1", LAB2: "lab2", ADMIN: "labadmin"})
    return api


async def submit(api: Api, uid: int, **extra: Any) -> dict[str, Any]:
    return await api.handle("submit", {"spec": {"command": ["sleep", "100"], "resources": {"gpus": 1}}, **extra}, uid)


async def test_a_job_is_its_submitters_and_only_they_or_admins_act_on_it(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, lab_mode=True, settings=Settings(admins=("labadmin",))) as lab:
        api = api_for(lab)
        # a body that claims another user changes nothing: the kernel's peer uid decides
        job = await submit(api, LAB2, user="lab1")
        assert job["user"] == "lab2"
        mine = await submit(api, LAB1)
        assert mine["user"] == "lab1"
        before = await lab.job(mine["id"])
        refusals = [("cancel", {}), ("hold", {}), ("hold", {"hold": False}), ("priority", {"priority": 5}),
                    ("requeue", {}), ("preempt", {}), ("checkpoint", {}), ("logs", {})]
        for op, args in refusals:
            with pytest.raises(PermissionDenied, match=f"^permission denied: job {mine['id']} belongs to lab1$"):
                await api.handle(op, {"id": mine["id"], **args}, LAB2)
        with pytest.raises(PermissionDenied):  # several at once: none is held when one is not theirs
            await api.handle("hold", {"ids": [job["id"], mine["id"]]}, LAB2)
        after = await lab.job(mine["id"])
        assert (after.state, after.spec.hold, after.spec.priority) == (before.state, False, before.spec.priority)
        assert not (await lab.job(job["id"])).spec.hold
        # everyone sees every job (as squeue does), but not another's environment
        assert {j["id"] for j in await api.handle("queue", {}, LAB2)} == {job["id"], mine["id"]}
        shown = await api.handle("show", {"id": mine["id"]}, LAB2)
        assert shown["user"] == "lab1" and shown["env"] == {}
        # the owner, an admin by name, root, and the controller's own account may
        await api.handle("priority", {"id": mine["id"], "priority": 7}, LAB1)
        await api.handle("hold", {"id": mine["id"]}, ADMIN)
        await api.handle("hold", {"id": mine["id"], "hold": False}, 0)
        await api.handle("cancel", {"id": mine["id"]}, os.getuid())
        assert (await lab.job(mine["id"])).state is JobState.CANCELLED
        # draining a node and stopping the controller are admins' only
        with pytest.raises(PermissionDenied, match="draining and resuming nodes is for root and the lab's admins"):
            await api.handle("node_admin", {"name": "a", "action": "drain"}, LAB1)
        with pytest.raises(PermissionDenied, match="stopping the controller"):
            await api.handle("stop", {}, LAB1)
        assert not lab.ctl.stopping.is_set()
        await api.handle("node_admin", {"name": "a", "action": "drain"}, ADMIN)
        ping = await api.handle("ping", {}, LAB1)
        assert (ping["mode"], ping["you"], ping["admin"]) == ("lab", "lab1", False)


async def test_in_personal_mode_the_one_peer_is_the_owner_of_everything(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        api = api_for(lab)
        job = await lab.submit("sleep", "1", user="someone-before")
        await api.handle("cancel", {"id": job.id}, os.getuid())
        assert (await api.handle("ping", {}, os.getuid()))["mode"] == "personal"


async def test_a_users_job_runs_as_them_and_never_where_they_have_no_account(tmp_path: Path) -> None:
    nodes = (CannedNode("a", "NVIDIA A100-SXM4-80GB", 4), CannedNode("b", "NVIDIA A100-SXM4-80GB", 4))
    async with Lab.open(tmp_path, nodes=nodes, lab_mode=True) as lab:
        lab.executors["a"].accounts = {"lab1"}  # lab2 has no account on a
        lab.executors["b"].accounts = {"lab1", "lab2"}
        jobs = [await lab.submit("sleep", "100", gpus=1, user="lab2") for _ in range(3)]
        await lab.round()  # asks the nodes who exists there (in the background)
        await lab.round()
        runs = [r for j in jobs for r in await lab.runs(j.id)]
        assert runs and {r.node for r in runs} == {"b"}
        req = lab.executors["b"].runs[runs[0].run_dir].request
        assert req.user == "lab2" and req.base_dir == str(lab.ctl.home.root)
        # each user's runs live under a folder of their own
        assert Path(runs[0].run_dir).parent.parent == lab.ctl.home.runs / "users" / "lab2"
        assert lab.ctl.nodes["a"].users == {"lab2": False} and lab.ctl.nodes["b"].users == {"lab2": True}
        assert "users" in lab.executors["a"].calls
        # b is full: the fourth and fifth of lab2's jobs wait, none goes to a
        more = [await lab.submit("sleep", "100", gpus=1, user="lab2") for _ in range(2)]
        await lab.advance(1)
        await lab.advance(1)
        assert [len(await lab.runs(j.id)) for j in more] == [1, 0]
        assert [r.node for r in await lab.runs(more[0].id)] == ["b"]


async def test_in_personal_mode_no_user_is_asked_about_and_runs_are_the_controllers(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("true", user="lab2")
        await lab.round()
        run = (await lab.runs(job.id))[0]
        req = lab.executors[run.node].runs[run.run_dir].request
        assert req.user is None and req.base_dir is None
        assert Path(run.run_dir).parent == lab.ctl.home.runs / run.node
        assert all("users" not in ex.calls for ex in lab.executors.values())
