"""Copying a dataset from node to node through the controller (hsched/controller/datacopy.py), on real files: two fake
nodes run the node helper's own data requests on this machine's disk (in-process), two local nodes the helper
itself (slow). Byte-identical trees, a copy cancelled mid-way that resumes with only the rest, a source that
changed, no room, and the throttle on a fake clock."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hsched.executors.base import Executor
from hsched.executors.fake import FakeExecutor

from hsched.controller import datacopy
from hsched.controller.datacopy import CopyResult, NoSpace, TreeInfo, copy_tree, free_bytes, remove, scan, tree_hash
from hsched.errors import HelperError, NodeUnreachable, TransferError
from hsched.node import confine, datapaths, datawrite

MiB = 1 << 20


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return Path(os.path.realpath(tmp_path))  # a write refuses a link on its path: pytest's folder, as it really is


def expected_hash(root: Path) -> str:
    """The tree's hash computed here, as hsched.node.dataread.data_hash defines it."""
    files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    h = hashlib.sha256()
    for rel, p in sorted(("" if p == root else str(p.relative_to(root)), p) for p in files):
        data = p.read_bytes()
        h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()


def make_dataset(root: Path) -> int:
    """Several files (some MiB), an empty one, nested and empty folders; its bytes."""
    (root / "train" / "shard-0").mkdir(parents=True)
    (root / "val").mkdir()
    (root / "empty-folder" / "inside").mkdir(parents=True)
    (root / "a-big.bin").write_bytes(os.urandom(3 * MiB + 17))
    (root / "train" / "shard-0" / "part.bin").write_bytes(os.urandom(2 * MiB))
    (root / "train" / "labels.txt").write_text("cat\ndog\n" * 1000)
    (root / "val" / "empty").write_bytes(b"")
    (root / "zz-last.bin").write_bytes(os.urandom(MiB // 2))
    os.chmod(root / "train" / "labels.txt", 0o640)
    os.utime(root / "a-big.bin", (1_700_000_000.5, 1_700_000_000.5))
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def nodes() -> tuple[FakeExecutor, FakeExecutor]:
    return FakeExecutor(name="node-a"), FakeExecutor(name="node-b")


def partial_lengths(partial: Path) -> dict[str, int]:
    data = partial / datapaths.DATA_TREE
    return {str(p.relative_to(data)): p.stat().st_size for p in data.rglob("*") if p.is_file()}


async def cancel_past(share: float, src: Executor, src_path: Path, dst: Executor, dst_path: Path,
                      chunk: int = 256 << 10) -> int:
    """Start a copy and cancel it once its progress passed `share` of the total (the callback sets an event
    and then holds the copy where it is), and settle its partial folder: a claim of another attempt waits for
    the writes still under way on the node and fences off any later one (as the next attempt's does). The bytes
    it reported done."""
    passed = asyncio.Event()
    seen: list[int] = []

    async def progress(done: int, total: int) -> None:
        seen.append(done)
        if done > share * total:
            passed.set()
            await asyncio.get_running_loop().create_future()  # held here until cancelled

    task = asyncio.create_task(copy_tree(src, str(src_path), dst, str(dst_path), progress=progress, chunk=chunk))
    waiter = asyncio.create_task(passed.wait())
    done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    assert waiter in done, "the copy ended before it passed the mark"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await dst.data("claim", {"partial": f"{dst_path}.partial", "token": "0" * 32})
    return seen[-1]


async def test_a_tree_arrives_byte_identical_with_its_modes_and_mtimes(base: Path) -> None:
    src_root, dst_root = base / "a" / "imagenet", base / "b" / "datasets" / "imagenet"
    total = make_dataset(src_root)
    dst_root.mkdir(parents=True)
    (dst_root / "stale-from-an-old-version").write_text("old")  # replaced as a whole
    a, b = nodes()
    reports: list[tuple[int, int]] = []

    async def progress(done: int, total: int) -> None:
        reports.append((done, total))

    r = await copy_tree(a, str(src_root), b, str(dst_root), progress=progress, chunk=MiB)
    assert r == CopyResult(bytes_total=total, bytes_copied=total, resumed_bytes=0, seconds=r.seconds, files=5)
    assert await tree_hash(b, str(dst_root)) == await tree_hash(a, str(src_root)) == expected_hash(src_root)
    assert expected_hash(dst_root) == expected_hash(src_root)
    assert (dst_root / "empty-folder" / "inside").is_dir() and not (dst_root / "stale-from-an-old-version").exists()
    assert stat.S_IMODE((dst_root / "train" / "labels.txt").stat().st_mode) == 0o640
    assert (dst_root / "a-big.bin").stat().st_mtime == 1_700_000_000.5
    assert sorted(p.name for p in dst_root.parent.iterdir()) == ["imagenet"]  # no partial, no old tree left
    dones = [d for d, _ in reports]
    assert dones == sorted(dones) and reports[-1] == (total, total) and {t for _, t in reports} == {total}
    info = await scan(b, str(dst_root))
    assert info == TreeInfo(exists=True, bytes=total, files=5, newest=info.newest)
    assert info.newest == max(p.stat().st_mtime for p in dst_root.rglob("*") if p.is_file())


async def test_a_single_file_and_a_copy_on_the_same_node(base: Path) -> None:
    weights = base / "a" / "weights.safetensors"
    weights.parent.mkdir()
    weights.write_bytes(os.urandom(MiB + 3))
    a, _ = nodes()
    r = await copy_tree(a, str(weights), a, str(base / "a" / "cache" / "weights.safetensors"), chunk=300_000)
    assert (r.bytes_total, r.bytes_copied, r.files) == (MiB + 3, MiB + 3, 1)
    assert (base / "a" / "cache" / "weights.safetensors").read_bytes() == weights.read_bytes()
    with pytest.raises(TransferError, match="one lies in the other"):
        await copy_tree(a, str(base / "a"), a, str(base / "a" / "cache" / "again"))
    with pytest.raises(TransferError, match="no such file or folder"):
        await copy_tree(a, str(base / "absent"), a, str(base / "x"))
    assert not (base / "x").exists() and not (base / "x.partial").exists()


async def test_a_cancelled_copy_resumes_with_only_the_rest(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datacopy, "LIST_PAGE", 2)  # every listing (source, partial tree) in pages
    src_root, dst_root = base / "a" / "ds", base / "b" / "ds"
    total = make_dataset(src_root)
    dst_root.parent.mkdir()
    a, b = nodes()
    done = await cancel_past(0.3, a, src_root, b, dst_root)
    assert 0.3 * total < done < total
    assert not dst_root.exists()  # never a half tree at the destination
    partial = base / "b" / "ds.partial"
    kept = sum(partial_lengths(partial).values())
    assert kept >= done  # every chunk reported was written (more may be: written before the cancel came)
    r = await copy_tree(a, str(src_root), b, str(dst_root))
    assert r.resumed_bytes == kept > 0 and r.bytes_copied == total - kept < total and r.bytes_total == total
    assert expected_hash(dst_root) == expected_hash(src_root) and not partial.exists()


async def test_a_file_changed_between_attempts_starts_over_and_the_rest_resumes(
        base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datacopy, "FILES_AT_ONCE", 1)  # one file after another: where the cut lands is known
    src_root, dst_root = base / "a" / "ds", base / "b" / "ds"
    total = make_dataset(src_root)
    dst_root.parent.mkdir()
    a, b = nodes()
    big = 3 * MiB + 17  # a-big.bin, copied first (sorted by path)
    await cancel_past((big + MiB) / total, a, src_root, b, dst_root)  # past a-big.bin, inside the shard
    before = partial_lengths(base / "b" / "ds.partial")
    assert before["a-big.bin"] == big and before["train/labels.txt"] == 8000
    assert 0 < before["train/shard-0/part.bin"] < 2 * MiB
    # a new version of the finished file, same size: only its mtime tells
    (src_root / "a-big.bin").write_bytes(os.urandom(big))
    os.utime(src_root / "a-big.bin", (1_800_000_000.0, 1_800_000_000.0))
    # and a file the source no longer has, left in the partial tree by some earlier attempt
    (base / "b" / "ds.partial" / "data" / "gone.bin").write_bytes(b"old")
    r = await copy_tree(a, str(src_root), b, str(dst_root))
    assert r.resumed_bytes == before["train/labels.txt"] + before["train/shard-0/part.bin"]  # not a-big.bin's
    assert r.bytes_copied == total - r.resumed_bytes
    assert expected_hash(dst_root) == expected_hash(src_root) and not (dst_root / "gone.bin").exists()


async def test_a_source_that_changes_during_the_copy_is_not_committed(base: Path) -> None:
    src_root, dst_root = base / "a" / "ds", base / "b" / "ds"
    make_dataset(src_root)
    (dst_root / "old").mkdir(parents=True)
    a, b = nodes()
    changed = False

    async def progress(done: int, total: int) -> None:
        nonlocal changed
        if not changed:  # a file of the source rewritten while the copy runs
            (src_root / "zz-last.bin").write_bytes(os.urandom(MiB))
            changed = True

    with pytest.raises(TransferError, match=r"(ended at|changed while it was copied)"):
        await copy_tree(a, str(src_root), b, str(dst_root), progress=progress)
    assert [p.name for p in dst_root.iterdir()] == ["old"]  # the old tree, untouched
    r = await copy_tree(a, str(src_root), b, str(dst_root))
    assert expected_hash(dst_root) == expected_hash(src_root) and r.resumed_bytes > 0


async def test_no_room_is_refused_before_any_byte_is_written(base: Path) -> None:
    # FakeExecutor.free_bytes plays the destination's disk (this machine's real one has room to spare)
    src_root, dst_root = base / "a" / "ds", base / "b" / "ds"
    total = make_dataset(src_root)
    a, b = nodes()
    b.free_bytes = total - 1
    with pytest.raises(NoSpace) as err:
        await copy_tree(a, str(src_root), b, str(dst_root))
    e = err.value
    assert (e.node, e.path, e.needed, e.free) == ("node-b", str(dst_root), total, total - 1)
    assert str(e).startswith(f"node-b: no room for {dst_root}: it needs {total} bytes")
    assert f"{total - 1} bytes" in str(e)
    assert not e.retryable and isinstance(e, TransferError)
    assert not (base / "b").exists()  # nothing written: not even the partial folder
    b.free_bytes = total + 100
    with pytest.raises(NoSpace, match=f"needs {total + 101} bytes"):
        await copy_tree(a, str(src_root), b, str(dst_root), headroom_bytes=101)
    # a resumed copy needs room for what is left only
    b.free_bytes = None
    await cancel_past(0.5, a, src_root, b, dst_root)
    kept = sum(partial_lengths(base / "b" / "ds.partial").values())
    b.free_bytes = total - kept
    r = await copy_tree(a, str(src_root), b, str(dst_root))
    assert r.resumed_bytes == kept and expected_hash(dst_root) == expected_hash(src_root)
    assert await free_bytes(b, str(dst_root)) == total - kept


async def test_the_throttle_sleeps_bytes_over_the_limit_on_a_fake_clock(base: Path) -> None:
    src_root = base / "a" / "ds"
    total = make_dataset(src_root)
    a, b = nodes()
    now = 100.0
    sleeps: list[float] = []

    async def fake_sleep(s: float) -> None:
        nonlocal now
        sleeps.append(s)
        now += s

    limit = 2 * MiB
    r = await copy_tree(a, str(src_root), b, str(base / "b" / "ds"), limit_bps=limit, chunk=256 << 10,
                        sleep=fake_sleep, monotonic=lambda: now)
    # the clock moves only when the copy sleeps: it sleeps exactly what the bytes take at the limit
    assert sum(sleeps) == pytest.approx(total / limit) and r.seconds == pytest.approx(total / limit)
    # paced along the way, never a burst of more than one chunk per file under way
    assert len(sleeps) > 1 and max(sleeps) <= datacopy.FILES_AT_ONCE * (256 << 10) / limit
    sleeps.clear()
    await copy_tree(a, str(src_root), b, str(base / "b" / "ds2"), sleep=fake_sleep, monotonic=lambda: now)
    assert sleeps == []  # no limit, no sleep


async def test_a_node_lost_mid_copy_fails_it_and_remove_drops_a_copy_and_its_partial(
        base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datacopy, "FILES_AT_ONCE", 1)  # no other write under way when the node goes
    src_root, dst_root = base / "a" / "ds", base / "b" / "ds"
    total = make_dataset(src_root)
    a, b = nodes()
    writes = 0

    async def lost_after_five_writes(op: str, req: Mapping[str, Any]) -> None:
        nonlocal writes
        writes += op == "write"
        if writes > 5:
            raise NodeUnreachable("node-b: connection lost")

    b.data_hook = lost_after_five_writes
    with pytest.raises(NodeUnreachable, match="connection lost"):
        await copy_tree(a, str(src_root), b, str(dst_root), chunk=256 << 10)
    assert isinstance(b.last_error, NodeUnreachable) and not dst_root.exists()
    kept = sum(partial_lengths(base / "b" / "ds.partial").values())
    assert kept == 4 * (256 << 10)  # the manifest and four chunks made it
    b.data_hook = None
    r = await copy_tree(a, str(src_root), b, str(dst_root))
    assert (r.resumed_bytes, r.bytes_copied) == (kept, total - kept)
    assert expected_hash(dst_root) == expected_hash(src_root)
    # eviction: the dataset and an unfinished copy of a new version of it, both gone
    await cancel_past(0.3, a, src_root, b, dst_root)
    assert dst_root.is_dir() and (base / "b" / "ds.partial").is_dir()
    await remove(b, str(dst_root))
    assert list((base / "b").iterdir()) == []
    assert not (await scan(b, str(dst_root))).exists


async def test_a_late_write_of_an_earlier_attempt_is_refused_once_a_new_one_claimed_the_copy(base: Path) -> None:
    src_root, dst_root = base / "a" / "ds", base / "b" / "ds"
    make_dataset(src_root)
    a, b = nodes()
    writes: list[dict[str, Any]] = []
    refusals: list[str] = []

    async def record(op: str, req: Mapping[str, Any]) -> None:
        if op != "write":
            return
        if writes and req["claim"] != writes[0]["claim"] and not refusals:
            # the new attempt's first write: the earlier attempt's last one reaches the node only now
            late = dict(writes[-1])
            with pytest.raises(confine.Refused, match="another attempt's copy now") as err:
                await asyncio.to_thread(datawrite.data_write, late)
            refusals.append(str(err.value))
        writes.append(dict(req))

    b.data_hook = record
    await cancel_past(0.3, a, src_root, b, dst_root)
    first = writes[0]["claim"]
    assert all(w["claim"] == first for w in writes) and len(first["token"]) == 32
    r = await copy_tree(a, str(src_root), b, str(dst_root))
    assert len(refusals) == 1 and writes[-1]["claim"] != first and r.resumed_bytes > 0
    assert expected_hash(dst_root) == expected_hash(src_root)


async def test_a_node_that_lists_a_path_outside_the_tree_is_not_followed(base: Path) -> None:
    src_root, dst_root = base / "a" / "ds", base / "b" / "ds"
    make_dataset(src_root)

    class Lying(FakeExecutor):
        async def data(self, op: str, req: Mapping[str, Any], *, timeout_s: float = 120.0) -> dict[str, Any]:
            reply = await super().data(op, req, timeout_s=timeout_s)
            if op == "list":
                reply["files"].append({"rel": "../../escape", "size": 1, "mtime": 1.0, "mode": 0o644})
            return reply

    with pytest.raises(TransferError, match="not a path inside it"):
        await copy_tree(Lying(name="liar"), str(src_root), FakeExecutor(name="b"), str(dst_root))
    assert not (base / "escape").exists() and not (base / "b").exists()


# ------------------------------------------------------------------------------- many small files at once


def make_small_files(root: Path, n: int = 300) -> int:
    """n small files (some empty) in folders of 100, and one big file; their bytes."""
    for i in range(n):
        folder = root / f"class-{i // 100}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"img-{i:04d}.jpg").write_bytes(os.urandom(i * 37 % 5000))
    (root / "big.bin").write_bytes(os.urandom(300_000))
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def recorder(log: list[tuple[str, dict[str, Any]]]) -> Any:
    async def hook(op: str, req: Mapping[str, Any]) -> None:
        log.append((op, dict(req)))
    return hook


async def test_small_files_go_many_a_request_and_big_ones_chunk_by_chunk(
        base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datacopy, "BATCH_FILES", 50)
    src_root, dst_root = base / "a" / "ds", base / "b" / "ds"
    total = make_small_files(src_root)
    a, b = nodes()
    reads: list[tuple[str, dict[str, Any]]] = []
    writes: list[tuple[str, dict[str, Any]]] = []
    a.data_hook, b.data_hook = recorder(reads), recorder(writes)
    reports: list[int] = []

    async def progress(done: int, total: int) -> None:
        reports.append(done)

    chunk = 64 << 10
    r = await copy_tree(a, str(src_root), b, str(dst_root), chunk=chunk, progress=progress)
    assert (r.bytes_total, r.bytes_copied, r.files) == (total, total, 301)
    assert expected_hash(dst_root) == expected_hash(src_root)
    # big.bin alone goes chunk by chunk (300,000 bytes: 5 chunks); the 300 small files in batches
    assert [req["path"] for op, req in reads if op == "read"] == [str(src_root / "big.bin")] * 5
    batches = [req["files"] for op, req in writes if op == "write_many" and req["files"]]
    assert sorted(f["rel"] for batch in batches for f in batch) == sorted(
        str(p.relative_to(src_root)) for p in src_root.rglob("*.jpg"))
    assert all(len(batch) <= 50 and sum(len(base64.b64decode(f["data"])) for f in batch) <= chunk
               for batch in batches)
    assert len(batches) <= (total - 300_000) // chunk + 300 // 50 + 1  # full batches, none of one file by mistake
    assert [op for op, _ in writes].count("write") == 6  # the manifest and big.bin's 5 chunks
    assert reports == sorted(reports) and reports[-1] == total


async def test_a_batch_cut_short_resumes_each_file_from_its_own_length(
        base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datacopy, "FILES_AT_ONCE", 1)  # one batch after another: where the cut lands is known
    src_root, dst_root = base / "a" / "ds", base / "b" / "ds"
    total = make_small_files(src_root)
    a, b = nodes()
    batches = 0
    cut: dict[str, Any] = {}

    async def lost_in_the_third_batch(op: str, req: Mapping[str, Any]) -> None:
        nonlocal batches
        if op != "write_many" or not req["files"]:
            return
        batches += 1
        if batches == 3:  # the node wrote 5 files of it whole and half of the 6th, then the connection went
            files = [f for f in req["files"] if f["data"]]
            await asyncio.to_thread(datawrite.data_write_many, {**req, "files": files[:5]})
            sixth = files[5]
            half = base64.b64decode(sixth["data"])[:len(base64.b64decode(sixth["data"])) // 2]
            await asyncio.to_thread(datawrite.data_write_many, {**req, "files": [
                {"rel": sixth["rel"], "offset": 0, "data": base64.b64encode(half).decode()}]})
            cut.update(rel=sixth["rel"], half=len(half), rest=[f["rel"] for f in files[6:]])
            raise NodeUnreachable("node-b: connection lost")

    b.data_hook = lost_in_the_third_batch
    with pytest.raises(NodeUnreachable, match="connection lost"):
        await copy_tree(a, str(src_root), b, str(dst_root), chunk=64 << 10)
    lengths = partial_lengths(base / "b" / "ds.partial")
    assert lengths[cut["rel"]] == cut["half"] > 0 and not any(rel in lengths for rel in cut["rest"])
    kept = sum(lengths.values())
    reads: list[tuple[str, dict[str, Any]]] = []
    a.data_hook, b.data_hook = recorder(reads), None
    r = await copy_tree(a, str(src_root), b, str(dst_root), chunk=64 << 10)
    assert (r.resumed_bytes, r.bytes_copied) == (kept, total - kept)
    asked = {f["rel"]: f for op, req in reads if op == "read_many" for f in req["files"]}
    assert asked[cut["rel"]]["offset"] == cut["half"]  # the half-written file goes on from its length
    assert not any(rel in asked for rel, n in lengths.items() if n == (src_root / rel).stat().st_size)
    assert expected_hash(dst_root) == expected_hash(src_root)


async def test_a_small_file_that_changes_during_the_copy_fails_it_and_starts_over(base: Path) -> None:
    src_root, dst_root = base / "a" / "ds", base / "b" / "ds"
    make_small_files(src_root, n=20)
    a, b = nodes()
    changed: list[str] = []

    async def rewrite_one(op: str, req: Mapping[str, Any]) -> None:
        if op == "read_many" and req["files"] and not changed:
            rel = req["files"][-1]["rel"]
            (src_root / rel).write_bytes(os.urandom(7777))  # between the listing and the read
            changed.append(rel)

    a.data_hook = rewrite_one
    with pytest.raises(TransferError, match=r"has 7777 bytes, not .*changed while it was copied"):
        await copy_tree(a, str(src_root), b, str(dst_root))
    assert not dst_root.exists()
    a.data_hook = None
    await copy_tree(a, str(src_root), b, str(dst_root))
    assert expected_hash(dst_root) == expected_hash(src_root) and (dst_root / changed[0]).stat().st_size == 7777



@pytest.mark.parametrize("lie", ["short read", "long read", "write size"])
async def test_batch_answers_that_do_not_add_up_fail_the_copy(base: Path, lie: str) -> None:
    src_root, dst_root = base / "a" / "ds", base / "b" / "ds"
    make_small_files(src_root, n=20)

    class Lying(FakeExecutor):
        async def data(self, op: str, req: Mapping[str, Any], *, timeout_s: float = 120.0) -> dict[str, Any]:
            reply = await super().data(op, req, timeout_s=timeout_s)
            if op == "read_many" and reply["files"] and lie == "short read":
                reply["files"][-1]["data"] = reply["files"][-1]["data"][:-4]  # 3 bytes short, the size as listed
            elif op == "read_many" and reply["files"] and lie == "long read":
                reply["files"][-1]["data"] += "AAAA"
            elif op == "write_many" and reply["sizes"]:
                reply["sizes"][-1] -= 1
            return reply

    liar, honest = Lying(name="liar"), FakeExecutor(name="honest")
    a, b = (liar, honest) if "read" in lie else (honest, liar)
    why = {"short read": "ended at .* it changed while it was copied", "long read": "answer at 0 does not read",
           "write size": "bytes after a write, not"}[lie]
    with pytest.raises(TransferError, match=why):
        await copy_tree(a, str(src_root), b, str(dst_root))
    assert not dst_root.exists()

class OlderHelper(FakeExecutor):
    """A node whose helper predates data_read_many and data_write_many (a lab's installed one), answering as it
    would: its server's "unknown request", or its one-shot usage line."""

    def __init__(self, name: str, answer: str) -> None:
        super().__init__(name=name)
        self.answer = answer

    async def data(self, op: str, req: Mapping[str, Any], *, timeout_s: float = 120.0) -> dict[str, Any]:
        if op in ("read_many", "write_many"):
            self.calls.append(f"data_{op}")
            raise HelperError(f"{self.name}: node helper 'data_{op}': {self.answer}", f"data_{op}")
        return await super().data(op, req, timeout_s=timeout_s)


@pytest.mark.parametrize("old", ["source", "destination"])
async def test_an_older_helper_gets_every_file_chunk_by_chunk(base: Path, old: str) -> None:
    src_root, dst_root = base / "a" / "ds", base / "b" / "ds"
    total = make_small_files(src_root, n=40)
    a: FakeExecutor = FakeExecutor(name="node-a")
    b: FakeExecutor = FakeExecutor(name="node-b")
    if old == "source":
        a = OlderHelper("node-a", "unknown request 'data_read_many'")
    else:
        b = OlderHelper("node-b", "usage: nodehelper.py probe|launch|status|signal|users|read")
    r = await copy_tree(a, str(src_root), b, str(dst_root), chunk=64 << 10)
    assert r.bytes_copied == total and expected_hash(dst_root) == expected_hash(src_root)
    # asked once (the newer side answered its empty one, or was not asked), then every file on its own
    assert a.calls.count("data_read_many") == 1 and b.calls.count("data_write_many") == (old == "destination")
    assert a.calls.count("data_read") == 39 + 5  # every non-empty small file, and big.bin's 5 chunks
    # an error of another kind is no older helper's: the copy fails with it
    a = OlderHelper("node-a", "outside this helper's folder")
    with pytest.raises(HelperError, match="outside this helper's folder"):
        await copy_tree(a, str(src_root), FakeExecutor(name="node-b"), str(base / "b" / "again"))


@pytest.mark.slow
async def test_two_local_nodes_copy_resume_and_hash_through_the_helper(base: Path) -> None:
    from hsched.executors.local import LocalExecutor

    src_root, dst_root = base / "a" / "ds", base / "b" / "ds"
    total = make_dataset(src_root)
    dst_root.parent.mkdir()
    a, b = LocalExecutor(node="a"), LocalExecutor(node="b")
    try:
        await cancel_past(0.3, a, src_root, b, dst_root)
        r = await copy_tree(a, str(src_root), b, str(dst_root), chunk=4 * MiB)
        assert 0 < r.resumed_bytes and r.resumed_bytes + r.bytes_copied == total
        assert await tree_hash(b, str(dst_root)) == expected_hash(src_root)
        assert (await scan(b, str(dst_root))).bytes == total
    finally:
        await a.close()
        await b.close()


@pytest.mark.slow
async def test_a_copy_into_a_confined_helpers_data_folder(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lab's service account reaches a node through the installed helper confined to ROOT (`sudo -n LAUNCHER`;
    a stand-in sudo here runs the launcher as this user): datasets go under ROOT/data, nowhere else."""
    from hsched.executors.local import HELPER_PATH, LocalExecutor

    from hsched.errors import HelperError

    root = base / "node-root"
    root.mkdir(mode=0o711)
    launcher = base / "hsched-node-helper"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{HELPER_PATH}" --confine "{root}" "$@"\n')
    launcher.chmod(0o755)
    bin_dir = base / "bin"
    bin_dir.mkdir()
    (bin_dir / "sudo").write_text('#!/bin/sh\n[ "$1" = "-n" ] && shift\nexec "$@"\n')
    (bin_dir / "sudo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    src_root = base / "a" / "ds"
    total = make_dataset(src_root)
    os.chmod(src_root / "zz-last.bin", 0o666)
    here, lab = LocalExecutor(node="here"), LocalExecutor(node="lab", helper=str(launcher))
    try:
        assert await lab.data("root", {}) == {"root": f"{root}/data"}
        dest = f"{root}/data/here/ds"
        r = await copy_tree(here, str(src_root), lab, dest)
        assert r.bytes_copied == total and await tree_hash(lab, dest) == expected_hash(src_root)
        assert stat.S_IMODE(os.stat(f"{dest}/zz-last.bin").st_mode) == 0o644  # no write for the lab's users
        with pytest.raises(HelperError, match="writes datasets only under"):
            await copy_tree(here, str(src_root), lab, f"{root}/runs/x")
        with pytest.raises(HelperError, match="outside this helper's folder"):
            await copy_tree(here, str(src_root), lab, str(base / "elsewhere"))
        with pytest.raises(HelperError, match="outside this helper's folder"):
            await copy_tree(lab, str(src_root), here, str(base / "stolen"))
        r = await copy_tree(lab, dest, here, str(base / "back"))
        assert expected_hash(base / "back") == expected_hash(src_root)
    finally:
        await here.close()
        await lab.close()
    assert not (base / "elsewhere").exists() and not (base / "stolen").exists() and not (root / "runs").exists()


@pytest.mark.slow
async def test_a_node_running_an_older_helper_process_gets_its_files_chunk_by_chunk(base: Path) -> None:
    """A real helper process without the batch requests (this helper, those two taken out of its COMMANDS), as
    a lab's installed helper is until it is updated: copies to it and from it go file by file."""
    from hsched.executors.local import LocalExecutor

    old = base / "old_helper.py"
    old.write_text("import sys\n"
                   "from hsched.node import main as nh\n"
                   "del nh.COMMANDS['data_read_many'], nh.COMMANDS['data_write_many']\n"
                   "sys.exit(nh.main(sys.argv))\n")
    python = base / "old-python"  # LocalExecutor runs PYTHON HELPER_PATH ...: this one runs the old helper
    python.write_text(f'#!/bin/sh\nshift\nexec "{sys.executable}" "{old}" "$@"\n')
    python.chmod(0o755)
    src_root = base / "a" / "ds"
    total = make_small_files(src_root, n=120)
    new, older = LocalExecutor(node="new"), LocalExecutor(node="old", python=str(python))
    try:
        with pytest.raises(HelperError, match="unknown request 'data_read_many'"):
            await older.data("read_many", {"root": str(src_root), "files": []})
        r = await copy_tree(new, str(src_root), older, str(base / "b" / "ds"), chunk=64 << 10)
        assert r.bytes_copied == total and expected_hash(base / "b" / "ds") == expected_hash(src_root)
        r = await copy_tree(older, str(base / "b" / "ds"), new, str(base / "c" / "ds"), chunk=64 << 10)
        assert r.bytes_copied == total and expected_hash(base / "c" / "ds") == expected_hash(src_root)
    finally:
        await new.close()
        await older.close()
