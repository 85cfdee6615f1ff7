"""The lab's socket: open to every local user, or to one group's members; its folder may not be writable by
others (they could put a socket of their own in its place and read every request)."""

from __future__ import annotations

import grp
import os
import socket
import stat
from pathlib import Path

import pytest

from hsched.controller.server import lab_socket_dir, open_to_lab
from hsched.errors import UserError
from hsched.paths import LAB_SOCKET, Home


def bound(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    return s


def test_every_user_or_one_groups_members(tmp_path: Path) -> None:
    path = tmp_path / "hsched.sock"
    with bound(path):
        open_to_lab(path, None)
        assert stat.S_IMODE(path.stat().st_mode) == 0o666
        group = grp.getgrgid(os.getgid()).gr_name
        open_to_lab(path, group)
        st = path.stat()
        assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o660, os.getgid())
        with pytest.raises(UserError, match=r"^settings lab_group: no group 'no-such-group-hs' on this machine"):
            open_to_lab(path, "no-such-group-hs")


def test_a_folder_others_may_write_is_refused(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with pytest.raises(UserError, match="writable by others"):
        lab_socket_dir(open_dir / "hsched.sock")
    lab_socket_dir(tmp_path / "run" / "hsched" / "hsched.sock")  # made 0755 when missing
    assert stat.S_IMODE((tmp_path / "run" / "hsched").stat().st_mode) == 0o755


def test_a_homes_mode_comes_from_its_marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HSCHED_LAB_SOCKET", raising=False)
    monkeypatch.setenv("HSCHED_HOME", str(tmp_path / "lab"))
    lab = Home.for_lab()
    lab.mark_lab()
    again = Home.at(tmp_path / "lab")
    assert (again.lab, again.socket, again.mode) == (True, LAB_SOCKET, "lab")
    assert stat.S_IMODE((tmp_path / "lab").stat().st_mode) == 0o711
    assert stat.S_IMODE(again.marker.stat().st_mode) == 0o644
    assert Home.at(tmp_path / "personal").lab is False
    monkeypatch.setenv("HSCHED_LAB_SOCKET", str(tmp_path / "elsewhere.sock"))
    monkeypatch.delenv("HSCHED_HOME")
    assert Home.from_env().lab is False  # no lab socket there: the personal controller
    with bound(tmp_path / "elsewhere.sock"):
        found = Home.from_env()
        assert (found.lab, found.socket) == (True, tmp_path / "elsewhere.sock")
