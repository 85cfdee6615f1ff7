"""SSH fleet costs: probe time for 1 host vs 8 hosts in parallel, and the controller's CPU while it watches
8 hosts at 1 Hz. Ratios against the 1-host figure measured in the same run (the machine is shared).

Run as root (test hosts in network namespaces) or as a user (loopback ports):
    python tests/bench/bench_ssh.py [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.ssh.hosts import TestHosts, sshd_available


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
    opts = ap.parse_args()
    if not sshd_available():
        print("sshd is needed (apt-get install openssh-server)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp, TestHosts(Path(tmp) / "hosts", count=8) as hosts:
        one = asyncio.run(probe_times(hosts, 1, opts.repeat))
        eight = asyncio.run(probe_times(hosts, 8, opts.repeat))
        print(f"probe, 1 host:            {one * 1000:7.1f} ms")
        print(f"probe, 8 hosts parallel:  {eight * 1000:7.1f} ms   ({eight / one:.2f}x the 1-host time; goal < 2x)")
        cpu = controller_cpu(hosts, Path(tmp), opts.seconds)
        print(f"controller CPU watching 8 hosts at 1 Hz: {cpu * 100:.1f} % of one core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
