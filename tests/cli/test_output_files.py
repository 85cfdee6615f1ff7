"""sbatch's -o/--output and -e/--error (issue 16): the patterns, the spec keys, the command line and #SBATCH lines.
The controller is replaced by a recorder: what the node does with the files is tests/e2e/test_output_files.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hsched.config import ConfigError, job_spec_from_table
from hsched.serialize import spec_from_dict, spec_to_dict
from hsched.spec.outfiles import NO_ARRAY_TASK, expand, pattern_problem
from tests.cli.test_submit_args import Recorder, submit


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, Any]]:
    """What the CLI sends the controller (test_submit_args' recorder)."""
    monkeypatch.setenv("HSCHED_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("hsched.cli.jobs._client", Recorder)
    monkeypatch.setattr("hsched.cli.submitting._client", Recorder)
    Recorder.calls = []
    return Recorder.calls


def _expand(pattern: str, **kw: Any) -> str:
    args: dict[str, Any] = {"job_id": 12, "array_id": None, "array_task": None, "name": "train", "user": "ada",
                            "node": "gpu1"}
    return expand(pattern, **{**args, **kw})


def test_the_patterns_expand_as_sbatchs() -> None:
    assert _expand("slurm-%j.out") == "slurm-12.out"
    assert _expand("%x-%u-%N.log") == "train-ada-gpu1.log"
    assert _expand("%A_%a.out", job_id=15, array_id=12, array_task=3) == "12_3.out"
    # outside an array %A is the job id and %a Slurm's "no value", so a script run both ways keeps its names
    assert _expand("%A_%a.out") == f"12_{NO_ARRAY_TASK}.out"
    assert _expand("r%t-n%n.log", node_index=1, rank=5) == "r5-n1.log"
    assert _expand("100%%-%4j.out") == "100%-0012.out"
    assert _expand("%12j") == "0000000012"  # sbatch caps the width at 10
    assert _expand("%3x") == "train"  # a width pads numbers only
    assert _expand("logs/%x/%j") == "logs/train/12"
    assert _expand("out\\%j.log") == "out%j.log"  # a backslash: taken literally, as sbatch


@pytest.mark.parametrize(("pattern", "why"), [
    ("x-%q.out", "unknown %q"), ("x-%J", "unknown %J"), ("50%", "lone %"), ("", "expected a file name"),
    ("  ", "expected a file name"), ("a\0b", "NUL"),
])
def test_bad_patterns_say_why(pattern: str, why: str) -> None:
    assert why in (pattern_problem(pattern) or "")


def test_good_patterns_pass() -> None:
    for p in ("slurm-%j.out", "%x_%A_%a.%u.%N.%n.%t.%%", "plain.log", "/abs/%5j", "lit\\%q"):
        assert pattern_problem(p) is None, p


def test_a_spec_table_takes_output_and_error_and_they_survive_the_store() -> None:
    spec = job_spec_from_table({"command": ["true"], "output": "logs/%x-%j.out", "error": "%j.err"}, "job.toml")
    assert (spec.output, spec.error) == ("logs/%x-%j.out", "%j.err")
    again = spec_from_dict(spec_to_dict(spec))
    assert (again.output, again.error, again.output_append) == (spec.output, spec.error, False)
    appending = job_spec_from_table({"command": ["true"], "output": "o", "open_mode": "append"}, "job.toml")
    assert appending.output_append and spec_from_dict(spec_to_dict(appending)).output_append
    plain = job_spec_from_table({"command": ["true"]}, "job.toml")
    assert (plain.output, plain.error) == (None, None)
    # a record stored before these keys existed reads as "no files"
    old = spec_to_dict(plain)
    del old["output"], old["error"]
    assert spec_from_dict(old).output is None


def test_a_spec_tables_bad_pattern_names_the_file_and_key() -> None:
    with pytest.raises(ConfigError) as e:
        job_spec_from_table({"command": ["true"], "output": "x-%q", "error": 3, "open_mode": "add"}, "job.toml")
    lines = str(e.value).splitlines()
    assert "job.toml: open_mode: expected append or truncate (as sbatch's --open-mode), found 'add'" in lines
    assert any(line.startswith("job.toml: output: unknown %q") for line in lines), lines
    assert "job.toml: error: expected a non-empty string, found 3" in lines


def test_the_command_line_options(monkeypatch: pytest.MonkeyPatch,
                                  submitted: list[dict[str, Any]]) -> None:
    assert submit(monkeypatch, "-o", "slurm-%j.out", "-e", "%x.err", "--env", "A=1", "--", "true") == 0
    assert submit(monkeypatch, "--output=o-%A_%a", "--error", "e.log", "--", "true") == 0
    assert submit(monkeypatch, "--", "true") == 0
    first, second, plain = (c["spec"] for c in submitted)
    assert (first["output"], first["error"], first["env"]) == ("slurm-%j.out", "%x.err", {"A": "1"})
    assert (second["output"], second["error"]) == ("o-%A_%a", "e.log")
    assert "output" not in plain and "error" not in plain


@pytest.mark.parametrize(("argv", "line"), [
    (["-o", "x-%q.out"], "hsched: error: --output 'x-%q.out': unknown %q (known: %j job id"),
    (["--error", "50%"], "hsched: error: --error '50%': ends with a lone %"),
    # what -e meant before it became sbatch's: refused, naming --env, never turned into a file
    (["-e", "A=1"], "hsched: error: --error 'A=1': -e is sbatch's --error FILE; give --env A=1"),
    (["--open-mode", "add"], "hsched: error: --open-mode 'add': expected append or truncate"),
])
def test_a_bad_option_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch, submitted: list[dict[str, Any]],
                                            capsys: pytest.CaptureFixture[str], argv: list[str], line: str) -> None:
    assert submit(monkeypatch, *argv, "--", "true") == 2
    [got] = capsys.readouterr().err.splitlines()
    assert got.startswith(line), got
    assert submitted == []


def test_a_file_named_like_a_variable_is_still_possible(monkeypatch: pytest.MonkeyPatch,
                                                       submitted: list[dict[str, Any]]) -> None:
    assert submit(monkeypatch, "-e", "./A=1", "--", "true") == 0
    assert submitted[0]["spec"]["error"] == "./A=1"


def test_sbatch_lines_set_the_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                    submitted: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\n#SBATCH -o logs/%x-%j.out\n#SBATCH --error=logs/%x-%j.err --open-mode=append\n"
                      "#SBATCH -J tr\necho hi\n")
    assert submit(monkeypatch, str(script)) == 0
    spec = submitted[0]["spec"]
    assert (spec["output"], spec["error"], spec["name"]) == ("logs/%x-%j.out", "logs/%x-%j.err", "tr")
    assert spec["open_mode"] == "append"
    assert capsys.readouterr().err == ""  # honoured, not ignored with a warning
    # the command line wins over the script's lines, as sbatch
    assert submit(monkeypatch, "-o", "mine.out", str(script)) == 0
    assert submitted[1]["spec"]["output"] == "mine.out"


def test_sbatch_lines_with_the_value_attached(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                              submitted: list[dict[str, Any]]) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n#SBATCH -oa-%j.out -eb-%j.err --open-mode truncate\necho hi\n")
    assert submit(monkeypatch, str(script)) == 0
    spec = submitted[0]["spec"]
    assert (spec["output"], spec["error"], spec["open_mode"]) == ("a-%j.out", "b-%j.err", "truncate")


def test_a_bad_pattern_in_an_sbatch_line_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                     submitted: list[dict[str, Any]],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\n#SBATCH --output=slurm-%Z.out\necho hi\n")
    assert submit(monkeypatch, str(script)) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("hsched: error: --output 'slurm-%Z.out': unknown %Z"), line


def test_show_says_where_the_output_goes() -> None:
    from hsched.cli.jobs import _files_line

    assert _files_line({"id": 5, "display_id": "5"}) == "hsched logs 5"
    assert _files_line({"id": 5, "output": "o-%j", "error": None}) == "o-%j (stdout and stderr)"
    assert _files_line({"id": 5, "output": "o", "error": "e"}) == "stdout o, stderr e"
    assert _files_line({"id": 5, "output": None, "error": "e"}) == "stdout (hsched logs only), stderr e"
