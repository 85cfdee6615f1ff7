"""The quick `hsched daemon status [--json]` (issue 33): answered without Typer, exactly as Typer's command
answers (exit code, stdout, stderr), whether the controller runs healthy, unhealthy, not at all or does not
answer; anything else after `status` is Typer's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hsched.cli import main
from hsched.cli.status import quick_status
from hsched.errors import ControllerError
from hsched.paths import Home

CASES = {
    "healthy": (4242, {"pid": 4242, "api": 3, "health": "ok", "mode": "personal"}),
    "unhealthy": (4242, {"pid": 4242, "api": 3, "health": "unhealthy", "health_error": "node n1 down"}),
    "stopped": (None, None),
    "silent": (4242, ControllerError("the controller does not answer (test)")),
}


def fake_client(home: Path, reply: Any) -> type:
    class Fake:
        def __init__(self, autostart: bool = True) -> None:
            self.home = Home(home)

        def __enter__(self) -> Fake:
            return self

        def __exit__(self, *_: object) -> None:
            return None

        def call(self, op: str, **_args: Any) -> Any:
            assert op == "ping"
            if isinstance(reply, Exception):
                raise reply
            return dict(reply)

    return Fake


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("as_json", [False, True])
def test_quick_and_typer_say_the_same(case: str, as_json: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    pid, reply = CASES[case]
    monkeypatch.setattr("hsched.client.Client", fake_client(tmp_path, reply))
    monkeypatch.setattr("hsched.client.controller_pid", lambda _home: pid)
    from hsched.cli._app import run as typer_run

    said = []
    for entry in (main, typer_run):
        monkeypatch.setattr("sys.argv", ["hsched", "daemon", "status", *(["--json"] if as_json else [])])
        with pytest.raises(SystemExit) as ex:
            entry()
        out, err = capsys.readouterr()
        said.append((int(ex.value.code or 0), out, err))
    assert said[0] == said[1]
    assert said[0][0] == (1 if case in ("unhealthy", "silent") else 0)


@pytest.mark.parametrize("argv", [["--help"], ["--json", "--json"], ["extra"], ["--jsn"]])
def test_anything_else_is_typers(argv: list[str]) -> None:
    assert quick_status(list(argv)) is None
