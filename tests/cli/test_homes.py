"""Where a CLI finds its controller (hsched.homes, in strings, which `Home.from_env` is built on): HSCHED_HOME in its
marker's mode, then a lab controller's socket, then a lab marked on this machine, then the user's own home; and the
socket a quick path connects to is that home's (`Client` without a home never imports hsched.paths to find it)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from hsched import homes
from hsched.client import Client
from hsched.paths import LAB_SOCKET, Home


@pytest.fixture
def place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("HSCHED_HOME", "HSCHED_LAB_SOCKET", "HSCHED_LAB_HOME", "XDG_STATE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HSCHED_LAB_SOCKET", str(tmp_path / "run" / "lab.sock"))
    monkeypatch.setenv("HSCHED_LAB_HOME", str(tmp_path / "labhome"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def found(expected_root: Path, lab: bool, sock: Path) -> None:
    home = Home.from_env()
    assert (home.root, home.lab, home.socket) == (expected_root, lab, sock)
    assert Path(homes.socket_path()) == home.socket
    c = Client(autostart=False)
    assert Path(c._socket_path()) == sock and c._home is None  # (found without the Home)
    assert c.home == home


def test_the_users_own_home_when_nothing_else_is_set(place: Path) -> None:
    found(place / "state" / "hsched", False, place / "state" / "hsched" / "controller.sock")


def test_hsched_home_relative_or_marked_a_lab(place: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HSCHED_HOME", "mine/./home")
    found(place / "mine" / "home", False, place / "mine" / "home" / "controller.sock")
    marked = place / "marked"
    marked.mkdir()
    (marked / "lab.json").write_text(json.dumps({"socket": str(place / "elsewhere.sock")}))
    monkeypatch.setenv("HSCHED_HOME", str(marked))
    found(marked, True, place / "elsewhere.sock")
    (marked / "lab.json").write_text("{}")  # (a marker naming no socket: the well-known one)
    found(marked, True, LAB_SOCKET)
    (marked / "lab.json").write_text("not json")  # (unreadable: a personal home)
    found(marked, False, marked / "controller.sock")


def test_a_lab_controllers_socket_then_a_lab_marked_here(place: Path) -> None:
    (place / "labhome").mkdir()
    (place / "labhome" / "lab.json").write_text("{}")
    found(place / "labhome", True, LAB_SOCKET)  # (its controller down: its home still, never a private one)
    (place / "run").mkdir()
    srv = socket.socket(socket.AF_UNIX)
    try:
        srv.bind(str(place / "run" / "lab.sock"))
        found(place / "labhome", True, place / "run" / "lab.sock")
    finally:
        srv.close()
