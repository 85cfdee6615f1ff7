"""A dataset copy cut by a controller kill (SIGKILL) resumes where its bytes stopped when the controller comes back,
and ends byte-identical; the job that waited for it then runs with $HSCHED_DATA_<NAME> there (issue 15, item 2).

Real processes: the controller, two local nodes' helpers (one without GPUs holding the data, one simulated GPU), the
copy through the helpers' channels, throttled (settings data_limit_mbps) so that the kill lands in its middle."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path

from tests.conftest import Hs, process_gone, wait_until

SIZE = 12 * (1 << 20)
"""12 MiB at 1 MB/s (data_limit_mbps = 8): about 12 s of copy, killed after its first MiB."""


def tree_hash(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def test_a_copy_cut_by_a_controller_kill_resumes_and_ends_identical(tmp_path: Path) -> None:
    src = tmp_path / "disk-a" / "imagenet"
    (src / "train").mkdir(parents=True)
    (src / "train" / "shard0.bin").write_bytes(os.urandom(SIZE // 2))
    (src / "train" / "shard1.bin").write_bytes(os.urandom(SIZE // 2))
    (src / "labels.txt").write_text("cat\ndog\n")
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        '[[node]]\nname = "a"\n'  # this machine's own (no GPUs here): it holds the data
        '[[node]]\nname = "b"\n[node.simulate]\nmodel = "NVIDIA A100-SXM4-80GB"\ncount = 1\n'
        f'[[dataset]]\nname = "imagenet"\npaths = {{ a = "{src}" }}\n')
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "settings.toml").write_text("data_limit_mbps = 8\n")
    h = Hs(home, fleet=fleet)
    try:
        job = h.run("submit", "--parsable", "--gpus", "1", "--data", "imagenet", "--", "sh", "-c",
                    'echo "data at $HSCHED_DATA_IMAGENET"; ls "$HSCHED_DATA_IMAGENET/train"', check=True)
        jid = job.stdout.strip()

        def copying() -> dict[str, object] | None:
            listing = h.json("data")
            assert isinstance(listing, list)
            moving = listing[0]["transfers"]
            return moving[0] if moving and 1 << 20 <= moving[0]["done"] < moving[0]["total"] else None

        first = wait_until(copying, "the copy to b to be under way")
        assert (first["from"], first["node"]) == ("a", "b")
        pid = h.controller_pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: process_gone(pid), "the killed controller to be gone")
        # the partial copy is on b's disk, not at its final path
        partial = next((home / "data" / "b").glob("imagenet.partial"))
        assert not (home / "data" / "b" / "imagenet").exists()
        assert partial.is_dir()
        h.run("daemon", "start", check=True)
        h.run("wait", jid, "--timeout", "300", check=True, timeout=400)
        shown = h.json("show", jid)
        assert isinstance(shown, dict)
        assert shown["state"] == "COMPLETED", shown
        events = [e for e in shown["events"] if e["kind"] in ("data_copy", "data_copied", "started")]
        copied = [e for e in events if e["kind"] == "data_copied"]
        assert len(copied) == 1, events
        assert copied[0]["data"]["resumed_bytes"] >= 1 << 20  # went on where the bytes stopped
        assert copied[0]["data"]["bytes"] <= SIZE + 8 - (1 << 20)  # and copied only the rest
        assert events[-1]["kind"] == "started"  # the job started once its data was there
        dest = home / "data" / "b" / "imagenet"
        assert tree_hash(dest) == tree_hash(src)
        assert not partial.exists()
        log = h.run("logs", jid, check=True).stdout
        assert f"data at {dest}" in log and "shard0.bin" in log
        listing = h.json("data")
        assert isinstance(listing, list)
        assert {w["node"]: (w["origin"], w["state"]) for w in listing[0]["where"]} == {
            "a": ("declared", "ready"), "b": ("copy", "ready")}, json.dumps(listing)
    finally:
        h.stop()
