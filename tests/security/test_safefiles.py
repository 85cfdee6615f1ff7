"""hsched/node/safefiles.py on its own, in-process (the fast lane): what a copy keeps and drops, a name swapped between
the look and the open, a hostile tar file. tests/security/test_copies.py attacks every copy path with real users."""

from __future__ import annotations

import io
import os
import socket
import stat
import tarfile
import threading
from pathlib import Path

import pytest

from hsched.node import safefiles


def _hostile_folder(src: Path) -> None:
    (src / "sub").mkdir(parents=True)
    (src / "data.bin").write_bytes(b"weights")
    (src / "sub" / "step").write_text("12\n")
    (src / "suid").write_bytes(b"#!/bin/sh\n")
    os.chmod(src / "suid", 0o6755)
    os.chmod(src / "sub", 0o3775)  # setgid and sticky
    (src / "link-out").symlink_to("/etc/passwd")
    (src / "link-up").symlink_to("../../../../etc/passwd")
    (src / "dangling").symlink_to(src / "nothing")
    os.mkfifo(src / "pipe")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(src / "sock"))
    s.close()


def _kinds(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): stat.filemode(p.lstat().st_mode) for p in sorted(root.rglob("*"))}


def test_a_copy_is_regular_files_and_folders_with_permission_bits_only(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _hostile_folder(src)
    counts = safefiles.copy_into(str(src), str(tmp_path), "dst")
    dst = tmp_path / "dst"
    assert _kinds(dst) == {"data.bin": "-rw-r--r--", "sub": "drwxrwxr-x", "sub/step": "-rw-r--r--",
                           "suid": "-rwxr-xr-x"}
    assert (dst / "data.bin").read_bytes() == b"weights" and (dst / "sub" / "step").read_text() == "12\n"
    assert (counts.files, counts.dirs, counts.dropped) == (3, 1, 5)
    assert sorted(why for _rel, why in counts.dropped_named) == ["FIFO", "socket", "symbolic link",
                                                                  "symbolic link", "symbolic link"]


def test_a_link_or_a_fifo_named_as_the_source_is_refused_not_followed(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(safefiles.Unsafe, match="symbolic link"):
        safefiles.copy_into(str(tmp_path / "link"), str(tmp_path), "out")
    with pytest.raises(safefiles.Unsafe, match="FIFO"):  # opened O_NONBLOCK: no writer needed to get here
        safefiles.copy_into(str(tmp_path / "fifo"), str(tmp_path), "out2")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()


def test_a_file_swapped_for_a_fifo_or_a_link_after_the_look_is_dropped_without_blocking(tmp_path: Path) -> None:
    """The race a member can run against any walk: lstat saw a file, the open finds something else. The open
    must not wait for a writer (the walk runs in a thread, but a thread stuck for ever is a copy stuck for ever)
    and what it opened must be what was looked at."""
    d = tmp_path / "d"
    d.mkdir()
    (d / "x").write_bytes(b"1")
    fd = os.open(d, os.O_RDONLY)
    try:
        looked = os.stat("x", dir_fd=fd, follow_symlinks=False)
        os.rename(d / "x", d / "kept")  # the inode stays taken: a new file cannot reuse its number
        os.mkfifo(d / "x")
        result: list[object] = []
        t = threading.Thread(target=lambda: result.append(safefiles._open_entry(fd, "x", looked)), daemon=True)
        t.start()
        t.join(30)  # a safety net: the answer comes at once
        assert result == [None]
        os.unlink(d / "x")
        (d / "x").symlink_to("/etc/passwd")
        assert safefiles._open_entry(fd, "x", looked) is None
        os.unlink(d / "x")
        (d / "x").write_bytes(b"2")  # a new file of the same name: another inode, not what was listed
        assert safefiles._open_entry(fd, "x", looked) is None
    finally:
        os.close(fd)


def test_a_hostile_tar_file_lays_no_link_device_or_setuid_bit_and_stays_inside(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(name: str, kind: bytes, mode: int = 0o644, data: bytes = b"", link: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.size, info.linkname = kind, mode, len(data), link
            tar.addfile(info, io.BytesIO(data) if data else None)

        add("ok", tarfile.REGTYPE, 0o4755, b"data")
        add("dir", tarfile.DIRTYPE, 0o3777)
        add("dir/f", tarfile.REGTYPE, 0o2644, b"x")
        add("sym", tarfile.SYMTYPE, link="/etc/shadow")
        add("hard", tarfile.LNKTYPE, link="/etc/shadow")
        add("dev", tarfile.CHRTYPE)
        add("fifo", tarfile.FIFOTYPE)
    buf.seek(0)
    counts = safefiles.unpack(buf, str(tmp_path), "out")
    assert _kinds(tmp_path / "out") == {"dir": "drwxrwxrwx", "dir/f": "-rw-r--r--", "ok": "-rwxr-xr-x"}
    assert counts.dropped == 4
    for outside in ("../escape", "/abs"):
        b2 = io.BytesIO()
        with tarfile.open(fileobj=b2, mode="w") as tar:
            info = tarfile.TarInfo(outside)
            tar.addfile(info, io.BytesIO(b""))
        b2.seek(0)
        with pytest.raises(safefiles.Unsafe, match="outside"):
            safefiles.unpack(b2, str(tmp_path), f"out-{len(outside)}")
    assert not (tmp_path / "escape").exists()


def test_a_tree_nested_past_the_bound_is_refused(tmp_path: Path) -> None:
    deep = tmp_path / "src"
    p = deep
    for _i in range(safefiles.MAX_DEPTH + 2):
        p = p / "d"
    p.mkdir(parents=True)
    with pytest.raises(safefiles.Unsafe, match="deeper"):
        safefiles.copy_into(str(deep), str(tmp_path), "out")


def test_a_folder_swapped_for_a_link_between_the_look_and_the_open_is_not_entered(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "f").write_bytes(b"mine")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "f").write_bytes(b"someone else's")
    fd = os.open(src, os.O_RDONLY)
    try:
        looked = os.stat("sub", dir_fd=fd, follow_symlinks=False)
        os.rename(src / "sub", src / "sub.real")
        (src / "sub").symlink_to(elsewhere)
        assert safefiles._open_entry(fd, "sub", looked) is None
    finally:
        os.close(fd)


def test_the_helpers_read_of_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    # `read` (a run's log for `hsched logs`) serves every request of its node from one process: a FIFO laid where
    # a log was must be refused at once, not waited on for a writer that never comes
    from hsched.node import confine, files

    fifo = tmp_path / "output.log"
    os.mkfifo(fifo)
    outcome: list[str] = []

    def read() -> None:
        try:
            files.read_file({"path": str(fifo)})
            outcome.append("read")
        except confine.Refused as e:
            outcome.append(str(e))

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(60)  # a safety net only: the refusal comes at once
    assert outcome and "not a regular file" in outcome[0]
