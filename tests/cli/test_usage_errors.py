"""Usage mistakes are one line naming the option and where to look, exit 2 (issue 16), never Typer's box."""

from __future__ import annotations

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
    (["submit", "--gpus", "x", "--", "true"], "Invalid value for '--gpus'"),
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
