"""A lab never silently splits (issue 29, item 3): when a lab is marked on this machine and its controller does not
answer, every command says so in one line (exit 1) and none starts a private controller; only `daemon start` and
`daemon restart` (by the lab home's owner) start the lab's own. In-process: the CLI with process starts forbidden."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hsched.cli import main
from hsched.client import Client
from hsched.errors import ControllerError
from hsched.paths import Home


@pytest.fixture
def lab_down(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    home = tmp_path / "lab"
    home.mkdir()
    (home / "lab.json").write_text(json.dumps({"socket": str(tmp_path / "lab.sock")}))
    monkeypatch.delenv("HSCHED_HOME", raising=False)
    monkeypatch.setenv("HSCHED_LAB_HOME", str(home))
    monkeypatch.setenv("HSCHED_LAB_SOCKET", str(tmp_path / "lab.sock"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "personal"))

    def no_process(*a: object, **k: object) -> None:
        raise AssertionError(f"a process was started: {a}")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    return home


def test_the_marked_lab_is_the_home_even_when_its_socket_is_gone(lab_down: Path) -> None:
    home = Home.from_env()
    assert (home.root, home.lab) == (lab_down, True)


def test_a_client_refuses_rather_than_starting_a_private_controller(lab_down: Path, tmp_path: Path) -> None:
    with pytest.raises(ControllerError, match=r"the lab's controller does not answer on .*lab\.sock"):
        Client().call("queue")
    assert not (tmp_path / "personal").exists()  # no personal home was made, let alone a controller


@pytest.mark.parametrize("argv", [["queue"], ["submit", "--", "true"], ["nodes"]])
def test_every_command_says_so_in_one_line_with_exit_1(lab_down: Path, tmp_path: Path, argv: list[str],
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.argv", ["hsched", *argv])
    with pytest.raises(SystemExit) as ex:
        main()
    err = capsys.readouterr().err.strip().splitlines()
    assert ex.value.code == 1
    assert len(err) == 1 and "the lab's controller does not answer" in err[0] and "daemon start --lab" in err[0]
    assert not (tmp_path / "personal").exists()


def test_without_a_lab_the_personal_home_is_unchanged(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HSCHED_HOME", raising=False)
    monkeypatch.setenv("HSCHED_LAB_HOME", str(tmp_path / "nolab"))
    monkeypatch.setenv("HSCHED_LAB_SOCKET", str(tmp_path / "nolab.sock"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "personal"))
    home = Home.from_env()
    assert (home.root, home.lab) == (tmp_path / "personal" / "hsched", False)
