"""Usage mistakes are one line naming the option and where to look, exit 2 (issue 16), never Typer's box."""

from __future__ import annotations

from pathlib import Path

import pytest

from hsched.cli import main


def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.argv", ["hsched", *argv])
    with pytest.raises(SystemExit) as ex:
        main()
    out, err = capsys.readouterr()
    return int(ex.value.code or 0), out, err


@pytest.mark.parametrize(("argv", "words"), [
    (["submit", "--bogus"], "hsched submit: No such option: --bogus"),
    (["submit", "--cpus", "x", "--", "true"], "Invalid value for '--cpus'"),  # (--gpus x: test_elastic_cli)
    (["submit", "--retries", "101", "--", "true"], "Invalid value for '--retries'"),
    (["queue", "extra"], "hsched queue: Got unexpected extra argument"),
    (["nosuch"], "No such command 'nosuch'"),
])
def test_a_usage_mistake_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                argv: list[str], words: str) -> None:
    code, out, err = run(monkeypatch, capsys, *argv)
    assert code == 2 and out == ""
    [line] = err.splitlines()
    assert line.startswith("hsched: error: ") and words in line and line.endswith("--help)")


def test_version_and_help_still_work(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(monkeypatch, capsys, "--version")
    assert code == 0 and out.startswith("hsched ")
    code, out, _ = run(monkeypatch, capsys, "submit", "--help")
    assert code == 0 and "--retries" in out


@pytest.mark.parametrize("argv", [["queue"], ["submit", "--", "true"], ["daemon", "start"], ["nodes"], ["dash"]])
def test_an_unusable_hsched_home_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                        argv: list[str]) -> None:
    # a folder that cannot be made (under a file here; a read-only mount or another user's folder alike)
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("HSCHED_HOME", str(tmp_path / "file" / "home"))
    code, _out, err = run(monkeypatch, capsys, *argv)
    assert code == 2
    [line] = err.splitlines()
    assert line.startswith(f"hsched: error: HSCHED_HOME {tmp_path / 'file' / 'home'}: cannot create or open it")
    assert "set HSCHED_HOME to a folder you can write" in line
