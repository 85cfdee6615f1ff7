"""The whole product over SSH: a controller with three ssh test hosts lists them and runs jobs there."""

from __future__ import annotations

import time
from pathlib import Path

from tests.conftest import Hs
from tests.ssh.hosts import TestHosts


def test_nodes_listed_and_jobs_run_on_ssh_hosts(ssh_hosts: TestHosts, tmp_path: Path) -> None:
    hs = Hs(tmp_path / "home", fleet=ssh_hosts.fleet_toml(tmp_path / "fleet.toml", gpus=1))
    hs.env.update(ssh_hosts.env())
    try:
        t0 = time.monotonic()
        hs.run("daemon", "start", check=True)
        while True:
            nodes = hs.json("nodes")
            assert isinstance(nodes, list)
            if all(n["state"] == "UP" for n in nodes) or time.monotonic() - t0 > 15:
                break
            time.sleep(0.2)
        assert time.monotonic() - t0 < 5, nodes
        assert sorted((n["name"], n["state"], len(n["devices"])) for n in nodes) == [
            (h.name, "UP", 1) for h in ssh_hosts]
        ids = []
        for i in range(3):
            out = hs.run("submit", "--gpus", "1", "--parsable", "--", "sh", "-c",
                         f'echo "job {i} on $HSCHED_NODE"; exit {20 + i}', check=True)
            ids.append(out.stdout.strip())
        hs.run("wait", *ids, "--timeout", "60")
        for i, jid in enumerate(ids):
            job = hs.json("show", jid)
            assert isinstance(job, dict)
            assert job["exit_code"] == 20 + i and job["state"] == "FAILED", job
            node = job["placement"][0]["node"]
            assert hs.run("logs", jid, check=True).stdout == f"job {i} on {node}\n"
    finally:
        hs.stop()
