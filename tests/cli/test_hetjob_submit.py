"""Writing a heterogeneous job (issue 31): `:` between components on the command line, `#SBATCH hetjob` in a batch
script, `[[component]]` tables in a spec file; bad input one line, exit 2. The controller is replaced by a recorder
(tests/cli/test_submit_args.py): only what reaches it is tested, and the spec it makes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hsched.config import job_spec_from_table
from hsched.errors import UserError
from hsched.model import Component, JobSpec, Resources
from hsched.serialize import spec_from_dict, spec_to_dict
from tests.cli.test_submit_args import submit, submitted  # noqa: F401  (the fixture)

PIPE = ["--gpus", "1", "--gpu-type", "l40s", "--qos", "prod", "-J", "pipe", "--", "python", "prep.py", ":",
        "--gpus", "2", "--gpu-type", "h100", "--env", "STAGE=train", "--", "python", "train.py", "--lr", "3", ":",
        "--cpus", "4", "--", "python", "fuse.py"]


def _spec(call: dict[str, Any]) -> JobSpec:
    return job_spec_from_table(call["spec"], call["source"], ("prod", "normal", "scavenger"))


def test_components_on_the_command_line(monkeypatch: pytest.MonkeyPatch,
                                        submitted: list[dict[str, Any]]) -> None:  # noqa: F811
    assert submit(monkeypatch, *PIPE) == 0
    [call] = submitted
    spec = _spec(call)
    assert [c.command for c in spec.components] == [("python", "prep.py"), ("python", "train.py", "--lr", "3"),
                                                    ("python", "fuse.py")]
    assert [c.resources.gpus for c in spec.components] == [1, 2, 0]
    assert [c.resources.gpu_types for c in spec.components] == [("l40s",), ("h100",), ()]
    assert spec.components[2].resources.cpus == 4 and spec.components[1].env == (("STAGE", "train"),)
    # job-wide options apply to the whole job; the job's own command and resources are component 0's
    assert (spec.qos, spec.name, spec.command, spec.resources.gpus) == ("prod", "pipe", ("python", "prep.py"), 1)


@pytest.mark.parametrize(("argv", "says"), [
    (["--gpus", "1", "--", "true", ":", "--qos", "prod", "--", "true"], "component 1: --qos applies to the whole job"),
    (["--gpus", "1", "--", "true", ":", ":", "--", "true"], "component 1 is empty"),
    (["--gpus", "1", "--", "true", ":"], "component 1 is empty"),
    (["--gpus", "1", "--", "true", ":", "--gpus", "2"], "component 1 has no command"),
    (["--gpus", "1", "--", "true", ":", "--bogus", "1", "--", "true"], "component 1: unknown option --bogus"),
    (["--array", "0-3", "--", "true", ":", "--", "true"], "cannot be an array"),
])
def test_bad_components_are_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                submitted: list[dict[str, Any]], argv: list[str],  # noqa: F811
                                                says: str) -> None:
    assert submit(monkeypatch, *argv) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert submitted == []


def test_sbatch_hetjob_lines_make_components(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                             submitted: list[dict[str, Any]]) -> None:  # noqa: F811
    script = tmp_path / "pipe.sh"
    script.write_text("#!/bin/bash\n#SBATCH -J pipe --gpus 1 --gpu-type l40s -t 10\n#SBATCH hetjob\n"
                      "#SBATCH --gres=gpu:h100:2\n#SBATCH hetjob\n#SBATCH -c 4\necho $HSCHED_COMPONENT\n")
    monkeypatch.chdir(tmp_path)
    assert submit(monkeypatch, str(script)) == 0
    [call] = submitted
    spec = _spec(call)
    assert [(c.resources.gpus, c.resources.gpu_types, c.resources.cpus) for c in spec.components] == [
        (1, ("l40s",), None), (2, ("h100",), None), (0, (), 4)]
    # every component runs the script (it branches on $HSCHED_COMPONENT); the time limit is the job's
    assert len({c.command for c in spec.components}) == 1 and spec.time_limit_s == 600
    assert spec.name == "pipe"


def test_a_job_wide_sbatch_option_in_a_later_component_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str],
                                                                  submitted: list[dict[str, Any]]) -> None:  # noqa: F811
    script = tmp_path / "pipe.sh"
    script.write_text("#!/bin/bash\n#SBATCH --gpus 1\n#SBATCH hetjob\n#SBATCH --gpus 2 -t 10\necho\n")
    monkeypatch.chdir(tmp_path)
    assert submit(monkeypatch, str(script)) == 2
    assert "component 1: -t applies to the whole job" in capsys.readouterr().err


def test_a_spec_file_with_component_tables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                           submitted: list[dict[str, Any]]) -> None:  # noqa: F811
    f = tmp_path / "pipe.toml"
    f.write_text('name = "pipe"\nqos = "normal"\nenv = { SEED = "1" }\n'
                 '[[component]]\ncommand = ["python", "prep.py"]\nresources = { gpus = 1, gpu_types = ["l40s"] }\n'
                 '[[component]]\ncommand = ["python", "train.py"]\n[component.resources]\ngpus = 2\n'
                 'gpu_types = ["h100"]\n')
    assert submit(monkeypatch, str(f)) == 0
    spec = _spec(submitted[0])
    assert [c.resources.gpus for c in spec.components] == [1, 2] and spec.env == (("SEED", "1"),)


@pytest.mark.parametrize(("table", "says"), [
    ({"component": [{"command": ["a"], "qos": "prod"}, {"command": ["b"]}]},
     "component[0].qos: applies to the whole job"),
    ({"component": [{"command": ["a"]}, {"command": ["b"], "resources": {"gpus": "x"}}]},
     "component[1]: resources.gpus: 'x': expected a count N or a range MIN-MAX"),
    ({"component": [{"command": ["a"]}, {"command": ["b"], "resources": {"gpus": "2-8"}}]},
     "component[1].resources: a component has one size"),
    ({"component": [{"command": ["a"]}, {"resources": {"gpus": 1}}]}, "component[1].command: missing"),
    ({"command": ["x"], "component": [{"command": ["a"]}, {"command": ["b"]}]}, "command: given with [[component]]"),
    ({"component": []}, "component: expected one or more [[component]] tables"),
])
def test_bad_component_tables_name_the_key(table: dict[str, Any], says: str) -> None:
    with pytest.raises(UserError) as e:
        job_spec_from_table(table, "pipe.toml")
    assert says in str(e.value), str(e.value)
    assert str(e.value).startswith("pipe.toml: ")


def test_components_round_trip_and_old_rows_read_without_them() -> None:
    comps = (Component(("a.py",), Resources(gpus=1, gpu_types=("l40s",)), env=(("X", "1"),), workdir="/w"),
             Component(("b.py",), Resources(cpus=4, nodes=2, tasks_per_node=2)))
    spec = JobSpec(command=("a.py",), resources=comps[0].resources, components=comps)
    assert spec_from_dict(spec_to_dict(spec)) == spec
    old = spec_to_dict(JobSpec(command=("x",)))
    assert "components" not in old and spec_from_dict(old).components == ()


def test_shebang_scripts_as_components_keep_their_arguments(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                          submitted: list[dict[str, Any]]) -> None:  # noqa: F811
    for name in ("prep.py", "train.py"):
        (tmp_path / name).write_text("#!/usr/bin/env python3\nprint('hi')\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.chdir(tmp_path)
    assert submit(monkeypatch, "--gpus", "1", "--", "./prep.py", "--x", ":", "--gpus", "2", "--", "./train.py") == 0
    spec = _spec(submitted[0])
    # (the first is read as a batch script, as `hsched submit -- ./prep.py` reads it: run by path, the same run)
    first, second = (c.command for c in spec.components)
    assert first[-2:] == (str(tmp_path / "prep.py"), "--x") and second == ("./train.py",)
