"""Who set a job's priority (a member's orders only their own jobs, a lab admin's orders across users), the
multifactor breakdown `hsched share` and `hsched show` give (sprio's view), and the `[priority]` settings.
In-process on a fake clock (hsched.testing), the CLI with its controller replaced by a recorder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hsched.cli import main
from hsched.config import Settings, load_settings
from hsched.controller.api import Api
from hsched.controller.launching import round_input
from hsched.errors import ConfigError
from hsched.learn.fairshare import PriorityWeights, UserShare
from hsched.model import JobSpec
from hsched.serialize import spec_from_dict, spec_to_dict
from hsched.testing import CannedNode, Lab

LAB1, LAB2, ADMIN = 50001, 50002, 50003
ONE_GPU = (CannedNode("a", "NVIDIA A100-SXM4-80GB", 1),)


def api_for(lab: Lab) -> Api:
    api = Api(lab.ctl)
    api._users.update({LAB1: "lab1", LAB2: "lab2", ADMIN: "labadmin"})
    return api


async def submit(api: Api, uid: int, **spec: Any) -> dict[str, Any]:
    table = {"command": ["sleep", "100"], "resources": {"gpus": 1}, **spec}
    return await api.handle("submit", {"spec": table}, uid)  # type: ignore[no-any-return]


async def test_who_set_the_priority_is_recorded_and_only_an_admins_crosses_users(tmp_path: Path) -> None:
    weights = PriorityWeights(fairshare=5000.0, age=0.0, size=100.0)
    async with Lab.open(tmp_path, nodes=ONE_GPU, lab_mode=True,
                        settings=Settings(admins=("labadmin",), priority=weights)) as lab:
        api = api_for(lab)
        blocker = await submit(api, LAB2)  # holds the one GPU while the others queue
        await lab.round()
        await lab.advance(3600.0)  # lab2 has used an hour; lab1 nothing
        mine = await submit(api, LAB1)
        theirs = await submit(api, LAB2, priority=50)
        assert (theirs["priority"], theirs["priority_by"], theirs["priority_admin"]) == (50, "lab2", False)
        assert mine["priority_by"] is None and mine["priority_admin"] is False
        await lab.finish(blocker["id"])
        await lab.round()
        # a member's priority 50 does not jump lab1's job: fair share decides between users
        assert (await lab.job(mine["id"])).state.value == "RUNNING"
        assert (await lab.job(theirs["id"])).state.value == "PENDING"
        # an admin's priority does, and the event says who set it
        later = await submit(api, LAB1)
        raised = await api.handle("priority", {"id": theirs["id"], "priority": 10}, ADMIN)
        assert (raised["priority_by"], raised["priority_admin"]) == ("labadmin", True)
        assert any("by labadmin (admin" in e["message"] for e in (await api.handle("show", {"id": theirs["id"]},
                                                                                    LAB2))["events"])
        # the round hands it over with lab2's usage
        async with lab.ctl.lock:
            inp = await round_input(lab.ctl)
        assert inp is not None
        usage = inp.view.user_usage or {}
        assert isinstance(usage["lab2"], UserShare) and usage["lab2"].admin_jobs == frozenset({theirs["id"]})
        assert usage["lab2"].weights == weights
        await lab.advance(60.0)
        await lab.finish(mine["id"])
        await lab.round()
        assert (await lab.job(theirs["id"])).state.value == "RUNNING"
        assert (await lab.job(later["id"])).state.value == "PENDING"
        # a member lowering it again makes it theirs (not an admin's) once more
        lowered = await api.handle("priority", {"id": later["id"], "priority": 3}, LAB1)
        assert (lowered["priority_by"], lowered["priority_admin"]) == ("lab1", False)


class Shown:
    """`hsched show`'s controller: the reply the API gave."""

    reply: dict[str, Any] = {}

    def __enter__(self) -> Shown:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        assert op == "show"
        return json.loads(json.dumps(Shown.reply))


async def test_share_and_show_give_each_factor_its_weight_and_the_total(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    weights = PriorityWeights(fairshare=10000.0, age=1000.0, size=1000.0, max_age_s=86400.0)
    async with Lab.open(tmp_path, nodes=ONE_GPU, lab_mode=True, settings=Settings(priority=weights)) as lab:
        api = api_for(lab)
        first = await submit(api, LAB1)
        await lab.round()
        await lab.advance(3600.0)
        waiting = await submit(api, LAB2)
        await lab.advance(8640.0)  # a tenth of max_age
        share = await api.handle("share", {}, LAB1)
        assert share["weights"] == {"weight_fairshare": 10000.0, "weight_age": 1000.0, "weight_size": 1000.0,
                                    "max_age_s": 86400.0}
        fs = {r["user"]: r["fairshare"] for r in share["users"]}
        [row] = share["jobs"]  # the waiting job alone (sprio lists pending jobs)
        assert row["job_id"] == waiting["id"] and row["user"] == "lab2"
        assert row["fairshare"] == pytest.approx(fs["lab2"]) == pytest.approx(1.0)  # lab2 used nothing yet
        assert row["age"] == pytest.approx(0.1) and row["size"] == pytest.approx(1.0)  # 1 GPU of the fleet's 1
        assert row["total"] == pytest.approx(10000 * row["fairshare"] + 1000 * 0.1 + 1000 * 1.0, abs=0.01)
        shown = await api.handle("show", {"id": waiting["id"]}, LAB2)
        assert shown["priority_factors"]["total"] == row["total"]
        assert shown["priority_factors"]["weight_fairshare"] == 10000.0
        # and as `hsched show` prints it: the sum, factor by factor
        Shown.reply = shown
        monkeypatch.setattr("hsched.cli.jobs._client", Shown)
        monkeypatch.setenv("COLUMNS", "200")
        assert run(monkeypatch, "show", str(waiting["id"])) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if "multifactor:" in x)
        assert line.split("multifactor: ")[1] == (f"{row['total']:g} = {row['fairshare']:.3f}x10000 fairshare + "
                                                  "0.100x1000 age + 1.000x1000 size")
        running = (await api.handle("show", {"id": first["id"]}, LAB1))["priority_factors"]
        assert running["fairshare"] == pytest.approx(fs["lab1"]) and running["fairshare"] < 1.0
        await lab.finish(first["id"])
        await lab.round()
        assert (await api.handle("show", {"id": first["id"]}, LAB1))["priority_factors"] is None  # ended


SHARE = {"half_life_s": 604800.0, "policy": "hsched",
         "weights": {"weight_fairshare": 10000.0, "weight_age": 1000.0, "weight_size": 1000.0, "max_age_s": 604800.0},
         "users": [{"user": "lab1", "account": "lab1", "shares": 1, "norm_shares": 0.5, "raw_usage_gpu_hours": 1.0,
                    "decayed_usage_gpu_hours": 1.0, "effective_usage": 1.0, "fairshare": 0.25}],
         "jobs": [{"job_id": 9, "user": "lab1", "qos": "normal", "priority": 3, "fairshare": 0.25, "age": 0.5,
                   "size": 0.125, "weight_fairshare": 10000.0, "weight_age": 1000.0, "weight_size": 1000.0,
                   "admin_priority": None, "total": 3125.0}]}


class Recorder:
    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        assert op == "share"
        return json.loads(json.dumps(SHARE))


def run(monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    monkeypatch.setattr("sys.argv", ["hsched", *argv])
    with pytest.raises(SystemExit) as ex:
        main()
    return int(ex.value.code or 0)


def test_share_prints_sprios_table(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                   tmp_path: Path) -> None:
    monkeypatch.setenv("HSCHED_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("hsched.cli.jobs._client", Recorder)
    monkeypatch.setenv("COLUMNS", "160")
    assert run(monkeypatch, "share") == 0
    out = capsys.readouterr().out
    assert "JOBID" in out and "FAIRSHARE" in out and "AGE" in out and "JOBSIZE" in out
    line = next(x for x in out.splitlines() if x.strip().startswith("9 "))
    assert line.split()[:9] == ["9", "lab1", "normal", "3125", "2500", "500", "125", "-", "3"]
    assert run(monkeypatch, "share", "--json") == 0
    assert json.loads(capsys.readouterr().out)["jobs"][0]["total"] == 3125.0


def test_a_stored_spec_from_before_loads_and_a_new_one_round_trips() -> None:
    old = spec_to_dict(JobSpec(command=("x",), priority=4))
    assert "priority_by" not in old and "priority_admin" not in old  # nothing set: the rows stay as they were
    back = spec_from_dict(old)
    assert (back.priority, back.priority_by, back.priority_admin) == (4, "", False)
    new = JobSpec(command=("x",), priority=4, priority_by="labadmin", priority_admin=True)
    assert spec_from_dict(json.loads(json.dumps(spec_to_dict(new)))) == new


def test_priority_settings_are_read_and_checked(tmp_path: Path) -> None:
    f = tmp_path / "settings.toml"
    f.write_text("[priority]\nweight_fairshare = 20000\nweight_age = 0\nweight_size = 500.5\nmax_age_s = 86400\n")
    assert load_settings(f).priority == PriorityWeights(20000.0, 0.0, 500.5, 86400.0)
    assert Settings().priority == PriorityWeights()  # Slurm-like defaults: fair share weighs most
    for text, line in (
        ("[priority]\nweight_age = -1\n",
         "priority.weight_age: expected a weight >= 0 such as 10000 (0 leaves the factor out), found -1"),
        ('[priority]\nmax_age_s = "7-0"\n', "priority.max_age_s: expected a number of seconds >= 0 (604800 = 7 "
                                            "days), found '7-0'"),
        ("[priority]\nweight_fairshar = 1\n", "priority.weight_fairshar: unknown key (did you mean "
                                              "'weight_fairshare'?)"),
        ("priority = 3\n", "priority: expected a table such as [priority] with weight_fairshare = 10000, found 3"),
    ):
        f.write_text(text)
        with pytest.raises(ConfigError) as e:
            load_settings(f)
        assert e.value.problems == [f"{f}: {line}"]
