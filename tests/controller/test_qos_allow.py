"""Who may use what (issue 29, item 2), and `hsched daemon reload` (item 4): in a lab only root and the admins may
put jobs in `prod` unless settings grant it (`[qos.prod] allow`), refused in one line with nothing queued; an admin's
grant is applied by a reload, without a restart; a reload checks both files first and changes nothing on a mistake.
In-process, on a fake clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hsched.config import Settings, load_settings
from hsched.controller.api import Api
from hsched.errors import ConfigError, PermissionDenied, UserError
from hsched.testing import Lab

LAB1, LAB2, ADMIN = 50001, 50002, 50003


def api_for(lab: Lab) -> Api:
    api = Api(lab.ctl)
    api._users.update({LAB1: "lab1", LAB2: "lab2", ADMIN: "labadmin"})
    return api


async def submit(api: Api, uid: int, qos: str) -> dict[str, Any]:
    spec = {"command": ["sleep", "100"], "resources": {"gpus": 1}, "qos": qos}
    return await api.handle("submit", {"spec": spec}, uid)  # type: ignore[no-any-return]


async def test_prod_is_the_admins_until_a_reload_grants_it(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, lab_mode=True, settings=Settings(admins=("labadmin",))) as lab:
        api = api_for(lab)
        with pytest.raises(PermissionDenied, match=r"^permission denied: lab1 may not use QoS prod .*daemon reload`$"):
            await submit(api, LAB1, "prod")
        with pytest.raises(PermissionDenied, match="may not use QoS prod"):
            await api.handle("submit_many", {"jobs": [{"spec": {"command": ["true"], "qos": "prod"}}]}, LAB1)
        assert await api.handle("queue", {}, LAB1) == []  # nothing queued
        normal = await submit(api, LAB1, "normal")
        with pytest.raises(PermissionDenied, match="may not use QoS prod"):  # nor moved there afterwards
            await api.handle("priority", {"id": normal["id"], "priority": 1, "qos": "prod"}, LAB1)
        assert (await submit(api, ADMIN, "prod"))["qos"] == "prod"
        assert (await submit(api, 0, "prod"))["qos"] == "prod"
        # the admin grants it to lab1 (and to a group nobody here is in): a reload applies it, no restart
        lab.ctl.home.settings.write_text('admins = ["labadmin"]\n[qos.prod]\npreempts = ["normal", "scavenger"]\n'
                                         'allow = ["lab1", "@nosuchgroup"]\n')
        with pytest.raises(PermissionDenied, match="reloading the settings is for root and the lab's admins"):
            await api.handle("reload", {}, LAB1)
        done = await api.handle("reload", {}, ADMIN)
        assert "qos" in done["applied"]
        assert (await submit(api, LAB1, "prod"))["qos"] == "prod"
        with pytest.raises(PermissionDenied, match="lab2 may not use QoS prod"):
            await submit(api, LAB2, "prod")
        # a mistake in the file: refused whole, the settings in force unchanged
        lab.ctl.home.settings.write_text('admins = ["labadmin"]\npoll_interval_s = "fast"\n')
        before = lab.ctl.settings
        with pytest.raises(UserError, match="poll_interval_s"):
            await api.handle("reload", {}, ADMIN)
        assert lab.ctl.settings is before


async def test_a_reload_keeps_what_only_a_restart_applies(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, lab_mode=True, settings=Settings(admins=("labadmin",))) as lab:
        lab.ctl.home.settings.write_text('admins = ["labadmin", "lab2"]\nmetrics = "127.0.0.1:9999"\n')
        done = await api_for(lab).handle("reload", {}, 0)
        assert "admins" in done["applied"] and "settings metrics" in done["restart_needed"]
        assert lab.ctl.settings.admins == ("labadmin", "lab2") and lab.ctl.settings.metrics is None


async def test_outside_a_lab_every_class_is_the_owners(tmp_path: Path) -> None:
    import os

    async with Lab.open(tmp_path) as lab:
        assert (await submit(Api(lab.ctl), os.getuid(), "prod"))["qos"] == "prod"


def test_allow_is_checked_in_the_settings_file(tmp_path: Path) -> None:
    f = tmp_path / "settings.toml"
    f.write_text('[qos.prod]\nallow = "everyone"\n')
    with pytest.raises(ConfigError, match=r"qos\.prod\.allow: expected a list of user names"):
        load_settings(f)
    f.write_text('[qos.research]\nallow = ["@ml", "ann"]\n')
    assert load_settings(f).qos["research"].allow == ("@ml", "ann")
