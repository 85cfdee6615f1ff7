"""Datasets on the nodes (issue #15): their size, the free space for them, their hash, their removal, and a copy
from one node to another that resumes where it stopped.

Everything passes through the controller. `copy_tree` reads chunks from the source node's helper and writes them
through the destination node's helper (the executors' `data`, nodehelper's `data_*` requests), each over the
channel the controller already holds to that node (the local helper's pipes, one SSH connection per node). The
issue suggests rsync where both ends have it, but nodes hold no SSH keys for one another (only the controller
reaches them), and a lab's confined helper lets its service account run nothing but itself, so there is no
node-to-node path for rsync to use. One way for every pair of executors (local, ssh, fake, a confined helper,
the same node twice), at the price of each byte crossing the controller (base64 on the JSON channels: 4/3 of it
on each side); a file's next chunk is read while the one before is written, and FILES_AT_ONCE files go at once.
Small files go many at a time (`data_read_many`, `data_write_many`: up to a chunk's bytes, BATCH_FILES files), so
that a tree of a million of them costs a few thousand round trips, not two million; a node whose helper predates
those requests gets every file chunk by chunk as before.

A copy lands in `DEST.partial`, beside its destination: `.hsched-copy.json`, the manifest (every source file's
relative path, size, mtime and mode, and the folders), written before any byte of data, and `data`, the tree (or
the file) so far. A copy stopped anywhere (cancelled, a node lost, the controller killed) resumes from there: a
file whose manifest entry still matches the source (same size and mtime) and whose partial length is not longer
continues at that length; any other file starts again, and what the source no longer has is removed. Those are
removed *before* the new manifest is written, so a manifest never vouches for bytes of another version. And
before it looks at what is there, an attempt claims the partial folder (`data_claim`): every write carries its
claim, and the node refuses one of an earlier attempt that arrives late (a helper still working through what a
lost connection had sent it), which could otherwise land in a file this attempt resumes. Before
any byte: room for what is left plus `headroom_bytes` (NoSpace). After the last: the source listed again (a file
changed meanwhile: TransferError, and the next attempt restarts that file) and the partial tree's sizes checked;
then the destination's helper commits it (`data_commit`: checked against the manifest, modes and mtimes restored,
swapped into place at once). At every moment DEST holds the old tree or the new one, never part of one.

One copy per destination at a time: two would share a partial folder (the caller, the controller's prefetch,
sees to it).
"""

from __future__ import annotations

import asyncio
import base64
import json
import posixpath
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hsched.errors import HelperError, TransferError
from hsched.executors.base import Executor
from hsched.node.datapaths import DATA_CHUNK_MAX, DATA_MANIFEST, DATA_TREE

PARTIAL_SUFFIX = ".partial"
"""A copy to DEST is made in DEST + this (a sibling: same file system, so its commit is a rename)."""
MANIFEST_VERSION = 1
FILES_AT_ONCE = 8
"""Files copied at the same time: a tree of many small files costs round trips, not bytes (each file at least a
read and a write), and these overlap."""
HASH_TIMEOUT_S = 3600.0
"""A hash reads every byte of the tree on the node."""
COMMIT_TIMEOUT_S = 600.0
"""A commit sets every file's mode and mtime, and removes the old tree (many files: long)."""
LIST_PAGE = 100_000
"""Files per listing request (about 10 MB of JSON: well under the local helper pipe's 64 MiB line limit)."""
LIST_TIMEOUT_S = 600.0
"""A listing walks the whole tree on the node (a page of it too)."""
BATCH_FILE_MAX = 256 << 10
"""A file with at most this many bytes left to copy (and at most a chunk) goes in a batch with others: one
data_read_many and one data_write_many for all of them, where chunk by chunk each file costs a round trip to
each node (issue #15: 10,000 files of 4 KiB went at ~600 files/s). Bigger files go chunk by chunk."""
BATCH_FILES = 1024
"""Files in one batch at most (its bytes: at most a chunk)."""


@dataclass(frozen=True, slots=True)
class TreeInfo:
    """A file or folder on a node: its regular files (links are not followed), their bytes and newest mtime."""

    exists: bool
    bytes: int
    files: int
    newest: float | None


@dataclass(frozen=True, slots=True)
class CopyResult:
    bytes_total: int
    """The source's bytes."""
    bytes_copied: int
    """Bytes this attempt moved."""
    resumed_bytes: int
    """Bytes an earlier attempt had already moved, kept."""
    seconds: float
    files: int


class NoSpace(TransferError):
    """The destination has not the room for a copy (nothing was written)."""

    retryable = False  # not by itself: room must be made first (an eviction)

    def __init__(self, node: str, path: str, needed: int, free: int) -> None:
        super().__init__(f"{node}: no room for {path}: it needs {needed} bytes ({_mib(needed)}), "
                         f"{free} bytes ({_mib(free)}) are free")
        self.node = node
        self.path = path
        self.needed = needed
        self.free = free


@dataclass(frozen=True, slots=True)
class _File:
    rel: str
    size: int
    mtime: float
    mode: int


@dataclass(frozen=True, slots=True)
class _Listing:
    is_dir: bool
    files: tuple[_File, ...]
    dirs: tuple[str, ...]

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files)

    def wire(self) -> list[dict[str, Any]]:
        return [{"rel": f.rel, "size": f.size, "mtime": f.mtime, "mode": f.mode} for f in self.files]


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _clean(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"{path!r}: a node path must be absolute")
    return posixpath.normpath(path)


def _safe_rel(rel: str, node: str, where: str) -> str:
    """A relative path a node listed, checked: it names the path we write on another node."""
    parts = rel.split("/") if rel else []
    if any(p in ("", ".", "..") for p in parts) or "\0" in rel:
        raise TransferError(f"{node}: {where} lists {rel!r}, not a path inside it")
    return rel


async def _list(ex: Executor, path: str) -> _Listing | None:
    """The file or tree `path` on the node, listed a page at a time, checked (it comes from a node); None when
    nothing is there."""
    files: list[_File] = []
    dirs: tuple[str, ...] = ()
    is_dir = False
    while True:
        reply = await ex.data("list", {"path": path, "start": len(files), "limit": LIST_PAGE},
                              timeout_s=LIST_TIMEOUT_S)
        if not reply.get("exists"):
            return None
        try:
            page = [_File(rel=_safe_rel(str(f["rel"]), ex.name, path), size=int(f["size"]),
                          mtime=float(f["mtime"]), mode=int(f["mode"]))
                    for f in reply.get("files") or []]
            if not files:
                dirs = tuple(_safe_rel(str(d), ex.name, path) for d in reply.get("dirs") or [])
                is_dir = bool(reply.get("is_dir"))
            total = int(reply.get("total_files", len(files) + len(page)))
        except (KeyError, TypeError, ValueError):
            raise TransferError(f"{ex.name}: {path}: the node's listing does not read") from None
        files += page
        if len(files) >= total or not page:
            break
    if any(f.size < 0 for f in files) or (not is_dir and [f.rel for f in files] != [""]):
        raise TransferError(f"{ex.name}: {path}: the node's listing does not read")
    return _Listing(is_dir=is_dir, files=tuple(files), dirs=dirs)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64_length(data: str) -> int | None:
    """The bytes a padded base64 text holds (None: not such a text); the text itself stays undecoded."""
    if len(data) % 4:
        return None
    return len(data) // 4 * 3 - (data[-1:] == "=") - (data[-2:] == "==")


# ------------------------------------------------------------------------------------------------- reads


async def scan(ex: Executor, path: str) -> TreeInfo:
    """The file or folder `path` on the node: whether it is there, its bytes, files and newest mtime."""
    r = await ex.data("scan", {"path": _clean(path)})
    newest = r.get("newest")
    return TreeInfo(exists=bool(r.get("exists")), bytes=int(r.get("bytes") or 0), files=int(r.get("files") or 0),
                    newest=float(newest) if newest is not None else None)


async def free_bytes(ex: Executor, path: str) -> int:
    """Bytes free on the node's file system where `path` is or would be (its nearest existing folder)."""
    return int((await ex.data("free", {"path": _clean(path)}))["free"])


async def tree_hash(ex: Executor, path: str) -> str:
    """sha256 (hex) of the tree `path` on the node, as nodehelper.data_hash makes it: for each regular file in
    the order of its relative path ("" for a file alone), the path in UTF-8, NUL, its size in decimal, NUL, its
    bytes. The same content gives the same hash on any node; modes and mtimes do not count."""
    return str((await ex.data("hash", {"path": _clean(path)}, timeout_s=HASH_TIMEOUT_S))["sha256"])


async def remove(ex: Executor, path: str) -> None:
    """Remove the tree `path` on the node (an eviction), and a copy of it left unfinished; no error if absent."""
    path = _clean(path)
    await ex.data("drop", {"path": path + PARTIAL_SUFFIX}, timeout_s=COMMIT_TIMEOUT_S)
    await ex.data("drop", {"path": path}, timeout_s=COMMIT_TIMEOUT_S)


# ------------------------------------------------------------------------------------------------- copy


async def copy_tree(src: Executor, src_path: str, dst: Executor, dst_path: str, *,
                    limit_bps: float | None = None,
                    progress: Callable[[int, int], Awaitable[None]] | None = None,
                    chunk: int = 1 << 20, headroom_bytes: int = 0,
                    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                    monotonic: Callable[[], float] = time.monotonic) -> CopyResult:
    """Copy the file or folder `src_path` of `src` to `dst_path` on `dst`, replacing what is there as a whole, and
    resuming what an earlier attempt left (see the module's docstring).

    `limit_bps`: at most this many bytes a second on average (from the first byte this attempt moves).
    `progress(done, total)` is awaited after each chunk or batch of small files (done counts the resumed bytes).
    `chunk`: bytes per request (at most 4 MiB; a batch's too). `headroom_bytes`: what must stay free on `dst`
    beyond the copy. `sleep` and `monotonic` are the throttle's (a test's fake clock). Raises NoSpace (nothing
    written), TransferError (no such source, it changed while copied, a listing that does not read), or what the
    executors raise."""
    if not 0 < chunk <= DATA_CHUNK_MAX:
        raise ValueError(f"chunk must be 1 to {DATA_CHUNK_MAX} bytes, not {chunk}")
    if limit_bps is not None and limit_bps <= 0:
        raise ValueError(f"limit_bps must be positive, not {limit_bps}")
    started = monotonic()
    src_path, dst_path = _clean(src_path), _clean(dst_path)
    if src is dst and (dst_path == src_path or dst_path.startswith(src_path.rstrip("/") + "/")
                       or src_path.startswith(dst_path.rstrip("/") + "/")):
        raise TransferError(f"{src.name}: cannot copy {src_path} to {dst_path}: one lies in the other")
    listing = await _list(src, src_path)
    if listing is None:
        raise TransferError(f"{src.name}: {src_path}: no such file or folder")
    partial = dst_path + PARTIAL_SUFFIX
    total = listing.total

    # the room it needs, from what an earlier attempt left as it is now: NoSpace before anything is made
    kept, _ = await _survey(dst, partial, listing)
    needed = total - sum(kept.values()) + headroom_bytes
    free = await free_bytes(dst, partial)
    if free < needed:
        raise NoSpace(dst.name, dst_path, needed, free)
    # this attempt's from here on: late writes of an earlier one are refused, then what they left is looked at
    claim = {"partial": partial, "token": secrets.token_hex(16)}
    await dst.data("claim", claim)
    offsets = await _resumable(dst, partial, listing)
    resumed = sum(offsets.values())
    await _write_manifest(dst, partial, listing, src.name, src_path, chunk, claim)

    copied = await _move(src, src_path, dst, partial, listing, offsets, claim, chunk=chunk, limit_bps=limit_bps,
                         progress=progress, total=total, resumed=resumed, sleep=sleep, monotonic=monotonic)

    again = await _list(src, src_path)
    changed = _changed(listing, again)
    if changed:
        raise TransferError(f"{src.name}: {src_path} changed while it was copied ({len(changed)} files, as "
                            f"{changed[0]!r}); copy it again: those files start over")
    await _check_partial(dst, partial, listing)
    await dst.data("commit", {"partial": partial, "dest": dst_path}, timeout_s=COMMIT_TIMEOUT_S)
    return CopyResult(bytes_total=total, bytes_copied=copied, resumed_bytes=resumed,
                      seconds=monotonic() - started, files=len(listing.files))


def _tree_path(partial: str, rel: str) -> str:
    return f"{partial}/{DATA_TREE}/{rel}" if rel else f"{partial}/{DATA_TREE}"


def _source_path(src_path: str, rel: str) -> str:
    return f"{src_path}/{rel}" if rel else src_path


async def _read_manifest(dst: Executor, partial: str) -> dict[str, Any] | None:
    """The manifest an earlier attempt left in `partial`, or None (none, or one that does not read)."""
    path = f"{partial}/{DATA_MANIFEST}"
    body = bytearray()
    try:
        while True:
            r = await dst.data("read", {"path": path, "offset": len(body), "max_bytes": DATA_CHUNK_MAX})
            body += base64.b64decode(r.get("data") or "")
            if r.get("eof") or not r.get("data"):
                break
    except HelperError:
        return None  # no manifest (or no partial folder): nothing to resume
    try:
        m = json.loads(body.decode("utf-8", "surrogateescape"))
    except ValueError:
        return None  # cut short by a crash while it was written
    if not isinstance(m, dict) or m.get("version") != MANIFEST_VERSION or m.get("kind") not in ("file", "dir"):
        return None
    return m


async def _resumable(dst: Executor, partial: str, listing: _Listing) -> dict[str, int]:
    """What of `partial` an earlier attempt left that may be kept (rel -> its bytes), once everything else of it
    is removed (files that start over, files and folders the source no longer has)."""
    offsets, stale = await _survey(dst, partial, listing)
    for path in stale:  # a folder first: what is in it is gone with it
        await dst.data("drop", {"path": path})
    return offsets


async def _survey(dst: Executor, partial: str, listing: _Listing) -> tuple[dict[str, int], list[str]]:
    """What of `partial` may be kept (rel -> the bytes to keep) and the paths of what must go, changing nothing."""
    manifest = await _read_manifest(dst, partial)
    kind = "dir" if listing.is_dir else "file"
    have = None
    if manifest is not None and manifest.get("kind") == kind:
        have = await _list(dst, _tree_path(partial, ""))
    if manifest is None or have is None or have.is_dir != listing.is_dir:
        # nothing it holds can be vouched for (its claim stays: the attempt that made it holds it)
        return {}, [_tree_path(partial, ""), f"{partial}/{DATA_MANIFEST}"]
    old: dict[str, tuple[int, float]] = {}
    for e in manifest.get("files") or []:
        if isinstance(e, dict) and isinstance(e.get("size"), int) and isinstance(e.get("mtime"), int | float):
            old[str(e.get("rel"))] = (e["size"], float(e["mtime"]))
    sizes = {f.rel: f.size for f in have.files}
    offsets: dict[str, int] = {}
    stale: list[str] = []
    for f in listing.files:
        length = sizes.get(f.rel)
        if length is None:
            continue
        if old.get(f.rel) == (f.size, f.mtime) and length <= f.size:
            offsets[f.rel] = length
        else:
            stale.append(f.rel)
    wanted_files = {f.rel for f in listing.files}
    wanted_dirs = set(listing.dirs)
    stale_dirs = [d for d in have.dirs if d not in wanted_dirs]
    stale += [rel for rel in sizes if rel not in wanted_files]
    return offsets, [_tree_path(partial, rel) for rel in stale_dirs + stale]


async def _write_manifest(dst: Executor, partial: str, listing: _Listing, node: str, src_path: str,
                          chunk: int, claim: Mapping[str, str]) -> None:
    body = json.dumps({"version": MANIFEST_VERSION, "kind": "dir" if listing.is_dir else "file",
                       "source": {"node": node, "path": src_path}, "files": listing.wire(),
                       "dirs": list(listing.dirs)}).encode("utf-8", "surrogateescape")
    path = f"{partial}/{DATA_MANIFEST}"
    offset = 0
    while True:  # the first write cuts an older manifest to nothing
        piece = body[offset:offset + chunk]
        await dst.data("write", {"path": path, "offset": offset, "data": _b64(piece), "claim": claim})
        offset += len(piece)
        if offset >= len(body):
            return


@dataclass(frozen=True, slots=True)
class _Part:
    """A file to copy from `start` (the bytes an earlier attempt left: 0 for none)."""

    file: _File
    start: int

    @property
    def left(self) -> int:
        return self.file.size - self.start


def _units(parts: list[_Part], chunk: int) -> list[tuple[_Part, ...]]:
    """The files to copy, in the listing's order, as units a worker takes whole: a file of its own, or a batch of
    small ones (each at most BATCH_FILE_MAX and a chunk left, together at most a chunk and BATCH_FILES), which
    stays where its first file is while later small files fill it."""
    small = min(BATCH_FILE_MAX, chunk)
    units: list[list[_Part]] = []
    batch: list[_Part] | None = None
    batch_bytes = 0
    for p in parts:
        if p.left > small:
            units.append([p])
            continue
        if batch is None or len(batch) >= BATCH_FILES or batch_bytes + p.left > chunk:
            batch, batch_bytes = [], 0
            units.append(batch)
        batch.append(p)
        batch_bytes += p.left
    return [tuple(u) for u in units]


def _unknown_request(e: HelperError) -> bool:
    """An older helper's answer to a request it does not have (its server's, or its one-shot usage line)."""
    return "unknown request" in str(e) or "usage: nodehelper.py" in str(e)


async def _batches_taken(src: Executor, src_path: str, dst: Executor, claim: Mapping[str, str]) -> bool:
    """Whether both nodes' helpers take many files a request (an empty one of each asked); False where one
    predates them (a lab's installed helper not yet updated): that copy goes chunk by chunk."""
    try:
        await src.data("read_many", {"root": src_path, "files": []})
        await dst.data("write_many", {"claim": claim, "files": []})
    except HelperError as e:
        if _unknown_request(e):
            return False
        raise
    return True


async def _move(src: Executor, src_path: str, dst: Executor, partial: str, listing: _Listing,
                offsets: Mapping[str, int], claim: Mapping[str, str], *, chunk: int, limit_bps: float | None,
                progress: Callable[[int, int], Awaitable[None]] | None, total: int, resumed: int,
                sleep: Callable[[float], Awaitable[None]], monotonic: Callable[[], float]) -> int:
    """Every byte not yet in `partial`, read from `src` and written to `dst`, FILES_AT_ONCE units at a time (a
    tree of small files: their round trips overlap): a big file chunk by chunk, each next chunk read while the one
    before is written; small files a batch at a time (`_units`). The bytes moved. Data goes on as the source's
    base64 came: decoding it here only to encode it again would cost the controller's CPU twice per byte."""
    parts = [_Part(f, offsets.get(f.rel) or 0) for f in listing.files if offsets.get(f.rel, -1) < f.size]
    units = _units(parts, chunk)
    batched = any(len(u) > 1 for u in units) and await _batches_taken(src, src_path, dst, claim)
    todo = iter(units)
    moved = 0
    t0 = monotonic()
    pace = asyncio.Lock()

    async def moved_bytes(n: int) -> None:
        nonlocal moved
        moved += n
        if limit_bps is not None:
            async with pace:  # one sleeper at a time: the sleeps add up to the bytes over the limit
                ahead = moved / limit_bps - (monotonic() - t0)
                if ahead > 0:
                    await sleep(ahead)
        if progress is not None and n:
            await progress(resumed + moved, total)

    async def read(rel: str, offset: int, size: int) -> tuple[str, int]:
        want = min(chunk, size - offset)
        path = _source_path(src_path, rel)
        # root and rel: the helper opens the file below the dataset's folder, following no link there (a folder
        # swapped for a link mid-copy is refused); path: what a helper older than that reads
        r = await src.data("read", {"root": src_path, "rel": rel, "path": path, "offset": offset,
                                    "max_bytes": want})
        data = str(r.get("data") or "")
        n = _b64_length(data)
        if n is None or n > want:
            raise TransferError(f"{src.name}: {path}: the node's answer at {offset} does not read")
        if not n:
            raise TransferError(f"{src.name}: {path} ended at {offset} of {size} bytes: it changed while it was "
                                "copied; copy it again")
        return data, n

    async def write(path: str, offset: int, data: str, n: int) -> None:
        r = await dst.data("write", {"path": path, "offset": offset, "data": data, "claim": claim})
        if r.get("size") != offset + n:
            raise TransferError(f"{dst.name}: {path} has {r.get('size')} bytes after a write, not {offset + n}")
        await moved_bytes(n)

    async def one_file(f: _File, start: int) -> None:
        target = _tree_path(partial, f.rel)
        if f.size == 0:
            await write(target, 0, "", 0)  # an empty file is made by writing nothing
            return
        offset = start
        reading: asyncio.Task[tuple[str, int]] | None = asyncio.create_task(read(f.rel, offset, f.size))
        try:
            while reading is not None:
                data, n = await reading
                following = offset + n
                reading = asyncio.create_task(read(f.rel, following, f.size)) if following < f.size else None
                await write(target, offset, data, n)
                offset = following
        finally:
            if reading is not None:  # a write failed, or the copy was cancelled: the read ahead goes too
                reading.cancel()
                await asyncio.wait([reading])
                if not reading.cancelled():
                    reading.exception()  # seen: the copy's own error is the one raised

    async def one_batch(batch: tuple[_Part, ...]) -> None:
        """Small files whole (from where an earlier attempt left each): one request to each node."""
        r = await src.data("read_many", {"root": src_path, "files": [
            {"rel": p.file.rel, "offset": p.start, "max_bytes": p.left} for p in batch]})
        got = r.get("files")
        if not isinstance(got, list) or len(got) != len(batch):
            raise TransferError(f"{src.name}: {src_path}: the node's answer to a batch of {len(batch)} files "
                                "does not read")
        files: list[dict[str, Any]] = []
        for p, g in zip(batch, got, strict=True):
            data = g.get("data") if isinstance(g, dict) else None
            n = _b64_length(data) if isinstance(data, str) else None
            size = g.get("size") if isinstance(g, dict) else None
            path = _source_path(src_path, p.file.rel)
            if n is None or not isinstance(size, int) or n > p.left:
                raise TransferError(f"{src.name}: {path}: the node's answer at {p.start} does not read")
            if size != p.file.size:
                raise TransferError(f"{src.name}: {path} has {size} bytes, not {p.file.size}: it changed while it "
                                    "was copied; copy it again")
            if n != p.left:
                raise TransferError(f"{src.name}: {path} ended at {p.start + n} of {size} bytes: it changed while "
                                    "it was copied; copy it again")
            files.append({"rel": p.file.rel, "offset": p.start, "data": data})
        w = await dst.data("write_many", {"claim": claim, "files": files})
        sizes = w.get("sizes")
        sizes = sizes if isinstance(sizes, list) else []
        for i, p in enumerate(batch):
            if i >= len(sizes) or sizes[i] != p.file.size:
                raise TransferError(f"{dst.name}: {_tree_path(partial, p.file.rel)} has "
                                    f"{sizes[i] if i < len(sizes) else None} bytes after a write, not {p.file.size}")
        await moved_bytes(sum(p.left for p in batch))

    async def worker() -> None:
        for unit in todo:  # one iterator for all: each unit goes to one worker
            if batched and len(unit) > 1:
                await one_batch(unit)
            else:
                for p in unit:
                    await one_file(p.file, p.start)

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(FILES_AT_ONCE):
                group.create_task(worker())
    except BaseExceptionGroup as errors:
        raise _first(errors) from None
    return moved


def _first(errors: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first error of a task group's (its workers fail one by one: the first stopped the copy)."""
    e = errors.exceptions[0]
    return _first(e) if isinstance(e, BaseExceptionGroup) else e


def _changed(before: _Listing, after: _Listing | None) -> list[str]:
    """The files whose size or mtime differ between two listings of the source (or that came or went)."""
    if after is None:
        return [f.rel for f in before.files]
    a = {f.rel: (f.size, f.mtime) for f in before.files}
    b = {f.rel: (f.size, f.mtime) for f in after.files}
    return sorted(rel for rel in a.keys() | b.keys() if a.get(rel) != b.get(rel))


async def _check_partial(dst: Executor, partial: str, listing: _Listing) -> None:
    """The partial tree holds exactly the source's files at their sizes (the commit checks sizes again)."""
    have = await _list(dst, _tree_path(partial, ""))
    want = {f.rel: f.size for f in listing.files}
    got = {f.rel: f.size for f in have.files} if have is not None else {}
    if have is not None and have.is_dir != listing.is_dir:
        got = {}
    if got != want:
        wrong = sorted(rel for rel in want.keys() | got.keys() if want.get(rel) != got.get(rel))
        raise TransferError(f"{dst.name}: the copy in {partial} does not match its source ({len(wrong)} files, as "
                            f"{wrong[0]!r}); copy it again")
