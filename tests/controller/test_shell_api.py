"""Every request argument is checked: a wrong one is a UserError naming the field (exit 2 at the CLI), never an
internal error; the submitting user comes from the peer's uid, never from the request."""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from typing import Any

import pytest

from hsched.controller.api import PRIORITY_MAX, PRIORITY_MIN, Api
from hsched.errors import UserError
from hsched.testing import Lab

ME = os.getuid()
SPEC = {"command": ["python", "train.py"]}

# (op, args, what the one line must name)
BAD: list[tuple[str, Any, str]] = [
    ("queue", ["all"], "args: expected an object, found a list"),
    ("queue", {"all": "yes"}, "all: expected true or false, found a string 'yes'"),
    ("show", {"id": "1"}, "id: not a job id: '1'"),
    ("show", {"id": 0}, "id: not a job id: 0"),
    ("show", {"id": 2**70}, "id: not a job id"),
    ("show", {"id": True}, "id: not a job id: True"),
    ("show", {}, "id: not a job id: None"),
    ("cancel", {"id": [1]}, "id: not a job id: [1]"),
    ("hold", {"ids": 3}, "ids: expected a list of job ids, found a number 3"),
    ("hold", {"ids": [1, "x"]}, "ids: not a job id: 'x'"),
    ("hold", {"id": 1, "hold": 1}, "hold: expected true or false"),
    ("priority", {"id": 1, "priority": PRIORITY_MAX + 1},
     f"priority: expected an integer from {PRIORITY_MIN} to {PRIORITY_MAX}, found {PRIORITY_MAX + 1}"),
    ("priority", {"id": 1, "priority": -(10**30)}, "priority: expected an integer from"),
    ("priority", {"id": 1, "priority": 1.5}, "priority: expected an integer, found a number 1.5"),
    ("priority", {"id": 1}, "priority: required"),
    ("priority", {"id": 1, "priority": 3, "qos": 7}, "qos: expected a string"),
    ("wait", {"ids": [1], "timeout": -1}, "timeout: expected a number from 0 to 604800, found -1"),
    ("wait", {"ids": [1], "timeout": "soon"}, "timeout: expected a number, found a string 'soon'"),
    ("logs", {"id": 1, "offset": -5}, "offset: expected an integer from 0"),
    ("logs", {"id": 1, "max_bytes": 1 << 40}, "max_bytes: expected an integer from 1 to 16777216"),
    ("logs", {"id": 1, "run": "last"}, "run: expected an integer, found a string 'last'"),
    ("events", {"limit": 0}, "limit: expected an integer from 1 to 10000, found 0"),
    ("events", {"after": "x"}, "after: expected an integer, found a string 'x'"),
    ("snapshot", {"recent_s": []}, "recent_s: expected a number, found a list []"),
    ("node_admin", {"name": "a", "action": "reboot"}, "action: expected one of drain, resume, found 'reboot'"),
    ("node_admin", {"name": "a"}, "action: required"),
    ("node_admin", {"name": ["a"], "action": "drain"}, "name: expected a string"),
    ("node_admin", {"name": "a", "action": "drain", "reason": "x" * 5000}, "reason: at most 1000 characters"),
    ("submit", {"spec": "python train.py"}, "spec: expected a job spec object, found a string"),
    ("submit", {"spec": SPEC, "environ": {"A": 1}}, "environ: expected an object of strings"),
    ("submit", {"spec": {**SPEC, "priority": 10**20}}, "priority: expected an integer from"),
    ("submit", {"spec": SPEC, "source": 3}, "source: expected a string"),
    ("nope", {}, "unknown request 'nope'"),
]


@pytest.mark.parametrize(("op", "args", "names"), BAD, ids=[f"{op}-{i}" for i, (op, _, _) in enumerate(BAD)])
async def test_a_bad_argument_is_a_user_error_naming_the_field(tmp_path: Path, op: str, args: Any,
                                                               names: str) -> None:
    async with Lab.open(tmp_path) as lab:
        await lab.submit("python", "train.py")  # job 1 exists: the error is the argument's, not a missing job
        with pytest.raises(UserError) as err:
            await Api(lab.ctl).handle(op, args, ME)
        assert names in str(err.value)
        assert len(err.value.problems) == 1 and "\n" not in err.value.problems[0]


async def test_good_arguments_still_work(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        api = Api(lab.ctl)
        job = await api.handle("submit", {"spec": SPEC, "environ": {"PATH": "/bin"}}, ME)
        assert (await api.handle("priority", {"id": job["id"], "priority": PRIORITY_MIN}, ME))["priority"] \
            == PRIORITY_MIN
        held = await api.handle("hold", {"ids": [job["id"]], "hold": True}, ME)
        assert held[0]["reason"] == "JobHeldUser"
        # `timeout: 0` looks once (it used to mean an hour)
        assert (await api.handle("wait", {"ids": [job["id"]], "timeout": 0}, ME))["done"] is False
        assert await api.handle("queue", {"all": True}, ME)
        assert (await api.handle("logs", {"id": job["id"], "offset": 0, "run": None}, ME))["run"] is None
        assert (await api.handle("node_admin", {"name": "a", "action": "drain", "reason": "fan"}, ME))["state"] \
            == "DRAINED"
        nodes = {n["name"]: n for n in await api.handle("nodes", {}, ME)}
        assert nodes["a"]["message"] == "fan"
        assert (await api.handle("node_admin", {"name": "a", "action": "resume"}, ME))["state"] == "UP"


async def test_the_user_is_the_peers_uid_never_the_request_body(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        api = Api(lab.ctl)
        job = await api.handle("submit", {"spec": SPEC, "user": "mallory"}, ME)
        assert job["user"] == pwd.getpwuid(ME).pw_name
        unnamed = 2**31 - 7  # a uid with no name in the user database is shown as its number
        job = await api.handle("submit", {"spec": SPEC}, unnamed)
        assert job["user"] == str(unnamed)


async def test_ping_says_version_protocol_readiness_and_health(tmp_path: Path) -> None:
    from hsched import __version__
    from hsched.protocol import PROTOCOL

    async with Lab.open(tmp_path) as lab:
        ping = await Api(lab.ctl).handle("ping", {}, ME)
        assert ping["hsched"] == __version__ and ping["protocol"] == PROTOCOL
        assert ping["ready"] is True and ping["probing"] == [] and ping["unhealthy_nodes"] == []
        assert ping["health"] == "ok" and ping["health_error"] is None
        assert {"pid", "api", "home", "started", "fleet", "ops"} <= set(ping)
