"""Executor costs: CPU per status call (local one-shot vs the local helper server vs ssh), probe time for 1
host vs 8 hosts in parallel, and the controller's CPU while it watches 8 hosts at 1 Hz. Ratios against the
1-host figure measured in the same run (the machine is shared).

Run as root (test hosts in network namespaces) or as a user (loopback ports):
    python tests/bench/bench_ssh.py [--seconds 20] [--calls 200] [--calls-only]

CPU per call counts every process the call costs on this machine: the controller (RUSAGE_SELF), the
one-shot helpers it started and reaped (RUSAGE_CHILDREN), and the long-lived helper server (its
/proc/PID/stat, as it is not reaped). Over ssh, sshd's share on the node is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.e2e.ssh.hosts import TestHosts, sshd_available
from tests.procs import processes


async def probe_times(hosts: TestHosts, n: int, repeat: int) -> float:
    executors = [hosts.executor(h) for h in list(hosts)[:n]]
    try:
        await asyncio.gather(*(ex.probe() for ex in executors))  # connect and ship the helper first
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            await asyncio.gather(*(ex.probe() for ex in executors))
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    finally:
        await asyncio.gather(*(ex.close() for ex in executors))


def _rusage(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _helper_servers(marker: str) -> list[int]:
    """Processes running `nodehelper.py serve` whose command line mentions `marker`."""
    return [p.pid for p in processes() if b"serve" in p.argv and any(marker.encode() in a for a in p.argv)]


async def status_cpu(ex: Any, run_dir: Path, calls: int, marker: str) -> tuple[float, float, float]:
    """CPU seconds per status call (controller, reaped helpers, helper server) over `calls` calls on one
    running run, after a first call that starts whatever the executor keeps."""
    from hsched.executors.base import LaunchRequest, StatusQuery

    handle = await ex.launch(LaunchRequest(run_dir=str(run_dir), command=("sleep", "600")))
    query = [StatusQuery(handle.run_dir, handle)]
    await ex.status(query)
    servers = _helper_servers(marker)
    s0, c0 = _rusage(resource.RUSAGE_SELF), _rusage(resource.RUSAGE_CHILDREN)
    h0 = sum(cpu_seconds(p) for p in servers)
    for _ in range(calls):
        await ex.status(query)
    s1, c1 = _rusage(resource.RUSAGE_SELF), _rusage(resource.RUSAGE_CHILDREN)
    h1 = sum(cpu_seconds(p) for p in servers)
    await ex.signal(handle, "KILL")
    return (s1 - s0) / calls, (c1 - c0) / calls, (h1 - h0) / calls


def report_status_cpu(label: str, costs: tuple[float, float, float]) -> None:
    ctl, reaped, server = costs
    print(f"status, {label:<22} {1000 * (ctl + reaped + server):7.2f} ms CPU per call "
          f"(controller {1000 * ctl:.2f}, one-shot helpers {1000 * reaped:.2f}, helper server {1000 * server:.2f})")


async def local_status_cpu(base: Path, calls: int, serve: bool) -> tuple[float, float, float]:
    from hsched.executors.local import HELPER_PATH, LocalExecutor

    ex = LocalExecutor(serve=serve)
    try:
        return await status_cpu(ex, base / ("served" if serve else "one-shot"), calls, str(HELPER_PATH))
    finally:
        await ex.close()


async def ssh_status_cpu(hosts: TestHosts, base: Path, calls: int) -> tuple[float, float, float]:
    ex = hosts.executor(hosts[0])
    try:
        return await status_cpu(ex, base / "ssh", calls, str(hosts[0].root))
    finally:
        await ex.close()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def controller_cpu(hosts: TestHosts, base: Path, seconds: float) -> float:
    home = base / "home"
    env = dict(os.environ, HSCHED_HOME=str(home), HSCHED_FLEET=str(hosts.fleet_toml(base / "fleet.toml", gpus=2)),
               **hosts.env())
    subprocess.run([sys.executable, "-m", "hsched", "daemon", "start"], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    try:
        pid = int((home / "controller.lock").read_text().split()[0])
        time.sleep(5)  # connections made, helpers shipped, watches streaming
        c0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(seconds)
        return (cpu_seconds(pid) - c0) / (time.monotonic() - t0)
    finally:
        subprocess.run([sys.executable, "-m", "hsched", "daemon", "stop"], env=env, stdout=subprocess.DEVNULL)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200, help="status calls per CPU figure")
    ap.add_argument("--calls-only", action="store_true", help="only the CPU per status call")
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report_status_cpu("local, one-shot", asyncio.run(local_status_cpu(Path(tmp), opts.calls, serve=False)))
        report_status_cpu("local, helper server", asyncio.run(local_status_cpu(Path(tmp), opts.calls, serve=True)))
    if not sshd_available():
        print("sshd is needed for the rest (apt-get install openssh-server)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp, TestHosts(Path(tmp) / "hosts", count=1 if opts.calls_only else 8) \
            as hosts:
        report_status_cpu("ssh, helper server", asyncio.run(ssh_status_cpu(hosts, Path(tmp), opts.calls)))
        if opts.calls_only:
            return 0
        one = asyncio.run(probe_times(hosts, 1, opts.repeat))
        eight = asyncio.run(probe_times(hosts, 8, opts.repeat))
        print(f"probe, 1 host:            {one * 1000:7.1f} ms")
        print(f"probe, 8 hosts parallel:  {eight * 1000:7.1f} ms   ({eight / one:.2f}x the 1-host time; goal < 2x)")
        cpu = controller_cpu(hosts, Path(tmp), opts.seconds)
        print(f"controller CPU watching 8 hosts at 1 Hz: {cpu * 100:.1f} % of one core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
