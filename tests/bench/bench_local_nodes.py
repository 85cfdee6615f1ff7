"""Many simulated local nodes on one machine (issue 18): helper processes and CPU.

Part 1, live: a fleet file of NODES `executor = "local"` nodes with `[node.simulate]` (8 GPUs each) and a real
`hsched daemon start` on a temporary HSCHED_HOME. Printed: the CPU of the controller process once it is ready
(it has probed every node), of the `daemon start` command, and of the node helpers (with the children they
reaped: the GPU probe); the helper processes alive. Then RUNS one-GPU jobs (`sleep`) are queued in one
submit_many and started: the processes (helpers: `nodehelper.py serve|watch`; wrappers: `nodehelper.py
_wrap`, one per run) and the CPU per second of the controller and its helpers while the runs are watched for
SECONDS (65 by default: the fleet is probed again every 30 s, and that is most of what many nodes cost).
Acceptance (issue 18): at most one helper per node plus one wrapper per run; `daemon start` under 3 s of CPU.

Part 2, the executors alone, in this process: NODES LocalExecutors with a helper server each (each given its
own path to this interpreter: servers are shared per interpreter) against NODES sharing one (the default):
the first probe of every node at once, then the status of RUNS runs spread over the nodes, asked as the watch
loop asks (every node at once, every 0.5 s) for EXECUTOR_SECONDS, and another probe of every node. CPU of this
process and of the helpers, measured in the same run, and their ratio.

Every Python of the bench runs from byte-compiled modules, as an installed hsched does (compiled once, into a
temporary PYTHONPYCACHEPREFIX, whatever PYTHONDONTWRITEBYTECODE says here).

Run: nice python tests/bench/bench_local_nodes.py [--nodes 64] [--runs 64] [--seconds 65] [--executor-seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def cpu(pid: int, *, children: bool = False) -> float:
    """CPU seconds of `pid` (with `children`: also of its children it has reaped); 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if children else 0)
    return ticks / TICK


def procs() -> list[tuple[int, int, list[str]]]:
    """(pid, ppid, argv) of every process."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
                argv = Path(f"/proc/{name}/cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            out.append((int(name), int(stat.rsplit(")", 1)[1].split()[1]), argv))
    return out


def helpers_and_wrappers() -> tuple[list[int], list[int]]:
    """Pids of node helpers (serve, watch, one-shot calls) and of run wrappers (`nodehelper.py _wrap`)."""
    helpers, wrappers = [], []
    for pid, _ppid, argv in procs():
        if any(a.endswith("nodehelper.py") for a in argv):
            (wrappers if "_wrap" in argv else helpers).append(pid)
    return helpers, wrappers


def fleet_file(path: Path, nodes: int) -> Path:
    path.write_text("".join(f'[[node]]\nname = "n{i:02d}"\nexecutor = "local"\n[node.simulate]\n'
                            f'model = "NVIDIA A100-SXM4-80GB"\ncount = 8\nmemory_mib = 81920\n\n'
                            for i in range(nodes)))
    return path


def live(nodes: int, runs: int, seconds: float) -> None:
    from hsched.client import Client
    from hsched.paths import Home

    with tempfile.TemporaryDirectory() as tmp:
        home = Home(Path(tmp) / "home")
        env = dict(os.environ, HSCHED_HOME=str(home.root), HSCHED_FLEET=str(fleet_file(Path(tmp) / "fleet.toml",
                                                                                         nodes)))
        hsched = [sys.executable, "-m", "hsched"]
        before = {p for ps in helpers_and_wrappers() for p in ps}  # others' (another bench, a test) are not ours
        proc = subprocess.Popen([*hsched, "daemon", "start"], env=env, stdout=subprocess.DEVNULL)
        _pid, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit("daemon start failed")
        try:
            pid = int(home.lock.read_text().split()[0])
            helpers = [h for h in helpers_and_wrappers()[0] if h not in before]
            print(f"{nodes} simulated local nodes: `hsched daemon start` returned (every node probed)")
            print(f"  controller CPU at ready         {cpu(pid):7.2f} s")
            print(f"  `daemon start` command CPU      {usage.ru_utime + usage.ru_stime:7.2f} s")
            print(f"  node helpers                    {len(helpers):7d} alive, "
                  f"{sum(cpu(h, children=True) for h in helpers):.2f} s CPU (with the GPU probes they ran)")
            with Client(home) as c:
                spec = {"command": ["sleep", "3600"], "resources": {"gpus": 1}}
                if "submit_many" in c.call("ping").get("ops", ()):
                    c.call("submit_many", jobs=[{"spec": spec, "source": "<bench>"}] * runs, environ=env)
                else:  # a controller from before submit_many (a before/after comparison)
                    for _ in range(runs):
                        c.call("submit", spec=spec, source="<bench>", environ=env)
                t0 = time.monotonic()
                while sum(j["state"] == "RUNNING" for j in c.call("queue")) < runs:
                    if time.monotonic() - t0 > 300:
                        raise SystemExit("the runs did not start within 300 s")
                    time.sleep(0.2)
                helpers, wrappers = (
                    [p for p in ps if p not in before] for ps in helpers_and_wrappers())
                print(f"  {runs} runs started in {time.monotonic() - t0:.1f} s: {len(helpers)} helper process(es), "
                      f"{len(wrappers)} wrappers (at most {nodes} + {runs} allowed)")
                c0 = cpu(pid) + sum(cpu(h, children=True) for h in helpers)
                t0 = time.monotonic()
                time.sleep(seconds)
                spent = cpu(pid) + sum(cpu(h, children=True) for h in helpers) - c0
                print(f"  watching {runs} runs for {seconds:g} s (probes every 30 s included): controller + helpers "
                      f"{spent / (time.monotonic() - t0):.3f} s CPU per s")
        finally:
            # runs outlive their controller, by design: cancelled first, and whatever is left killed
            try:
                with Client(home, autostart=False) as c:
                    for job in c.call("queue"):
                        c.call("cancel", id=job["id"])
                    deadline = time.monotonic() + 120
                    while c.call("queue") and time.monotonic() < deadline:
                        time.sleep(0.2)
            except Exception as e:  # the bench's own cleanup: say it, then kill what is left
                print(f"cancelling the runs failed: {e}", file=sys.stderr)
            subprocess.run([*hsched, "daemon", "stop"], env=env, stdout=subprocess.DEVNULL)
            wrappers = [p for p in helpers_and_wrappers()[1] if p not in before]
            for pid_, ppid, _argv in procs():
                if ppid in wrappers:
                    try:
                        os.kill(pid_, 9)  # a run's command; its wrapper then records the end and exits
                    except ProcessLookupError:
                        pass


async def executors(nodes: int, runs: int, seconds: float, shared: bool, base: Path) -> tuple[float, float, int]:
    """(CPU of this process, CPU of the helpers, helper servers) for the pattern in the module's docstring."""
    from hsched.executors.base import LaunchRequest, StatusQuery
    from hsched.executors.local import LocalExecutor

    pythons = []
    for i in range(nodes):
        if shared:
            pythons.append(sys.executable)
        else:
            link = base / f"python-{i:02d}"
            link.symlink_to(sys.executable)  # another path to the same interpreter: a server of its own
            pythons.append(str(link))
    exs = [LocalExecutor(node=f"n{i:02d}", python=pythons[i]) for i in range(nodes)]
    mine0 = time.process_time()
    try:
        await asyncio.gather(*(ex.probe() for ex in exs))
        handles = await asyncio.gather(*(exs[r % nodes].launch(LaunchRequest(
            run_dir=str(base / f"r{r}"), command=("sleep", "3600"))) for r in range(runs)))
        queries: list[list[StatusQuery]] = [[] for _ in exs]
        for r, h in enumerate(handles):
            queries[r % nodes].append(StatusQuery(h.run_dir, h))
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            await asyncio.gather(*(ex.status(q) for ex, q in zip(exs, queries, strict=True) if q))
            await asyncio.sleep(0.5)
        await asyncio.gather(*(ex.probe() for ex in exs))
        servers = {ex.server_pid for ex in exs} - {None}
        helper_cpu = sum(cpu(p, children=True) for p in servers)
        mine = time.process_time() - mine0
        for h in handles:
            await exs[0].signal(h, "KILL")
        return mine, helper_cpu, len(servers)
    finally:
        for ex in exs:
            await ex.close()


def byte_compiled(folder: Path) -> None:
    """Run every Python of the bench (controller, CLI, helpers) from byte-compiled modules, as an installed
    hsched runs (a checkout with PYTHONDONTWRITEBYTECODE compiles every module at every start), compiled once
    here into `folder`: the controller's, the CLI's, and a probe's (the helper's GPU discovery)."""
    os.environ["PYTHONPYCACHEPREFIX"] = str(folder)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-c", "import hsched.controller.server, hsched.cli.jobs, hsched.executors.local"],
                   check=True)
    subprocess.run([sys.executable, "-m", "hsched.node.nodehelper", "probe"], input=b"{}", check=True,
                   stdout=subprocess.DEVNULL)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--runs", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=65.0,
                    help="live: how long the runs are watched (the fleet is probed again every 30 s)")
    ap.add_argument("--executor-seconds", type=float, default=10.0, help="executors alone: how long")
    ap.add_argument("--part", choices=("live", "executors", "both"), default="both")
    opts = ap.parse_args()
    pyc = tempfile.TemporaryDirectory()
    byte_compiled(Path(pyc.name))
    if opts.part in ("live", "both"):
        live(opts.nodes, opts.runs, opts.seconds)
        print()
    if opts.part in ("executors", "both"):
        print(f"executors alone: {opts.nodes} local nodes, {opts.runs} runs, status every 0.5 s for "
              f"{opts.executor_seconds:g} s, two probes of every node")
        results = {}
        for shared in (False, True):
            with tempfile.TemporaryDirectory() as tmp:
                results[shared] = asyncio.run(executors(opts.nodes, opts.runs, opts.executor_seconds, shared,
                                                        Path(tmp)))
        print(f"  {'helper servers':<24} {'servers':>8} {'this process s':>15} {'helpers s':>10} {'total s':>8}")
        for shared, (mine, helpers, n) in results.items():
            label = "one shared (default)" if shared else "one per node"
            print(f"  {label:<24} {n:>8d} {mine:>15.2f} {helpers:>10.2f} {mine + helpers:>8.2f}")
        per_node, one = (sum(results[k][:2]) for k in (False, True))
        print(f"  shared / per node: {one / per_node:.2f} of the CPU")
        print(json.dumps({"per_node_cpu_s": round(per_node, 2), "shared_cpu_s": round(one, 2)}))
    pyc.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
