"""Lab scheduling's keys (issue 13): node labels, --constraint in specs, QoS caps, fair share's half-life and
accounts, GPU model aliases. Bad input is one line naming the key and what is accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from hsched.config import job_spec_from_table, load_fleet, load_settings
from hsched.errors import ConfigError
from hsched.learn.fairshare import DEFAULT_HALF_LIFE_S, Account
from hsched.serialize import job_to_dict, spec_from_dict, spec_to_dict


def test_fleet_labels(tmp_path: Path) -> None:
    p = tmp_path / "fleet.toml"
    p.write_text('[[node]]\nname = "a"\nlabels = ["nvme", "ib", "nvme"]\n[[node]]\nname = "b"\n')
    fleet = load_fleet(p)
    assert fleet.nodes[0].labels == ("nvme", "ib") and fleet.nodes[1].labels == ()
    p.write_text('[[node]]\nname = "a"\nlabels = ["nvme", "has space"]\n[[node]]\nname = "b"\nlabels = "ib"\n')
    with pytest.raises(ConfigError) as e:
        load_fleet(p)
    assert len(e.value.problems) == 2
    assert "node[0] (a).labels: expected a label of letters" in e.value.problems[0]
    assert "'has space'" in e.value.problems[0]
    assert 'node[1] (b).labels: expected a list of labels such as ["nvme", "ib"]' in e.value.problems[1]


@pytest.mark.parametrize("table", [
    {"command": ["x"], "constraint": "nvme & ib"},
    {"command": ["x"], "resources": {"gpus": 1, "constraint": "nvme&ib"}},
])
def test_a_spec_takes_a_constraint_at_the_top_or_in_resources(table: dict[str, object]) -> None:
    spec = job_spec_from_table(table, "job.toml")
    assert spec.resources.constraint == "nvme&ib"
    # stored and shown: the spec round-trips through the store's JSON, the job object carries it
    assert spec_from_dict(spec_to_dict(spec)).resources.constraint == "nvme&ib"


def test_bad_constraints_name_the_key() -> None:
    with pytest.raises(ConfigError) as e:
        job_spec_from_table({"command": ["x"], "resources": {"constraint": "nvme&&ib"}}, "job.toml")
    [line] = e.value.problems
    assert line.startswith("job.toml: resources.constraint: 'nvme&&ib' is not a constraint: expected labels joined")
    with pytest.raises(ConfigError) as e:
        job_spec_from_table({"command": ["x"], "constraint": "a", "resources": {"constraint": "b"}}, "job.toml")
    assert "given twice" in e.value.problems[0]
    with pytest.raises(ConfigError) as e:
        job_spec_from_table({"command": ["x"], "constraint": 3}, "job.toml")
    assert e.value.problems == ['job.toml: constraint: expected node labels such as "nvme&ib" or "a100|h100", found 3']


def test_the_job_object_shows_the_constraint() -> None:
    from hsched.model import Job, JobState

    spec = job_spec_from_table({"command": ["x"], "constraint": "ib"}, "job.toml")
    assert job_to_dict(Job(1, spec, "u", JobState.PENDING, "", 0.0))["constraint"] == "ib"
    plain = job_spec_from_table({"command": ["x"]}, "job.toml")
    assert job_to_dict(Job(1, plain, "u", JobState.PENDING, "", 0.0))["constraint"] is None
    # a spec stored before constraints existed reads as none
    stored = spec_to_dict(plain)
    del stored["resources"]["constraint"]
    assert spec_from_dict(stored).resources.constraint == ""


def test_lab_scheduling_settings(tmp_path: Path) -> None:
    p = tmp_path / "settings.toml"
    assert load_settings(p).fairshare_half_life_s == DEFAULT_HALF_LIFE_S == 7 * 86400
    p.write_text(
        "fairshare_half_life_s = 86400\n"
        "[qos.normal]\npreempts = [\"scavenger\"]\nmax_gpus = 16\nmax_gpus_per_user = 2\nmax_jobs_per_user = 4\n"
        "[accounts]\nphysics = [\"lab1\", \"lab2\"]\nbio = { users = [\"lab3\"], shares = 2 }\n"
        "[gpu_models.aliases]\na100 = [\"A100-SXM4-80GB\", \"A100-PCIE-40GB\"]\nbig = \"H100\"\n"
    )
    s = load_settings(p)
    assert s.fairshare_half_life_s == 86400.0
    q = s.qos["normal"]
    assert (q.max_gpus, q.max_gpus_per_user, q.max_jobs_per_user) == (16, 2, 4)
    assert s.accounts == {"physics": Account("physics", ("lab1", "lab2")), "bio": Account("bio", ("lab3",), 2)}
    assert s.gpu_aliases == {"a100": ("A100-SXM4-80GB", "A100-PCIE-40GB"), "big": ("H100",)}
    p.write_text("fairshare_half_life_s = 0\n")
    assert load_settings(p).fairshare_half_life_s == 0.0


@pytest.mark.parametrize(("text", "line"), [
    ("fairshare_half_life_s = -1\n",
     "fairshare_half_life_s: expected a number of seconds >= 0 (604800 = 7 days; 0: no decay), found -1"),
    ("fairshare_halflife_s = 10\n", "fairshare_halflife_s: unknown key (did you mean 'fairshare_half_life_s'?)"),
    ("[qos.normal]\nmax_jobs_per_user = -1\n", "qos.normal.max_jobs_per_user: expected an integer >= 0, found -1"),
    ("[qos.normal]\nmax_job_per_user = 1\n", "qos.normal.max_job_per_user: unknown key (did you mean"),
    ("[accounts]\nphysics = \"lab1\"\n", "accounts.physics: expected a list of user names"),
    ("[accounts]\na = [\"x\"]\nb = [\"x\"]\n", "accounts.b: user 'x' is already in account 'a'"),
    ("[accounts]\na = { users = [\"x\"], share = 2 }\n", "accounts.a.share: unknown key (did you mean 'shares'?)"),
    ("[gpu_models]\nA100 = 1\n", "gpu_models.A100: unknown key (known keys: aliases)"),
    ("[gpu_models.aliases]\nbig = []\n", "gpu_models.aliases.big: expected a list of GPU model names"),
    ("[gpu_models.aliases]\nbig = [\"H100\"]\nBIG = [\"A100\"]\n", "gpu_models.aliases.BIG: the same alias as 'big'"),
])
def test_bad_lab_settings_are_one_line_each(tmp_path: Path, text: str, line: str) -> None:
    p = tmp_path / "settings.toml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_settings(p)
    [problem] = e.value.problems
    assert problem.startswith(f"{p}: {line}"), problem
