"""How `hsched submit` reads its arguments (issue 16): options before or after a spec file, a command after
`--` or after the spec, sbatch's meanings. The controller is replaced by a recorder: only the parsing is tested."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hsched.cli import main


class Recorder:
    calls: list[dict[str, Any]] = []

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        Recorder.calls.append({"op": op, **args})
        return {"id": 7, "state": "PENDING"}


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, Any]]:
    monkeypatch.setenv("HSCHED_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("hsched.cli.jobs._client", Recorder)
    Recorder.calls = []
    return Recorder.calls


def submit(monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    monkeypatch.setattr("sys.argv", ["hsched", "submit", *argv])
    with pytest.raises(SystemExit) as ex:
        main()
    return int(ex.value.code or 0)


def spec_file(tmp_path: Path) -> Path:
    p = tmp_path / "eval.toml"
    p.write_text('command = ["python", "eval.py"]\nqos = "normal"\n[resources]\ngpus = 1\n')
    return p


def test_options_after_a_spec_file_are_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                               submitted: list[dict[str, Any]]) -> None:
    assert submit(monkeypatch, str(spec_file(tmp_path)), "--qos", "prod", "--gpus", "2", "-t", "90") == 0
    [call] = submitted
    spec = call["spec"]
    assert spec["command"] == ["python", "eval.py"] and spec["qos"] == "prod"
    assert spec["resources"]["gpus"] == 2 and spec["time"] == "90"


def test_options_after_the_spec_win_over_options_before_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                          submitted: list[dict[str, Any]]) -> None:
    assert submit(monkeypatch, "--qos", "scavenger", "--name", "x", str(spec_file(tmp_path)), "--qos", "prod") == 0
    spec = submitted[0]["spec"]
    assert (spec["qos"], spec["name"]) == ("prod", "x")


def test_a_command_after_the_spec_and_options_replaces_the_specs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                submitted: list[dict[str, Any]]) -> None:
    assert submit(monkeypatch, str(spec_file(tmp_path)), "--qos", "prod", "--", "python", "other.py", "--lr",
                  "3") == 0
    assert submitted[0]["spec"]["command"] == ["python", "other.py", "--lr", "3"]


def test_a_bare_command_keeps_its_own_options(monkeypatch: pytest.MonkeyPatch,
                                              submitted: list[dict[str, Any]]) -> None:
    assert submit(monkeypatch, "--gpus", "1", "--", "python", "train.py", "--qos", "x") == 0
    assert submit(monkeypatch, "python", "train.py", "--epochs", "3") == 0
    assert submitted[0]["spec"]["command"] == ["python", "train.py", "--qos", "x"]
    assert submitted[1]["spec"]["command"] == ["python", "train.py", "--epochs", "3"]


def test_a_bad_option_after_the_spec_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                 submitted: list[dict[str, Any]],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert submit(monkeypatch, str(spec_file(tmp_path)), "--bogus") == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "No such option: --bogus" in line and submitted == []


def test_dependency_options(monkeypatch: pytest.MonkeyPatch, submitted: list[dict[str, Any]],
                            capsys: pytest.CaptureFixture[str]) -> None:
    assert submit(monkeypatch, "-d", "afterok:3:4", "--kill-on-invalid-dep", "--", "true") == 0
    spec = submitted[0]["spec"]
    assert (spec["dependency"], spec["kill_on_invalid_dep"]) == ("afterok:3:4", True)
    assert submit(monkeypatch, "--dependency", "afterok:x", "--", "true") == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("hsched: error: <command line>: dependency: expected a dependency such as afterok:12")
