"""Dataset copies of many small files (issue #15): batched (data_read_many/data_write_many) against chunk by chunk.

Two LocalExecutor nodes, each with a helper process of its own (as two machines would have), copy through this
process (the controller's place) a tree of FILES small files of SIZE bytes (in folders of 1,000, as ImageNet's
classes are) and one big file of BIG_MIB MiB: every file chunk by chunk (datacopy.BATCH_FILES = 1: no batch, the
path before batches, and the one an older helper gets) and batched (the default), in turns, ROUNDS times each, in
the same run. Printed: seconds, files/s and MB/s of each copy, the medians and their ratios (goal: >= 5x files/s
for 4 KiB files; the big file's MB/s unchanged). Every copy is checked byte-identical (tree_hash on the
destination node against the source's), then removed.

Then what the fsync of every file costs the destination's helper: data_write_many of the same files in batches of
a chunk, FILES_AT_ONCE at a time, in this process, with fsync and with fsync made a no-op (files/s each, in turns,
medians of 3): a resumed copy trusts the lengths it finds, so each file is on the disk before its batch is
answered.

Run: nice .venv/bin/python tests/bench/bench_datacopy.py [--files 10000] [--size 4096] [--big-mib 64] [--rounds 3]
     [--dir D]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hsched.executors.local import LocalExecutor  # noqa: E402

from hsched.controller import datacopy  # noqa: E402
from hsched.node import datawrite  # noqa: E402

MB = 1e6


def make_source(base: Path, files: int, size: int, big_mib: int) -> tuple[Path, Path]:
    small, big = base / "src" / "small", base / "src" / "big.bin"
    for i in range(files):
        folder = small / f"class-{i // 1000:04d}"
        if i % 1000 == 0:
            folder.mkdir(parents=True)
        (folder / f"img-{i:07d}.jpg").write_bytes(os.urandom(size))
    with big.open("wb") as f:
        for _ in range(big_mib):
            f.write(os.urandom(1 << 20))
    return small, big


async def timed_copy(a: LocalExecutor, src: Path, b: LocalExecutor, dst: Path) -> tuple[float, int]:
    t = time.perf_counter()
    r = await datacopy.copy_tree(a, str(src), b, str(dst))
    seconds = time.perf_counter() - t
    if await datacopy.tree_hash(b, str(dst)) != await datacopy.tree_hash(a, str(src)):
        raise SystemExit(f"{dst}: not byte-identical to {src}")
    return seconds, r.bytes_copied


async def copies(base: Path, small: Path, big: Path, files: int, rounds: int) -> dict[str, dict[str, float]]:
    """Each mode `rounds` times, in turns (others' load on a shared machine falls on both); medians."""
    # two interpreter paths: a helper process each (LocalExecutor shares one helper per interpreter)
    pythons = [sys.executable, str(base / "python-b")]
    os.symlink(sys.executable, pythons[1])
    a, b = LocalExecutor(node="a", python=pythons[0]), LocalExecutor(node="b", python=pythons[1])
    runs: dict[str, list[dict[str, float]]] = {"per-file": [], "batched": []}
    try:
        await datacopy.scan(a, str(small))  # both helpers started before the clock runs
        await datacopy.scan(b, str(small))
        for i in range(rounds):
            for mode, batch_files in (("per-file", 1), ("batched", datacopy.BATCH_FILES)):
                saved = datacopy.BATCH_FILES
                datacopy.BATCH_FILES = batch_files
                try:
                    s_small, n_small = await timed_copy(a, small, b, base / f"{mode}-{i}" / "small")
                    s_big, n_big = await timed_copy(a, big, b, base / f"{mode}-{i}" / "big.bin")
                finally:
                    datacopy.BATCH_FILES = saved
                await datacopy.remove(b, str(base / f"{mode}-{i}" / "small"))  # the disk as it was
                await datacopy.remove(b, str(base / f"{mode}-{i}" / "big.bin"))
                runs[mode].append({"small_s": s_small, "files_per_s": files / s_small,
                                   "small_mb_per_s": n_small / MB / s_small, "big_mb_per_s": n_big / MB / s_big})
                print(f"{mode:9s} {files} small files: {s_small:7.2f} s {files / s_small:8.0f} files/s "
                      f"{n_small / MB / s_small:7.1f} MB/s | big file {n_big / MB:.0f} MB: {s_big:6.2f} s "
                      f"{n_big / MB / s_big:7.1f} MB/s", flush=True)
    finally:
        await a.close()
        await b.close()
    return {mode: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for mode, rs in runs.items()}


def helper_writes(base: Path, small: Path, chunk: int, fsync: bool, tag: str) -> float:
    """files/s of data_write_many (the helper's own function, in this process) writing `small` in batches of a
    chunk, FILES_AT_ONCE batches at once as a copy sends them (threads: as the helper's server runs requests)."""
    rels = sorted(str(p.relative_to(small)) for p in small.rglob("*") if p.is_file())
    batches: list[list[dict[str, Any]]] = [[]]
    size = 0
    for rel in rels:
        data = (small / rel).read_bytes()
        if size + len(data) > chunk or len(batches[-1]) >= datacopy.BATCH_FILES:
            batches.append([])
            size = 0
        batches[-1].append({"rel": rel, "offset": 0, "data": base64.b64encode(data).decode("ascii")})
        size += len(data)
    partial = base / f"writes-{tag}.partial"
    claim = {"partial": str(partial), "token": "0" * 32}
    datawrite.data_claim(claim)
    real_fsync = os.fsync
    if not fsync:
        os.fsync = lambda fd: None
    try:
        t = time.perf_counter()
        with ThreadPoolExecutor(datacopy.FILES_AT_ONCE) as pool:
            list(pool.map(lambda b: datawrite.data_write_many({"claim": claim, "files": b}), batches))
        seconds = time.perf_counter() - t
    finally:
        os.fsync = real_fsync
    shutil.rmtree(partial)
    return len(rels) / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--size", type=int, default=4096, help="bytes of each small file")
    ap.add_argument("--big-mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="copies of each mode, in turns (medians reported)")
    ap.add_argument("--dir", default=None, help="where the trees go (default: the temporary folder; /dev/shm: a "
                                                "tmpfs, where neither an fsync nor a new inode costs the disk)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-datacopy-", dir=args.dir) as tmp:
        base = Path(os.path.realpath(tmp))  # a write refuses a link on its path
        t = time.perf_counter()
        small, big = make_source(base, args.files, args.size, args.big_mib)
        print(f"source: {args.files} files of {args.size} bytes and {args.big_mib} MiB "
              f"(made in {time.perf_counter() - t:.1f} s), chunk {1 << 20} bytes, FILES_AT_ONCE "
              f"{datacopy.FILES_AT_ONCE}, BATCH_FILES {datacopy.BATCH_FILES}, BATCH_FILE_MAX "
              f"{datacopy.BATCH_FILE_MAX}", flush=True)
        r = asyncio.run(copies(base, small, big, args.files, args.rounds))
        fps = r["batched"]["files_per_s"] / r["per-file"]["files_per_s"]
        mbs = r["batched"]["big_mb_per_s"] / r["per-file"]["big_mb_per_s"]
        print(f"medians of {args.rounds}: per-file {r['per-file']['files_per_s']:.0f} files/s, batched "
              f"{r['batched']['files_per_s']:.0f} files/s; ratio batched / per-file: {fps:.1f}x files/s "
              f"(goal >= 5x), {mbs:.2f}x MB/s on the big file")
        # taken in turns, three of each (the disk is shared: the median of each)
        rounds = [(fs, helper_writes(base, small, 1 << 20, fsync=fs, tag=f"{i}-{fs}"))
                  for i in range(3) for fs in (True, False)]
        with_fsync = statistics.median(r for fs, r in rounds if fs)
        without = statistics.median(r for fs, r in rounds if not fs)
        print(f"helper data_write_many alone, {datacopy.FILES_AT_ONCE} batches at once: {with_fsync:.0f} files/s "
              f"with an fsync of each file, {without:.0f} without ({with_fsync / without:.2f}x; medians of 3)")


if __name__ == "__main__":
    main()
