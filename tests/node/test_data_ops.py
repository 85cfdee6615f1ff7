"""The node helper's dataset requests (`data_*`), in-process on real files: scan, list, free, read, write,
commit, drop, hash; no link followed on a write; and under --confine, nothing outside ROOT, no write outside
ROOT/data. Copies built on them are tests/executors/test_datacopy.py."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hsched.node import confine, datapaths, dataread, datawrite, libc, main


@pytest.fixture
def base(tmp_path: Path) -> Path:
    # a write refuses any link on its path from /: the real path, wherever pytest's folder is
    return Path(os.path.realpath(tmp_path))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def write(path: Path | str, offset: int, data: bytes) -> dict[str, Any]:
    return datawrite.data_write({"path": str(path), "offset": offset, "data": b64(data)})


def expected_hash(root: Path) -> str:
    """data_hash's definition, computed here: sorted relative paths; each path, NUL, size, NUL, bytes."""
    files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    rels = sorted(("" if p == root else str(p.relative_to(root)), p) for p in files)
    h = hashlib.sha256()
    for rel, p in rels:
        data = p.read_bytes()
        h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()


def make_tree(root: Path) -> None:
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "empty-dir").mkdir()
    (root / "a.bin").write_bytes(os.urandom(5000))
    (root / "sub" / "b.txt").write_text("bee\n")
    (root / "sub" / "deep" / "c").write_bytes(b"")
    os.utime(root / "a.bin", (1_600_000_000.25, 1_600_000_000.25))


def test_scan_and_list_a_tree_without_following_links(base: Path) -> None:
    root = base / "ds"
    make_tree(root)
    outside = base / "big"
    outside.write_bytes(b"x" * 100_000)
    (root / "link-to-big").symlink_to(outside)
    (root / "link-to-dir").symlink_to(base)
    os.mkfifo(root / "pipe")
    s = dataread.data_scan({"path": str(root)})
    assert s == {"exists": True, "bytes": 5004, "files": 3, "is_dir": True,
                 "newest": max(p.stat().st_mtime for p in (root / "sub" / "b.txt", root / "sub" / "deep" / "c"))}
    ls = dataread.data_list({"path": str(root)})
    assert ls["exists"] and ls["is_dir"]
    assert [f["rel"] for f in ls["files"]] == ["a.bin", "sub/b.txt", "sub/deep/c"]
    assert ls["dirs"] == ["empty-dir", "sub", "sub/deep"]
    a = ls["files"][0]
    assert (a["size"], a["mtime"], a["mode"]) == (5000, 1_600_000_000.25, (root / "a.bin").stat().st_mode & 0o7777)
    pages = [dataread.data_list({"path": str(root), "start": i, "limit": 2}) for i in (0, 2, 4)]
    assert [[f["rel"] for f in p["files"]] for p in pages] == [["a.bin", "sub/b.txt"], ["sub/deep/c"], []]
    assert [p["dirs"] for p in pages] == [ls["dirs"], [], []] and {p["total_files"] for p in pages} == {3}
    one = dataread.data_list({"path": str(root / "a.bin")})
    assert one["files"][0]["rel"] == "" and one["dirs"] == [] and not one["is_dir"]
    assert dataread.data_scan({"path": str(root / "a.bin")})["bytes"] == 5000
    nothing = {"exists": False, "bytes": 0, "files": 0, "newest": None, "is_dir": False}
    assert dataread.data_scan({"path": str(base / "absent")}) == nothing
    assert dataread.data_scan({"path": str(root / "a.bin" / "below-a-file")}) == nothing
    empty = base / "empty"
    empty.mkdir()
    assert dataread.data_list({"path": str(empty)}) == {"exists": True, "is_dir": True, "dirs": [], "files": [],
                                                 "total_files": 0}


def test_a_dataset_that_is_a_link_is_followed_at_its_top_only(base: Path) -> None:
    real = base / "disk" / "ds"
    make_tree(real)
    (base / "ds").symlink_to(real)
    assert dataread.data_scan({"path": str(base / "ds")})["files"] == 3
    assert dataread.data_hash({"path": str(base / "ds")})["sha256"] == expected_hash(real)


def test_free_is_the_nearest_existing_folders(base: Path) -> None:
    r = dataread.data_free({"path": str(base / "not" / "yet" / "there")})
    assert r["at"] == str(base)
    st = os.statvfs(base)
    # others write on this disk meanwhile: the same file system's figure, not the same byte
    assert r["free"] > 0 and abs(r["free"] - st.f_bavail * st.f_frsize) < (1 << 30)


def test_read_in_chunks_up_to_4_mib(base: Path) -> None:
    f = base / "f"
    data = os.urandom(5 << 20)
    f.write_bytes(data)
    r = dataread.data_read({"path": str(f), "offset": 10, "max_bytes": 100})
    assert base64.b64decode(r["data"]) == data[10:110] and r["eof"] is False
    big = dataread.data_read({"path": str(f), "offset": 0, "max_bytes": 64 << 20})
    assert len(base64.b64decode(big["data"])) == 4 << 20 and big["eof"] is False
    tail = dataread.data_read({"path": str(f), "offset": 4 << 20, "max_bytes": 4 << 20})
    assert base64.b64decode(tail["data"]) == data[4 << 20:] and tail["eof"] is True
    past = dataread.data_read({"path": str(f), "offset": 6 << 20, "max_bytes": 10})
    assert past == {"data": "", "eof": True}
    with pytest.raises(FileNotFoundError):
        dataread.data_read({"path": str(base / "absent"), "offset": 0, "max_bytes": 10})
    os.mkfifo(base / "pipe")
    with pytest.raises(confine.Refused, match="not a regular file"):  # and no hang on a pipe nobody writes
        dataread.data_read({"path": str(base / "pipe"), "offset": 0, "max_bytes": 10})


def test_write_makes_folders_cuts_at_the_offset_and_refuses_holes(base: Path) -> None:
    target = base / "new" / "deeper" / "f"
    assert write(target, 0, b"hello world") == {"size": 11}
    assert stat.S_IMODE((base / "new").stat().st_mode) == 0o755
    assert stat.S_IMODE((base / "new" / "deeper").stat().st_mode) == 0o755
    assert write(target, 5, b"!") == {"size": 6}  # longer than the offset: cut there first
    assert target.read_bytes() == b"hello!"
    assert write(target, 6, b"") == {"size": 6}
    with pytest.raises(confine.Refused, match="would leave a hole"):
        write(target, 10, b"x")
    with pytest.raises(confine.Refused, match="at most"):
        write(target, 0, b"x" * ((4 << 20) + 1))
    assert write(base / "empty-file", 0, b"") == {"size": 0} and (base / "empty-file").read_bytes() == b""
    with pytest.raises(confine.Refused, match="not an absolute path"):
        datawrite.data_write({"path": "relative/f", "offset": 0, "data": ""})
    with pytest.raises(confine.Refused, match=r"'\.\.'"):
        write(f"{base}/new/../new/f", 0, b"x")


def test_write_refuses_a_link_anywhere_on_its_path(base: Path) -> None:
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / "victim"
    victim.write_bytes(b"keep me")
    (base / "d").mkdir()
    (base / "d" / "hop").symlink_to(elsewhere)
    (base / "d" / "file-link").symlink_to(victim)
    (base / "d" / "dangling").symlink_to(base / "nowhere")
    with pytest.raises(confine.Refused, match="hop is a symbolic link"):
        write(base / "d" / "hop" / "victim", 0, b"overwritten")
    with pytest.raises(confine.Refused, match="hop is a symbolic link"):
        write(base / "d" / "hop" / "new" / "f", 0, b"x")
    with pytest.raises(confine.Refused, match="is a symbolic link"):
        write(base / "d" / "file-link", 0, b"overwritten")
    with pytest.raises(confine.Refused, match="is a symbolic link"):
        write(base / "d" / "dangling", 0, b"made")
    assert victim.read_bytes() == b"keep me" and not (elsewhere / "new").exists()
    assert not (base / "nowhere").exists()


def test_a_claim_fences_off_the_writes_of_earlier_attempts(base: Path) -> None:
    partial = base / "ds.partial"
    first, second = "a" * 32, "b" * 32
    assert datawrite.data_claim({"partial": str(partial), "token": first}) == {"claimed": first}
    req = {"path": str(partial / "data" / "f"), "offset": 0, "data": b64(b"one"),
           "claim": {"partial": str(partial), "token": first}}
    assert datawrite.data_write(req) == {"size": 3}
    datawrite.data_claim({"partial": str(partial), "token": second})
    with pytest.raises(confine.Refused, match="another attempt's copy now"):
        datawrite.data_write({**req, "data": b64(b"late")})  # the first attempt's, arriving after the second claimed
    claim = {"partial": str(partial), "token": second}
    assert datawrite.data_write({**req, "offset": 3, "claim": claim}) == {"size": 6}
    assert (partial / "data" / "f").read_bytes() == b"oneone"
    with pytest.raises(confine.Refused, match="no copy's now"):
        datawrite.data_write({**req, "claim": {"partial": str(base / "other.partial"), "token": first}})
    with pytest.raises(confine.Refused, match="not a copy's claim"):
        datawrite.data_claim({"partial": str(partial), "token": "../x"})


def manifest(kind: str, files: list[dict[str, Any]], dirs: list[str] | None = None) -> bytes:
    return json.dumps({"version": 1, "kind": kind, "files": files, "dirs": dirs or []}).encode()


def test_commit_checks_the_copy_restores_modes_and_mtimes_and_replaces_the_old_tree(base: Path) -> None:
    dest, partial = base / "ds", base / "ds.partial"
    (dest / "old-only").mkdir(parents=True)
    (dest / "old-only" / "stale").write_text("old")
    write(partial / "data" / "x" / "y", 0, b"new bytes")
    write(partial / "data" / "top", 0, b"")
    files = [{"rel": "top", "size": 0, "mtime": 1000.0, "mode": 0o640},
             {"rel": "x/y", "size": 9, "mtime": 1234.5, "mode": 0o4755}]
    write(partial / datapaths.DATA_MANIFEST, 0, manifest("dir", files, ["empty", "x"]))
    r = datawrite.data_commit({"partial": str(partial), "dest": str(dest)})
    assert r == {"dest": str(dest), "files": 2, "bytes": 9}
    assert sorted(p.name for p in base.iterdir()) == ["ds"]  # no partial, no old tree aside
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == ["empty", "top", "x", "x/y"]
    y = (dest / "x" / "y").stat()
    assert stat.S_IMODE(y.st_mode) == 0o755 and y.st_mtime == 1234.5  # the setuid bit is never given
    assert stat.S_IMODE((dest / "top").stat().st_mode) == 0o640 and (dest / "x" / "y").read_bytes() == b"new bytes"
    assert not (dest / datapaths.DATA_MANIFEST).exists()


def test_commit_refuses_an_unfinished_copy_and_leaves_the_old_tree(base: Path) -> None:
    dest, partial = base / "ds", base / "ds.partial"
    dest.mkdir()
    (dest / "f").write_text("old")
    write(partial / "data" / "f", 0, b"half")
    write(partial / datapaths.DATA_MANIFEST, 0, manifest("dir", [{"rel": "f", "size": 8, "mtime": 1.0, "mode": 0o644}]))
    with pytest.raises(confine.Refused, match="has 4 of 8 bytes: the copy is not finished"):
        datawrite.data_commit({"partial": str(partial), "dest": str(dest)})
    write(partial / datapaths.DATA_MANIFEST, 0, manifest("dir", [{"rel": "g", "size": 1, "mtime": 1.0, "mode": 0o644}]))
    with pytest.raises(confine.Refused, match="g is missing"):
        datawrite.data_commit({"partial": str(partial), "dest": str(dest)})
    write(partial / datapaths.DATA_MANIFEST, 0, manifest("dir", [{"rel": "../f", "size": 1, "mtime": 1.0, "mode": 0}]))
    with pytest.raises(confine.Refused, match="not a path inside the copy"):
        datawrite.data_commit({"partial": str(partial), "dest": str(dest)})
    write(partial / datapaths.DATA_MANIFEST, 0, b'{"kind": "dir", "fi')  # cut short by a crash
    with pytest.raises(confine.Refused, match="manifest does not read"):
        datawrite.data_commit({"partial": str(partial), "dest": str(dest)})
    assert (dest / "f").read_text() == "old" and (partial / datapaths.DATA_MANIFEST).exists()
    with pytest.raises(confine.Refused, match="no such copy"):
        datawrite.data_commit({"partial": str(base / "nothing.partial"), "dest": str(dest)})


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "aside"])
def test_commit_a_single_file_and_a_tree_without_manifest(base: Path, monkeypatch: pytest.MonkeyPatch,
                                                          exchange: bool) -> None:
    swapped: list[bool] = []
    real_exchange = libc.exchange

    def spy(*args: Any) -> bool:
        swapped.append(real_exchange(*args) if exchange else False)  # False: as a file system without it
        return swapped[-1]

    monkeypatch.setattr(datawrite, "exchange", spy)
    f, fp = base / "weights.bin", base / "weights.bin.partial"
    f.write_bytes(b"old weights")
    write(fp / "data", 0, b"new weights!")
    write(fp / datapaths.DATA_MANIFEST, 0, manifest("file", [{"rel": "", "size": 12, "mtime": 77.0, "mode": 0o600}]))
    assert datawrite.data_commit({"partial": str(fp), "dest": str(f)})["bytes"] == 12
    assert f.read_bytes() == b"new weights!" and f.stat().st_mtime == 77.0
    # a tree someone wrote without a manifest is committed as it is, over a folder
    d, dp = base / "tree", base / "tree.partial"
    (d / "old").mkdir(parents=True)
    write(dp / "new", 0, b"n")
    assert datawrite.data_commit({"partial": str(dp), "dest": str(d)}) == {"dest": str(d), "files": 0, "bytes": 0}
    assert [p.name for p in d.iterdir()] == ["new"]
    # a folder replaced by a file
    write(dp / "data", 0, b"now a file")
    write(dp / datapaths.DATA_MANIFEST, 0, manifest("file", [{"rel": "", "size": 10, "mtime": 5.0, "mode": 0o644}]))
    datawrite.data_commit({"partial": str(dp), "dest": str(d)})
    assert d.read_bytes() == b"now a file"
    assert sorted(p.name for p in base.iterdir()) == ["tree", "weights.bin"]
    with pytest.raises(confine.Refused, match="one lies in the other"):
        datawrite.data_commit({"partial": str(d), "dest": f"{d}/inside"})
    assert len(swapped) == 3  # every commit had an old one to replace
    if exchange and not all(swapped):
        pytest.skip("this file system cannot swap two names (RENAME_EXCHANGE): the 'aside' case covers it")


def test_drop_removes_trees_files_and_links_never_their_targets(base: Path) -> None:
    make_tree(base / "ds")
    keep = base / "keep"
    keep.mkdir()
    (keep / "k").write_text("k")
    (base / "ds" / "sub" / "to-keep").symlink_to(keep)
    (base / "link").symlink_to(keep)
    assert datawrite.data_drop({"path": str(base / "ds")}) == {"dropped": True}
    assert datawrite.data_drop({"path": str(base / "link")}) == {"dropped": True}
    assert datawrite.data_drop({"path": str(base / "ds")}) == {"dropped": False}
    assert (keep / "k").read_text() == "k" and sorted(p.name for p in base.iterdir()) == ["keep"]
    (base / "f").write_text("f")
    assert datawrite.data_drop({"path": str(base / "f")}) == {"dropped": True}
    with pytest.raises(confine.Refused):
        datawrite.data_drop({"path": "/"})


def test_hash_covers_paths_and_bytes_not_modes_or_mtimes(base: Path) -> None:
    a = base / "a"
    make_tree(a)
    (a / "link").symlink_to(a / "a.bin")  # not followed: not hashed
    h = dataread.data_hash({"path": str(a)})
    assert h == {"sha256": expected_hash(a), "files": 3, "bytes": 5004}
    b = base / "elsewhere" / "b"
    b.parent.mkdir()
    shutil.copytree(a, b, symlinks=True, copy_function=shutil.copy)  # the same bytes, new mtimes
    os.chmod(b / "sub" / "b.txt", 0o600)
    assert dataread.data_hash({"path": str(b)})["sha256"] == h["sha256"]
    (b / "sub" / "b.txt").write_text("bea\n")  # same size, one byte differs
    assert dataread.data_hash({"path": str(b)})["sha256"] != h["sha256"]
    (b / "sub" / "b.txt").write_text("bee\n")
    (b / "sub" / "b.txt").rename(b / "sub" / "B.txt")  # same bytes under another name
    assert dataread.data_hash({"path": str(b)})["sha256"] != h["sha256"]
    one = a / "a.bin"
    assert dataread.data_hash({"path": str(one)})["sha256"] == expected_hash(one)
    with pytest.raises(confine.Refused, match="no such file"):
        dataread.data_hash({"path": str(base / "absent")})


# ------------------------------------------------------------------------------- many small files at once


def read_many(root: Path, *files: tuple[str, int, int]) -> list[tuple[bytes, int]]:
    r = dataread.data_read_many({"root": str(root), "files": [{"rel": rel, "offset": offset, "max_bytes": n}
                                                         for rel, offset, n in files]})
    return [(base64.b64decode(f["data"]), f["size"]) for f in r["files"]]


def test_read_many_answers_several_files_from_their_offsets_with_their_sizes_now(base: Path) -> None:
    root = base / "ds"
    make_tree(root)
    a = (root / "a.bin").read_bytes()
    got = read_many(root, ("a.bin", 0, 5000), ("sub/b.txt", 1, 100), ("sub/deep/c", 0, 0), ("a.bin", 4990, 10))
    assert got == [(a, 5000), (b"ee\n", 4), (b"", 0), (a[4990:], 5000)]
    assert read_many(root / "a.bin", ("", 10, 20)) == [(a[10:30], 5000)]  # a dataset of one file
    assert dataread.data_read_many({"root": str(root), "files": []}) == {"files": []}  # what the controller asks first
    # a link at the root is followed (as data_list takes it), never one below it (data_list leaves those out)
    (base / "to-ds").symlink_to(root)
    assert read_many(base / "to-ds", ("sub/b.txt", 0, 4)) == [(b"bee\n", 4)]
    (root / "hop").symlink_to(base)
    (base / "secret").write_text("not in the dataset")
    with pytest.raises(confine.Refused, match="hop is a symbolic link"):
        read_many(root, ("a.bin", 0, 10), ("hop/secret", 0, 10))
    (root / "sub" / "to-a").symlink_to(root / "a.bin")
    with pytest.raises(confine.Refused, match="is a symbolic link"):
        read_many(root, ("sub/to-a", 0, 10))
    os.mkfifo(root / "pipe")
    with pytest.raises(confine.Refused, match="not a regular file"):  # and no hang on a pipe nobody writes
        read_many(root, ("pipe", 0, 10))
    with pytest.raises(FileNotFoundError):
        read_many(root, ("absent", 0, 10))
    for files, why in [([("../secret", 0, 10)], "not a path inside"),
                       ([("a.bin", 0, 3 << 20), ("sub/b.txt", 0, (1 << 20) + 1)], "at most 4194304 bytes"),
                       ([("sub/deep/c", 0, 0)] * (datapaths.DATA_BATCH_FILES + 1), "at most 4096 files")]:
        with pytest.raises(confine.Refused, match=why):
            read_many(root, *files)
    with pytest.raises(confine.Refused, match="not an absolute path"):
        dataread.data_read_many({"root": "ds", "files": []})


def write_many(partial: Path, token: str, *files: tuple[str, int, bytes]) -> dict[str, Any]:
    return datawrite.data_write_many({"claim": {"partial": str(partial), "token": token},
                               "files": [{"rel": rel, "offset": offset, "data": b64(data)}
                                         for rel, offset, data in files]})


def test_write_many_writes_and_fsyncs_every_file_under_the_claim(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    partial, token = base / "ds.partial", "c" * 32
    datawrite.data_claim({"partial": str(partial), "token": token})
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    tree = partial / "data"
    r = write_many(partial, token, ("a.bin", 0, b"A" * 5000), ("sub/deep/c", 0, b""), ("sub/b.txt", 0, b"bee\n"))
    assert r == {"sizes": [5000, 0, 4]}
    assert sorted(synced) == sorted(str(tree / rel) for rel in ("a.bin", "sub/deep/c", "sub/b.txt"))
    assert (tree / "a.bin").read_bytes() == b"A" * 5000 and (tree / "sub" / "b.txt").read_text() == "bee\n"
    assert stat.S_IMODE((tree / "sub" / "deep").stat().st_mode) == 0o755
    # a resumed file: cut at its offset first, the rest written there (a retried batch lands the same)
    assert write_many(partial, token, ("sub/b.txt", 2, b"ar\n"), ("a.bin", 10, b"z")) == {"sizes": [5, 11]}
    assert write_many(partial, token, ("sub/b.txt", 2, b"ar\n")) == {"sizes": [5]}
    assert (tree / "sub" / "b.txt").read_text() == "bear\n" and (tree / "a.bin").read_bytes() == b"A" * 10 + b"z"
    # a hole is refused: the batch stops at that file, those before it stay written (as a batch cut short would)
    with pytest.raises(confine.Refused, match="would leave a hole"):
        write_many(partial, token, ("new", 0, b"n"), ("sub/b.txt", 9, b"x"))
    assert (tree / "new").read_bytes() == b"n" and (tree / "sub" / "b.txt").read_text() == "bear\n"
    assert datawrite.data_write_many({"claim": {"partial": str(partial), "token": token}, "files": []}) == {"sizes": []}
    # a dataset of one file: rel "" is the partial folder's `data` itself
    one = base / "one.partial"
    datawrite.data_claim({"partial": str(one), "token": token})
    assert write_many(one, token, ("", 0, b"weights")) == {"sizes": [7]}
    assert (one / "data").read_bytes() == b"weights"


def test_write_many_refuses_another_attempts_claim_links_and_oversized_batches(base: Path) -> None:
    partial, first, second = base / "ds.partial", "a" * 32, "b" * 32
    with pytest.raises(confine.Refused, match="no copy's now"):  # never claimed: nothing made
        write_many(partial, first, ("f", 0, b"x"))
    assert not partial.exists()
    datawrite.data_claim({"partial": str(partial), "token": first})
    write_many(partial, first, ("f", 0, b"one"))
    datawrite.data_claim({"partial": str(partial), "token": second})
    with pytest.raises(confine.Refused, match="another attempt's copy now"):  # refused whole: no file of it written
        write_many(partial, first, ("f", 0, b"late"), ("g", 0, b"late"))
    assert (partial / "data" / "f").read_bytes() == b"one" and not (partial / "data" / "g").exists()
    with pytest.raises(confine.Refused, match="needs the copy's claim"):
        datawrite.data_write_many({"files": []})
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "victim").write_bytes(b"keep me")
    (partial / "data" / "hop").symlink_to(elsewhere)
    (partial / "data" / "file-link").symlink_to(elsewhere / "victim")
    for rel in ("hop/victim", "hop/new/f", "file-link"):
        with pytest.raises(confine.Refused, match="is a symbolic link"):
            write_many(partial, second, (rel, 0, b"overwritten"))
    assert (elsewhere / "victim").read_bytes() == b"keep me" and sorted(os.listdir(elsewhere)) == ["victim"]
    for files, why in [([("../escape", 0, b"x")], "not a path inside"),
                       ([("f", -1, b"x")], "negative"),
                       ([("f", 0, b"x" * (3 << 20)), ("g", 0, b"x" * ((1 << 20) + 1))], "at most 4194304 bytes"),
                       ([("f", 0, b"")] * (datapaths.DATA_BATCH_FILES + 1), "at most 4096 files")]:
        with pytest.raises(confine.Refused, match=why):
            write_many(partial, second, *files)
    assert not (base / "escape").exists() and (partial / "data" / "f").read_bytes() == b"one"


def test_every_data_request_is_served(base: Path) -> None:
    assert {"data_scan", "data_list", "data_free", "data_read", "data_write", "data_claim", "data_commit",
            "data_drop", "data_hash", "data_root", "data_read_many", "data_write_many"} <= set(main.COMMANDS)
    assert dataread.data_root({}) == {"root": None}  # unconfined: datasets anywhere


# ------------------------------------------------------------------------------------------ --confine


@pytest.fixture
def root(base: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    r = base / "node"
    r.mkdir(mode=0o711)
    monkeypatch.setattr(confine, "CONFINE", str(r))
    monkeypatch.setattr(confine, "MIN_UID", 1000)
    yield r


def refused(fn: Any, req: dict[str, Any], why: str) -> None:
    with pytest.raises(confine.Refused, match=why):
        fn(req)


def test_confined_data_requests_stay_under_root(root: Path, base: Path) -> None:
    secret = base / "secret"
    secret.write_text("root's")
    (root / "data" / "files").mkdir(parents=True)
    (root / "data" / "files" / "link").symlink_to(base)
    cases: list[tuple[Any, dict[str, Any]]] = [
        (dataread.data_scan, {"path": str(secret)}), (dataread.data_list, {"path": str(base)}),
        (dataread.data_free, {"path": "/"}), (dataread.data_hash, {"path": str(secret)}),
        (dataread.data_read, {"path": str(secret), "offset": 0, "max_bytes": 10}),
        (datawrite.data_write, {"path": str(secret), "offset": 0, "data": ""}),
        (datawrite.data_drop, {"path": str(secret)}),
        (datawrite.data_commit, {"partial": str(root / "data" / "x.partial"), "dest": str(secret)}),
        (dataread.data_read_many, {"root": str(base), "files": [{"rel": "secret", "max_bytes": 10}]}),
        (datawrite.data_write_many, {"claim": {"partial": f"{secret}.partial", "token": "a" * 32}, "files": []})]
    for fn, req in cases:
        refused(fn, req, "outside this helper's folder")
    refused(dataread.data_read, {"path": f"{root}/data/files/link/secret", "offset": 0, "max_bytes": 10},
            "symbolic link")
    refused(dataread.data_scan, {"path": f"{root}/data/files/link"}, "symbolic link")
    refused(dataread.data_read_many, {"root": f"{root}/data/files", "files": [{"rel": "link/secret", "max_bytes": 10}]},
            "symbolic link")
    # under ROOT but outside ROOT/data: the members' checkpoints and runs, never read back as a dataset (issue 27)
    (root / "checkpoints" / "7").mkdir(parents=True)
    (root / "checkpoints" / "7" / "model.pt").write_text("a member's")
    for fn, req in ((dataread.data_read, {"path": f"{root}/checkpoints/7/model.pt", "offset": 0, "max_bytes": 10}),
                    (dataread.data_read, {"root": f"{root}/checkpoints", "rel": "7/model.pt", "offset": 0,
                                          "max_bytes": 10}),
                    (dataread.data_scan, {"path": f"{root}/checkpoints"}),
                    (dataread.data_hash, {"path": f"{root}/checkpoints"}),
                    (dataread.data_list, {"path": f"{root}/checkpoints"}),
                    (dataread.data_read_many, {"root": f"{root}/checkpoints", "files": [{"rel": "7/model.pt",
                                                                                     "max_bytes": 10}]})):
        refused(fn, req, "datasets only under")
    refused(dataread.data_read, {"path": f"{root}/data/../../secret"}, r"'\.\.'")
    assert secret.read_text() == "root's"


def test_confined_writes_only_under_root_data(root: Path) -> None:
    # a run folder is root's own: a handle.json the account could write is one the helper would signal as root
    runs = root / "runs" / "abc" / "1"
    runs.mkdir(parents=True)
    (runs / "handle.json").write_text("{}")
    refused(datawrite.data_write, {"path": str(runs / "handle.json"), "offset": 0, "data": b64(b'{"pid": 1}')},
            "only under")
    refused(datawrite.data_drop, {"path": str(runs)}, "only under")
    refused(datawrite.data_commit, {"partial": str(root / "data" / "p"), "dest": str(runs)}, "only under")
    refused(datawrite.data_write, {"path": str(root / "data"), "offset": 0, "data": ""}, "only under")
    refused(datawrite.data_write_many, {"claim": {"partial": str(runs), "token": "a" * 32},
                                 "files": [{"rel": "handle.json", "data": b64(b"{}")}]}, "only under")
    assert (runs / "handle.json").read_text() == "{}"
    # reads too stay under ROOT/data (a run's log is served by `read` alone)
    refused(dataread.data_scan, {"path": str(runs)}, "datasets only under")
    # a dataset: written, committed with no write bit for others, dropped
    partial, dest = root / "data" / "ds.partial", root / "data" / "ds"
    write(partial / "data" / "f", 0, b"shared")
    write(partial / datapaths.DATA_MANIFEST, 0, manifest("dir", [{"rel": "f", "size": 6, "mtime": 3.0, "mode": 0o666}]))
    datawrite.data_commit({"partial": str(partial), "dest": str(dest)})
    assert stat.S_IMODE((dest / "f").stat().st_mode) == 0o644 and (dest / "f").read_bytes() == b"shared"
    assert stat.S_IMODE((root / "data").stat().st_mode) == 0o755  # the users' jobs reach it
    assert dataread.data_read({"path": str(dest / "f"), "offset": 0, "max_bytes": 10})["data"] == b64(b"shared")
    (root / "data" / "hop").symlink_to(root / "runs")
    refused(datawrite.data_write, {"path": str(root / "data" / "hop" / "x"), "offset": 0, "data": ""}, "symbolic link")
    assert datawrite.data_drop({"path": str(dest)}) == {"dropped": True}
    assert dataread.data_root({}) == {"root": f"{root}/data"}  # what the controller asks, to place its copies
