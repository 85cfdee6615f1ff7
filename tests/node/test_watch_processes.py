"""The watch sample's GPU processes carry what nvitop shows (issue 16, item 8): user, command line, CPU % and
resident host memory, read from /proc. Tried on this test's own process: nothing is started."""

from __future__ import annotations

import getpass
import os

from hsched.node.usage import ProcessUsage


def test_gpu_processes_get_user_command_cpu_and_host_memory() -> None:
    usage = ProcessUsage()
    me = os.getpid()
    listed = [{"pid": me, "uuid": "GPU-0", "used_memory_mib": 100, "name": "python", "run_dir": None},
              {"pid": me, "uuid": "GPU-1", "used_memory_mib": 50, "name": "python", "run_dir": None}]
    first = usage.annotate(listed)
    assert listed[0] == {"pid": me, "uuid": "GPU-0", "used_memory_mib": 100, "name": "python", "run_dir": None}
    assert first[0]["user"] == getpass.getuser()
    assert "python" in (first[0]["command"] or "") or "pytest" in (first[0]["command"] or "")
    assert first[0]["rss_mib"] > 0
    assert first[0]["cpu_percent"] is None  # no earlier sample to measure from
    sum(i * i for i in range(200_000))  # some CPU time between the two samples
    second = usage.annotate(listed)
    assert second[0]["cpu_percent"] is not None and second[0]["cpu_percent"] >= 0
    assert second[0]["cpu_percent"] == second[1]["cpu_percent"]  # one process on two GPUs: measured once
    assert (second[0]["uuid"], second[1]["uuid"]) == ("GPU-0", "GPU-1")


def test_a_process_that_is_gone_has_no_figures() -> None:
    gone = {"pid": 2**22 + 12345, "uuid": "GPU-0", "used_memory_mib": 1, "name": None, "run_dir": None}
    (row,) = ProcessUsage().annotate([gone])
    assert (row["user"], row["command"], row["cpu_percent"], row["rss_mib"]) == (None, None, None, None)
    assert row["used_memory_mib"] == 1
