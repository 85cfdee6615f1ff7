"""Elastic jobs' ranges (issue 31): `--gpus MIN-MAX` and `--nodes MIN-MAX` on the command line (quick path and
Typer's), in a spec file (`gpus = "2-8"` or `gpus_max`) and in `#SBATCH` lines; bad ranges are one clear line and
exit 2; the JSON forms carry the range and read old rows without it. The controller is a recorder here (as
tests/cli/test_submit_args.py); the live behaviour is tests/controller/test_elastic.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hsched.config import job_spec_from_table
from hsched.errors import ConfigError
from hsched.model import Job, JobState, Placement
from hsched.serialize import job_to_dict, spec_from_dict, spec_to_dict
from hsched.spec.sizes import size_range
from tests.cli.test_submit_args import Recorder, submit


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, Any]]:
    """What the CLI sent (the recorder of tests/cli/test_submit_args.py stands for the controller)."""
    monkeypatch.setenv("HSCHED_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("hsched.cli.jobs._client", Recorder)
    monkeypatch.setattr("hsched.cli.submitting._client", Recorder)
    Recorder.calls = []
    return Recorder.calls


def resources(calls: list[dict[str, Any]]) -> dict[str, Any]:
    (call,) = calls
    return dict(call["spec"]["resources"])


@pytest.mark.parametrize("argv", [
    ("--gpus", "2-8", "--", "python", "train.py"),            # the quick path
    ("--gpus", "2-8", "--json", "--", "python", "train.py"),  # (--json: still quick)
    ("--gpus=2-8", "--", "python", "train.py"),               # Typer's
])
def test_gpus_range_on_the_command_line(monkeypatch: pytest.MonkeyPatch, submitted: list[dict[str, Any]],
                                        argv: tuple[str, ...]) -> None:
    assert submit(monkeypatch, *argv) == 0
    r = resources(submitted)
    assert (r["gpus"], r["gpus_max"], r.get("nodes_max")) == (2, 8, None)


def test_gpus_total_range_split_over_nodes_and_nodes_range(monkeypatch: pytest.MonkeyPatch,
                                                           submitted: list[dict[str, Any]]) -> None:
    assert submit(monkeypatch, "--gpus", "4-16", "--nodes", "2-4", "--", "python", "train.py") == 0
    r = resources(submitted)
    assert (r["gpus"], r["gpus_max"], r["nodes"], r["nodes_max"]) == (2, 8, 2, 4)


@pytest.mark.parametrize(("argv", "line"), [
    (("--gpus", "8-2"), "--gpus '8-2': MAX 2 is below MIN 8; write 2-8"),
    (("--gpus", "0-4"), "--gpus '0-4': an elastic range starts at 1 or more; write 1-4"),
    (("--gpus", "two"), "--gpus 'two': expected a count N or a range MIN-MAX such as 2-8"),
    (("--nodes", "4-2"), "--nodes '4-2': MAX 2 is below MIN 4; write 2-4"),
    (("--nodes", "0"), "--nodes '0': expected at least 1"),
])
def test_bad_ranges_are_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch, submitted: list[dict[str, Any]],
                                            capsys: pytest.CaptureFixture[str], argv: tuple[str, ...],
                                            line: str) -> None:
    assert submit(monkeypatch, *argv, "--", "python", "train.py") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and line in err[0] and "Traceback" not in err[0]
    assert submitted == []  # nothing queued


def test_rigid_counts_are_as_before(monkeypatch: pytest.MonkeyPatch, submitted: list[dict[str, Any]]) -> None:
    assert submit(monkeypatch, "--gpus", "4", "--nodes", "2", "--", "python", "train.py") == 0
    r = resources(submitted)
    assert (r["gpus"], r["nodes"]) == (2, 2) and "gpus_max" not in r and "nodes_max" not in r


def test_batch_script_ranges(monkeypatch: pytest.MonkeyPatch, submitted: list[dict[str, Any]],
                             tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\n#SBATCH --gpus=4-16\n#SBATCH --nodes=2-4\n#SBATCH --ntasks-per-node=1\n"
                      "python train.py\n")
    assert submit(monkeypatch, str(script)) == 0
    r = resources(submitted)
    assert (r["gpus"], r["gpus_max"], r["nodes"], r["nodes_max"]) == (2, 8, 2, 4)


def test_spec_file_forms_and_problems() -> None:
    for res in ({"gpus": "2-8"}, {"gpus": 2, "gpus_max": 8}, {"gpus": "2-8", "gpus_max": 8}):
        got = job_spec_from_table({"command": ["x"], "resources": res}, "job.toml").resources
        assert (got.gpus, got.gpus_max, got.elastic) == (2, 8, True)
    for res, line in (({"gpus": "8-2"}, "job.toml: resources.gpus: '8-2': MAX 2 is below MIN 8; write 2-8"),
                      ({"gpus": 4, "gpus_max": 2}, "job.toml: resources.gpus_max: expected an integer >= 4"),
                      ({"gpus": "2-8", "gpus_max": 4}, "resources.gpus_max: 4 disagrees with gpus = '2-8'"),
                      ({"gpus": 0, "gpus_max": 4}, "resources.gpus_max: an elastic job asks at least 1 gpus"),
                      ({"nodes": "3-1"}, "job.toml: resources.nodes: '3-1': MAX 1 is below MIN 3; write 1-3"),
                      ({"gpus": "1-2", "shared": True, "gpu_memory": "10G"},
                       "resources.shared: a shared job is not elastic")):
        with pytest.raises(ConfigError) as ex:
            job_spec_from_table({"command": ["x"], "resources": res}, "job.toml")
        assert line in str(ex.value), (res, str(ex.value))


def test_json_forms_carry_the_range_and_the_size_now() -> None:
    spec = job_spec_from_table({"command": ["x"], "resources": {"gpus": "2-8"}}, "job.toml")
    d = spec_to_dict(spec)
    assert d["resources"]["gpus_max"] == 8 and spec_from_dict(d) == spec
    old = spec_to_dict(job_spec_from_table({"command": ["x"], "resources": {"gpus": 2}}, "job.toml"))
    assert "gpus_max" not in old["resources"] and spec_from_dict(old).resources.gpus_max is None  # old rows read
    job = Job(id=1, spec=spec, user="u", state=JobState.RUNNING, reason="", submit_time=0.0,
              placement=(Placement("n", tuple(f"g{i}" for i in range(6))),))
    out = job_to_dict(job)
    assert (out["elastic"], out["gpus_min"], out["gpus_max"], out["gpus_now"], out["nodes_now"]) == (True, 2, 8, 6, 1)
    assert "elastic" not in job_to_dict(Job(id=2, spec=spec_from_dict(old), user="u", state=JobState.PENDING, reason="",
                                            submit_time=0.0))


def test_size_range() -> None:
    assert size_range("4", "--gpus") == (4, None) and size_range("2-8", "--gpus") == (2, 8)
    assert size_range("4-4", "--gpus") == (4, None) and size_range(3, "--gpus") == (3, None)
    with pytest.raises(ValueError, match="below MIN"):
        size_range("8-2", "--gpus")


def test_request_bounds_hold_for_the_max() -> None:
    from hsched.config import Settings, beyond_limits

    spec = job_spec_from_table({"command": ["x"], "resources": {"gpus": "2-8", "nodes": "1-4"}}, "job.toml")
    (line,) = beyond_limits(spec, Settings(max_gpus=16))
    assert line.startswith("resources.gpus_max x resources.nodes_max (--gpus MIN-MAX): 32 GPUs is over the limit of 16")
    assert beyond_limits(spec, Settings(max_gpus=32)) == []


def test_resize_signal(monkeypatch: pytest.MonkeyPatch, submitted: list[dict[str, Any]]) -> None:
    assert submit(monkeypatch, "--gpus", "2-8", "--resize-signal", "USR2", "--", "python", "train.py") == 0
    (call,) = submitted
    assert call["spec"]["resize_signal"] == "USR2"
    got = job_spec_from_table({"command": ["x"], "resources": {"gpus": "2-8"}, "resize_signal": "SIGUSR2"}, "j.toml")
    assert got.resize_signal == "USR2" and spec_from_dict(spec_to_dict(got)) == got
    for table, line in (({"resources": {"gpus": 2}, "resize_signal": "USR2"},
                         "j.toml: resize_signal: only an elastic job resizes: give a range, --gpus MIN-MAX"),
                        ({"resources": {"gpus": "2-8"}, "resize_signal": "USR2@30"},
                         "j.toml: resize_signal: expected a signal name such as USR2 (no grace, no B:)"),
                        ({"resources": {"gpus": "2-8"}, "resize_signal": "KILL"}, "j.toml: resize_signal: expected")):
        with pytest.raises(ConfigError) as ex:
            job_spec_from_table({"command": ["x"], **table}, "j.toml")
        assert line in str(ex.value), str(ex.value)


def test_queue_table_shows_the_range_and_the_size_now() -> None:
    from hsched.cli.listing import gpus_cell

    spec = job_spec_from_table({"command": ["x"], "resources": {"gpus": "2-8"}}, "job.toml")
    running = job_to_dict(Job(id=1, spec=spec, user="u", state=JobState.RUNNING, reason="", submit_time=0.0,
                              placement=(Placement("n", ("a", "b", "c", "d")),)))
    pending = job_to_dict(Job(id=2, spec=spec, user="u", state=JobState.PENDING, reason="", submit_time=0.0))
    rigid = job_to_dict(Job(id=3, spec=spec_from_dict({"command": ["x"], "resources": {"gpus": 4}}), user="u",
                            state=JobState.PENDING, reason="", submit_time=0.0))
    assert (gpus_cell(running), gpus_cell(pending), gpus_cell(rigid)) == ("2-8:4", "2-8", "4")


def test_show_rows() -> None:
    from hsched.cli.jobs import _elastic_line, _resizes_line, _resources_line

    spec = job_spec_from_table({"command": ["x"], "resources": {"gpus": "2-8"}}, "job.toml")
    job = job_to_dict(Job(id=1, spec=spec, user="u", state=JobState.RUNNING, reason="", submit_time=0.0,
                          placement=(Placement("n", ("a", "b", "c", "d")),)))
    assert _elastic_line(job) == "2-8 GPUs per node, now 4"
    assert _resizes_line([{"kind": "grow", "from": 2, "to": 8, "speedup": 4.0, "scaling": "prior"},
                          {"kind": "shrink", "from": 8, "to": 4, "speedup": None}]) == (
        "2: grow 2 -> 8 (4.00x steps/s, prior); shrink 8 -> 4")
    assert _resources_line({"gpus": 2, "gpus_max": 8, "nodes": 2, "nodes_max": 4}) == (
        "2-8 GPUs (elastic), x 2-4 nodes (elastic)")
