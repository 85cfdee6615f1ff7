"""`-p/--partition` (issue 16): a partition is the set of nodes carrying that label in the fleet file, folded into
the job's constraint; an unknown one is refused at submit naming the known ones. The controller is a recorder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hsched.cli import main
from hsched.cli.listing import format_queue
from hsched.spec.constraints import parse_constraint, partition_constraint, with_partition

PARTITIONS = {"partitions": {"debug": ["b"], "gpu": ["a", "b"]}}


class Recorder:
    calls: list[dict[str, Any]] = []

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def reachable(self) -> bool:
        return False

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        Recorder.calls.append({"op": op, **args})
        if op == "partitions":
            return PARTITIONS
        return {"id": 7, "state": "PENDING"}


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, Any]]:
    monkeypatch.setenv("HSCHED_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("hsched.cli.jobs._client", Recorder)
    monkeypatch.setattr("hsched.cli.submitting._client", Recorder)
    Recorder.calls = []
    return Recorder.calls


def run(monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    monkeypatch.setattr("sys.argv", ["hsched", *argv])
    with pytest.raises(SystemExit) as ex:
        main()
    return int(ex.value.code or 0)


def constraints(calls: list[dict[str, Any]]) -> list[str]:
    return [c["spec"]["resources"]["constraint"] for c in calls if c["op"] == "submit"]


def test_partition_texts() -> None:
    assert partition_constraint("gpu") == "gpu" and partition_constraint("gpu, debug,gpu") == "gpu|debug"
    assert with_partition("gpu,debug", "nvme|ssd") == "(gpu|debug)&(nvme|ssd)"
    c = parse_constraint(with_partition("gpu,debug", "nvme|ssd"))
    assert c.satisfied_by({"debug", "ssd"}) and not c.satisfied_by({"gpu"}) and not c.satisfied_by({"nvme"})
    for bad in ("", "a b", "gpu|debug", "gpu,"):
        with pytest.raises(ValueError, match="partition"):
            partition_constraint(bad)


def test_partition_long_short_and_with_a_constraint(monkeypatch: pytest.MonkeyPatch,
                                                     calls: list[dict[str, Any]]) -> None:
    assert run(monkeypatch, "submit", "-p", "gpu", "--", "true") == 0
    assert run(monkeypatch, "submit", "--partition=gpu,debug", "-C", "nvme", "--", "true") == 0
    assert run(monkeypatch, "submit", "-p", "debug", "-G", "1", "echo", "hi") == 0
    assert constraints(calls) == ["gpu", "(gpu|debug)&(nvme)", "debug"]
    assert [c["op"] for c in calls].count("partitions") == 3


def test_an_unknown_partition_is_one_line_naming_the_known_ones(monkeypatch: pytest.MonkeyPatch,
                                                                calls: list[dict[str, Any]],
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert run(monkeypatch, "submit", "-p", "gpu,nope", "--", "true") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--partition 'nope'" in err and "known: debug, gpu" in err
    assert run(monkeypatch, "submit", "-p", "a b", "--", "true") == 2
    assert "--partition 'a b': expected a partition name" in capsys.readouterr().err
    assert constraints(calls) == []


def test_sbatch_partition_lines_and_spec_files(monkeypatch: pytest.MonkeyPatch, calls: list[dict[str, Any]],
                                              tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\n#SBATCH -p debug\n#SBATCH --constraint=nvme\npython train.py\n")
    assert run(monkeypatch, "submit", str(script)) == 0
    assert "ignored" not in capsys.readouterr().err  # no longer an option sbatch has and hsched ignores
    script.write_text("#!/bin/bash\n#SBATCH --partition=gpu\npython train.py\n")
    assert run(monkeypatch, "submit", str(script), "x") == 0
    assert run(monkeypatch, "submit", "-p", "debug", str(script)) == 0  # the command line's wins
    spec = tmp_path / "job.toml"
    spec.write_text('command = ["true"]\nconstraint = "ib"\n')
    assert run(monkeypatch, "submit", str(spec), "-p", "gpu") == 0
    assert constraints(calls) == ["debug&(nvme)", "gpu", "debug", "gpu&(ib)"]


def test_queue_format_shows_the_partition() -> None:
    jobs = [{"id": 3, "name": "x", "user": "u", "state": "PENDING", "array_id": None, "constraint": "gpu|debug",
             "reason": "Priority", "placement": []},
            {"id": 4, "name": "y", "user": "u", "state": "PENDING", "array_id": None, "constraint": None,
             "reason": "Priority", "placement": []}]
    assert format_queue(jobs, "%i %P %f") == ["JOBID PARTITION FEATURES", "3 gpu|debug gpu|debug",
                                             "4 (null) (null)"]

