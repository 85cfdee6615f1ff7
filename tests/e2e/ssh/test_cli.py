"""The whole product over SSH: a controller with three ssh test hosts lists them and runs jobs there."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import Hs
from tests.e2e.ssh.hosts import TestHosts

pytestmark = pytest.mark.slow  # real sshd hosts and processes


def test_nodes_listed_and_jobs_run_on_ssh_hosts(ssh_hosts: TestHosts, tmp_path: Path) -> None:
    hs = Hs(tmp_path / "home", fleet=ssh_hosts.fleet_toml(tmp_path / "fleet.toml", gpus=1))
    hs.env.update(ssh_hosts.env())
    try:
        t0 = time.monotonic()
        hs.run("daemon", "start", check=True)
        while True:  # every host is probed and UP (bounded by the test's timeout)
            nodes = hs.json("nodes")
            assert isinstance(nodes, list)
            if len(nodes) == len(ssh_hosts) and all(n["state"] == "UP" for n in nodes):
                break
            time.sleep(0.2)
        print(f"all {len(nodes)} ssh nodes UP {time.monotonic() - t0:.1f} s after the daemon was started")
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
