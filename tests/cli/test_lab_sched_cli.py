"""`--constraint`/`-C` (options, spec files, #SBATCH lines) and `hsched share`, with the controller replaced by a
recorder: what the CLI sends and prints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hsched.cli import main

SHARE = {"half_life_s": 604800.0, "policy": "hsched", "users": [
    {"user": "lab1", "account": "physics", "shares": 1, "norm_shares": 0.25, "raw_usage_gpu_hours": 12.5,
     "decayed_usage_gpu_hours": 10.25, "effective_usage": 0.8, "fairshare": 0.109},
    {"user": "lab2", "account": "bio", "shares": 2, "norm_shares": 0.5, "raw_usage_gpu_hours": 3.0,
     "decayed_usage_gpu_hours": 2.5, "effective_usage": 0.2, "fairshare": 0.758},
]}


class Recorder:
    calls: list[dict[str, Any]] = []

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def reachable(self) -> bool:
        return False  # as with no controller yet: the CLI checks the spec itself first

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        Recorder.calls.append({"op": op, **args})
        if op == "share":
            return json.loads(json.dumps(SHARE))
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


def test_constraint_option_long_and_short(monkeypatch: pytest.MonkeyPatch, calls: list[dict[str, Any]]) -> None:
    assert run(monkeypatch, "submit", "--constraint", "nvme&ib", "-G", "1", "--", "true") == 0
    assert run(monkeypatch, "submit", "-C", "a100|h100", "--", "true") == 0
    assert [c["spec"]["resources"]["constraint"] for c in calls] == ["nvme&ib", "a100|h100"]


def test_bad_constraint_syntax_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch, calls: list[dict[str, Any]],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert run(monkeypatch, "submit", "-C", "nvme&&ib", "--", "true") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "resources.constraint: 'nvme&&ib' is not a constraint: expected labels joined" in err[0]
    assert calls == []  # refused before the controller is asked


def test_sbatch_constraint_lines_are_honoured_and_the_command_line_wins(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, calls: list[dict[str, Any]],
        capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\n#SBATCH --constraint=nvme&ib\n#SBATCH -G 1\npython train.py\n")
    assert run(monkeypatch, "submit", str(script)) == 0
    assert "ignored" not in capsys.readouterr().err
    short = tmp_path / "short.sh"
    short.write_text("#!/bin/bash\n#SBATCH -C bigmem\ntrue\n")
    assert run(monkeypatch, "submit", str(short)) == 0
    assert run(monkeypatch, "submit", "-C", "ib", str(short)) == 0
    assert [c["spec"]["resources"]["constraint"] for c in calls] == ["nvme&ib", "bigmem", "ib"]
    spec = tmp_path / "job.toml"
    spec.write_text('command = ["true"]\nconstraint = "nvme"\n')
    assert run(monkeypatch, "submit", str(spec), "-C", "ib") == 0
    assert calls[-1]["spec"]["resources"]["constraint"] == "ib" and "constraint" not in calls[-1]["spec"]


def test_share_prints_a_table_and_json(monkeypatch: pytest.MonkeyPatch, calls: list[dict[str, Any]],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert run(monkeypatch, "share") == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["ACCOUNT", "USER", "SHARES", "NORM", "RAW_GPU_H", "DECAYED_GPU_H", "EFFECTV",
                                "FAIRSHARE"]
    assert lines[1].split() == ["physics", "lab1", "1", "0.250", "12.50", "10.25", "0.800", "0.109"]
    assert "half-life of 7 days" in out
    assert run(monkeypatch, "share", "--json", "-u", "lab2") == 0
    got = json.loads(capsys.readouterr().out)
    assert [r["user"] for r in got["users"]] == ["lab2"] and got["half_life_s"] == 604800.0
    assert run(monkeypatch, "share", "--json", "-A", "physics") == 0
    assert [r["user"] for r in json.loads(capsys.readouterr().out)["users"]] == ["lab1"]
