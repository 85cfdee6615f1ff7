"""Datasets copied between real SSH nodes through the controller (hsched/controller/datacopy.py over each node's helper
channel): a copy whose destination is cut off the network mid-way fails, never leaves half a tree, and resumes
with only the rest once the node is back; the tree arrives byte-identical, and goes on to this machine's node."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest
from hsched.executors.local import LocalExecutor

from hsched.controller.datacopy import copy_tree, scan, tree_hash
from hsched.errors import NodeUnreachable
from tests.e2e.ssh.conftest import run
from tests.e2e.ssh.hosts import TestHosts

pytestmark = pytest.mark.slow  # real sshd hosts and processes

MiB = 1 << 20


def expected_hash(root: Path) -> str:
    """hsched.node.dataread.data_hash's definition, computed here."""
    h = hashlib.sha256()
    for p in sorted(p for p in root.rglob("*") if p.is_file()):
        data = p.read_bytes()
        h.update(str(p.relative_to(root)).encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()


def test_a_copy_between_ssh_nodes_survives_a_cut_and_resumes(ssh_hosts: TestHosts, tmp_path: Path) -> None:
    a, b = ssh_hosts[0], ssh_hosts[1]
    base = Path(os.path.realpath(tmp_path))  # a write refuses a link on its path
    src = base / "disk-a" / "ds"
    (src / "train").mkdir(parents=True)
    (src / "train" / "shard0.bin").write_bytes(os.urandom(3 * MiB))
    (src / "train" / "shard1.bin").write_bytes(os.urandom(MiB + 1))
    (src / "labels.txt").write_text("cat\ndog\n")
    (src / "empty").write_bytes(b"")
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    dest = f"{os.path.realpath(b.root)}/data/ds"  # the hosts share this machine's disk: b's folder

    async def main() -> None:
        ea, eb = ssh_hosts.executor(a), ssh_hosts.executor(b)
        here = LocalExecutor(node="here")
        cut = asyncio.Event()

        async def progress(done: int, total: int) -> None:
            if done > 0.3 * total and not cut.is_set():
                cut.set()
                await asyncio.to_thread(b.cut)  # the next chunk finds node b gone

        try:
            with pytest.raises(NodeUnreachable):
                await copy_tree(ea, str(src), eb, dest, progress=progress, chunk=256 << 10)
            assert cut.is_set() and not (await scan(ea, dest)).exists  # a sees b's folder: one disk
            await asyncio.to_thread(b.restore)
            eb.reset_backoff()
            r = await copy_tree(ea, str(src), eb, dest)
            assert r.resumed_bytes > 0.3 * total and r.resumed_bytes + r.bytes_copied == total
            want = await asyncio.to_thread(expected_hash, src)
            assert await tree_hash(eb, dest) == await tree_hash(ea, str(src)) == want
            # on to this machine's own node: any pair of executors
            mine = str(base / "here" / "ds")
            r = await copy_tree(eb, dest, here, mine)
            assert r.bytes_copied == total and await asyncio.to_thread(expected_hash, Path(mine)) == want
            assert (await scan(here, mine)).files == 4
        finally:
            await ea.close()
            await eb.close()
            await here.close()

    try:
        run(main(), timeout=120)
    finally:
        b.restore()
