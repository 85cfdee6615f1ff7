"""What the command line costs (issue 18): CPU time of `hsched --version`, `hsched submit` and `hsched queue` against
`python -c pass`, and the Python client's submit rate, single and batched.

Every CLI figure is the median CPU time (user + system, from the child's rusage) over `--repeat` runs, printed
with its ratio to `python -c pass` and to `hsched --version` measured in the same run, so the figures mean
something on a shared, noisy machine. Modules are byte-compiled as on an installed hsched (into a temporary
PYTHONPYCACHEPREFIX, whatever PYTHONDONTWRITEBYTECODE says here), and a first round that compiles is not
counted. The commands run against a live controller on a temporary HSCHED_HOME (this machine alone, no GPUs);
the submitted jobs are held, so the controller only queues them.

The client's rate is wall-clock jobs per second of `Client.call("submit", ...)` in a loop (each call waits for
its durable commit, so the disk's fsync latency is in it), and of `Client.call("submit_many", ...)` with
`--batch` jobs per request; the controller's CPU per job is printed beside each.

Acceptance (issue 18): --version <= 2.5x `python -c pass`; submit <= 2x --version; client submit >= 200 jobs/s.

Run: nice python tests/bench/bench_cli.py [--repeat 15] [--jobs 400] [--batch 100]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def cpu_of(argv: list[str], env: dict[str, str]) -> float:
    """CPU seconds (user + system) of one run of `argv`, from its own rusage; it must succeed."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}: {err.decode(errors='replace')}")
    return usage.ru_utime + usage.ru_stime


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def commit_ms(folder: Path, n: int = 200) -> float:
    """Wall ms of one durable commit on this disk (SQLite in WAL mode with synchronous=FULL, as the store), over
    `n` after a warm-up: a submit acknowledged only once it is durable waits at least this long."""
    import sqlite3

    db = sqlite3.connect(str(folder / "commit.db"), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE t (a INTEGER, b TEXT)")
    times = []
    for i in range(n + 20):
        t0 = time.perf_counter()
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO t VALUES (?, ?)", (i, "x" * 1000))
        db.execute("COMMIT")
        times.append(time.perf_counter() - t0)
    db.close()
    return 1000 * statistics.median(times[20:])


def client_rate(n: int, batch: int) -> tuple[float, float, float] | None:
    """(jobs/s, controller CPU ms per job, client CPU ms per job) for `n` held jobs submitted one call each
    (`batch` 0) or `batch` jobs per submit_many call; None where the controller has no submit_many."""
    from hsched.client import Client

    with Client() as c:
        ping = c.call("ping")
        if batch and "submit_many" not in ping.get("ops", ()):
            return None
        pid = int(ping["pid"])
        environ = dict(os.environ)
        spec = {"command": ["true"], "hold": True}
        # a few first: the store's write-ahead log reaches its steady size, as on a controller that has run
        for _ in range(20):
            c.call("submit", spec=spec, source="<bench>", environ=environ)
        c0, m0, t0 = process_cpu(pid), time.process_time(), time.perf_counter()
        if batch:
            for i in range(0, n, batch):
                jobs = [{"spec": spec, "source": "<bench>"} for _ in range(min(batch, n - i))]
                c.call("submit_many", jobs=jobs, environ=environ)
        else:
            for _ in range(n):
                c.call("submit", spec=spec, source="<bench>", environ=environ)
        wall = time.perf_counter() - t0
        return n / wall, 1000 * (process_cpu(pid) - c0) / n, 1000 * (time.process_time() - m0) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15, help="runs per CLI figure (the median is printed)")
    ap.add_argument("--jobs", type=int, default=400, help="jobs per client submit figure")
    ap.add_argument("--batch", type=int, default=100, help="jobs per submit_many request")
    opts = ap.parse_args()
    python = sys.executable
    hsched = str(Path(python).with_name("hsched"))  # the console script users run
    if not Path(hsched).exists():
        print(f"no {hsched}: install hsched into this interpreter's environment (pip install -e .)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        # an installed hsched runs from byte-compiled modules; a checkout with PYTHONDONTWRITEBYTECODE compiles
        # every module at every start, which is not what users pay
        env = dict(os.environ, HSCHED_HOME=str(Path(tmp) / "home"), PYTHONPYCACHEPREFIX=str(Path(tmp) / "pyc"))
        env.pop("HSCHED_FLEET", None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        os.environ.clear()
        os.environ.update(env)
        subprocess.run([hsched, "daemon", "start"], env=env, check=True, stdout=subprocess.DEVNULL)
        try:
            commands = {
                "python -c pass": [python, "-c", "pass"],
                "hsched --version": [hsched, "--version"],
                "hsched submit --hold -- true": [hsched, "submit", "--hold", "--", "true"],
                "hsched submit --hold --gpus 0 --name b -- true": [hsched, "submit", "--hold", "--gpus", "0",
                                                                   "--name", "b", "--", "true"],
                "hsched queue --json": [hsched, "queue", "--json"],
                "hsched queue": [hsched, "queue"],
            }
            samples: dict[str, list[float]] = {k: [] for k in commands}
            for round_ in range(opts.repeat + 1):  # interleaved: a burst of load touches every command alike
                for name, argv in commands.items():
                    t = cpu_of(argv, env)
                    if round_:  # the first round compiles the modules
                        samples[name].append(t)
            cpu = {k: statistics.median(v) for k, v in samples.items()}
            base, version = cpu["python -c pass"], cpu["hsched --version"]
            print(f"{'command (median CPU, user+system)':<48} {'ms':>7} {'x pass':>7} {'x --version':>12}")
            for name, t in cpu.items():
                print(f"{name:<48} {1000 * t:>7.1f} {t / base:>7.2f} {t / version:>12.2f}")
            print()
            print(f"{'client':<48} {'jobs/s':>7} {'controller CPU ms/job':>22} {'client CPU ms/job':>18}")
            for label, batch in (("Client.call('submit') in a loop", 0),
                                 (f"Client.call('submit_many'), {opts.batch} jobs a call", opts.batch)):
                rate = client_rate(opts.jobs, batch)
                if rate is None:
                    print(f"{label:<48} {'n/a (the controller has no submit_many)':>30}")
                else:
                    print(f"{label:<48} {rate[0]:>7.0f} {rate[1]:>22.2f} {rate[2]:>18.2f}")
            ms = commit_ms(Path(tmp))
            print(f"one durable commit on this disk (SQLite WAL, synchronous=FULL): {ms:.2f} ms, so at most "
                  f"{1000 / ms:.0f} one-at-a-time submits/s before any CPU")
        finally:
            subprocess.run([hsched, "daemon", "stop"], env=env, stdout=subprocess.DEVNULL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
