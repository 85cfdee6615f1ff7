"""File transfer over SFTP: controller -> node -> controller, and node -> node through the controller."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hsched.executors.ssh import copy_between

from hsched.errors import TransferError
from tests.e2e.ssh.conftest import run
from tests.e2e.ssh.hosts import TestHosts

pytestmark = pytest.mark.slow  # real sshd hosts and processes


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def make_checkpoint(d: Path, tag: bytes) -> None:
    (d / "shards").mkdir(parents=True)
    (d / "model.bin").write_bytes(os.urandom(3 << 20) + tag)
    (d / "shards" / "opt state ü;$(x).pt").write_bytes(tag * 1000)
    (d / "step").write_text("1200\n")


def test_put_get_round_trip_and_node_to_node(ssh_hosts: TestHosts, tmp_path: Path) -> None:
    a, b = ssh_hosts[0], ssh_hosts[1]
    src = tmp_path / "ckpt"
    make_checkpoint(src, b"v1")
    newer = tmp_path / "ckpt2"
    (newer).mkdir()
    (newer / "step").write_text("2400\n")
    single = tmp_path / "one.bin"
    single.write_bytes(os.urandom(100_000))

    async def main() -> str:
        ea, eb = ssh_hosts.executor(a), ssh_hosts.executor(b)
        try:
            dest = await ea.remote_path(str(tmp_path / "home" / "checkpoints" / "12"))
            await ea.put(src, dest)
            await ea.put(single, f"{dest}-single/one.bin")
            await ea.get(dest, tmp_path / "back")
            await ea.get(f"{dest}-single/one.bin", tmp_path / "back-one.bin")
            # node to node, streamed through us
            other = f"{await eb.remote_root()}/moved/ckpt"
            n = await copy_between(ea, dest, eb, other)
            assert n == sum(len(v) for v in tree(src).values())
            await ea.put(newer, dest)  # replaces the folder as a whole
            with pytest.raises(TransferError, match=r"(?i)no such file"):
                await ea.get(f"{dest}/absent", tmp_path / "absent")
            return dest
        finally:
            await ea.close()
            await eb.close()

    dest = run(main())
    assert dest.startswith(f"{a.root}/files/")
    assert tree(tmp_path / "back") == tree(src)
    assert (tmp_path / "back-one.bin").read_bytes() == single.read_bytes()
    assert tree(b.root / "moved" / "ckpt") == tree(src)
    assert tree(Path(dest)) == {"step": b"2400\n"}
    leftovers = [p.name for p in Path(dest).parent.iterdir() if ".part-" in p.name or ".old-" in p.name]
    assert leftovers == [] and not (tmp_path / "absent").exists()
