"""The monitoring stream: samples at the asked interval, simulated devices, clean end on the node."""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

import pytest

from hsched.config import SimulatedDevices
from hsched.simulated import simulated_uuid
from tests.e2e.ssh.conftest import run
from tests.e2e.ssh.hosts import TestHost, TestHosts
from tests.procs import with_args

pytestmark = pytest.mark.slow  # real sshd hosts and processes


def watch_processes(h: TestHost) -> list[int]:
    return with_args("watch", mentioning=str(h.root))


def test_watch_streams_samples_every_second(ssh_hosts: TestHosts) -> None:
    h = ssh_hosts[0]
    sim = SimulatedDevices(model="NVIDIA A100-SXM4-80GB", count=2, memory_mib=81920)

    async def main() -> list[dict[str, Any]]:
        ex = ssh_hosts.executor(h, cfg={"simulate": sim})
        samples: list[dict[str, Any]] = []
        try:
            async for s in ex.watch():  # the default interval: 1 s
                samples.append(s)
                if len(samples) == 3:
                    break
        finally:
            await ex.close()
        return samples

    samples = run(main())
    # the node's own clock: when each sample was taken there (ssh and a busy machine only add delay here)
    taken = [s["t"] for s in samples]
    gaps = [b - a for a, b in itertools.pairwise(taken)]
    assert all(0.7 < g < 2.1 for g in gaps) and 1.8 < taken[-1] - taken[0] < 3.1, gaps
    assert [s["seq"] for s in samples] == [0, 1, 2]
    last = samples[-1]
    assert last["node"] == h.name and last["boot_id"] and last["cpu"]["count"] == os.cpu_count()
    assert last["cpu"]["util"] is not None and 0 <= last["cpu"]["util"] <= 100
    assert last["memory"]["total_mib"] > 0 and last["memory"]["available_mib"] > 0
    assert last["gpus"]["source"] == "simulated"
    assert [d["uuid"] for d in last["gpus"]["devices"]] == [simulated_uuid(h.name, i) for i in range(2)]
    assert all(d["utilization_gpu"] == 0 and d["memory_used_mib"] == 0 for d in last["gpus"]["devices"])
    assert last["processes"] == []
    while watch_processes(h):  # the helper ends when its channel closes (bounded by the test's timeout)
        time.sleep(0.05)


def test_watch_with_count_ends_by_itself(ssh_hosts: TestHosts) -> None:
    async def main() -> list[int]:
        ex = ssh_hosts.executor(ssh_hosts[1])
        try:
            return [s["seq"] async for s in ex.watch(0.1, count=4)]
        finally:
            await ex.close()

    assert run(main()) == [0, 1, 2, 3]
