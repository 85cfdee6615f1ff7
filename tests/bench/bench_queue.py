"""How long `hsched queue --json` (and `hsched daemon status --json`) take with 1,000, 10,000 and 100,000 jobs in
the store (--sizes).

Printed as ratios against `hsched --version` measured in the same run (the CLI's fixed start-up cost), so the
figures mean something on a shared, noisy machine: the median wall time of each command, and the median CPU time
(user + system) of the CLI process alone, which is what a listing costs the person who runs it. `--held-every 1`
makes every job active (pending, held), as issue 33 measures ("10,000 active jobs"). The row "decoded (before)" is
the path `queue --json` took before issue 33 (the objects decoded and printed again by the CLI), run in the same
loop as a baseline.

Run: python tests/bench/bench_queue.py [--repeat N] [--sizes 10000] [--held-every 1] [--against TREE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hsched.controller.store import Store
from hsched.model import JobSpec, JobState
from hsched.paths import Home
from hsched.serialize import spec_to_dict


def fill(home: Home, n: int, held_every: int = 20) -> None:
    """n jobs: one in `held_every` pending but held (so the controller leaves them alone), the rest ended."""
    home.ensure()
    store = Store(home.db)
    now = time.time()
    rows = []
    for i in range(n):
        held = i % held_every == 0
        spec = JobSpec(command=("python", "train.py", "--seed", str(i)), name=f"job-{i}", hold=held)
        state = JobState.PENDING if held else JobState.COMPLETED
        rows.append(("bench", state.value, "JobHeldUser" if held else "completed", "normal", 0,
                     json.dumps(spec_to_dict(spec)), now - n + i, None if held else now - n + i + 1,
                     None if held else now - n + i + 2, None if held else 0))
    with store.tx() as db:
        db.executemany(
            "INSERT INTO jobs(user, state, reason, qos, priority, spec, submit_time, start_time, end_time, exit_code)"
            " VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
    store.close()


DECODED = ("from hsched.cli._common import print_json; from hsched.client import Client; "
           "print_json(Client().call('queue'))")
"""`queue --json` as it was before issue 33: every object decoded, then printed again."""


def timed(args: list[str], env: dict[str, str], repeat: int, tree: str | None = None) -> tuple[float, float]:
    """(median wall seconds, median CPU seconds of the child) of `hsched ARGS` (`-c CODE`: python -c); `tree`: with
    another source tree's hsched (run from there: `-m` puts the working folder first on the path)."""
    walls, cpus = [], []
    argv = [sys.executable, *args] if args[0] == "-c" else [sys.executable, "-m", "hsched", *args]
    cwd = None
    if tree is not None:
        env, cwd = dict(env, PYTHONPATH=tree), tree
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, cwd=cwd)
        _pid, status, usage = os.wait4(proc.pid, 0)
        walls.append(time.perf_counter() - t0)
        assert os.waitstatus_to_exitcode(status) == 0, args
        cpus.append(usage.ru_utime + usage.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--sizes", default="1000,10000,100000", help="store sizes, comma-separated")
    ap.add_argument("--held-every", type=int, default=20,
                    help="one job in this many is pending (held), the rest ended (2000: a lab's long history)")
    ap.add_argument("--against", metavar="TREE",
                    help="also each listing by another source tree's CLI (the branch before a change: `git archive "
                         "REV | tar -x -C TREE`), against the same controller, in the same loop")
    opts = ap.parse_args()
    print(f"{'store':>8} {'command':<32} {'wall s':>8} {'x --version':>12} {'CPU s':>8} {'x --version':>12}")
    for n in (int(x) for x in opts.sizes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            home = Home(Path(tmp) / "home")
            fill(home, n, opts.held_every)
            # an installed hsched runs from byte-compiled modules: a checkout with PYTHONDONTWRITEBYTECODE would
            # compile the CLI's modules at every run (as bench_cli.py, a cache of its own; the first run fills it)
            env = dict(os.environ, HSCHED_HOME=str(home.root), PYTHONPYCACHEPREFIX=str(Path(tmp) / "pyc"))
            env.pop("HSCHED_FLEET", None)
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            subprocess.run([sys.executable, "-m", "hsched", "daemon", "start"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            try:
                # (the controller's first listing reads every job, and the first runs compile: not counted)
                for warm in (["queue", "--json"], ["queue"], ["-c", DECODED], ["--version"],
                             ["daemon", "status", "--json"]):
                    timed(warm, env, 1)
                    if opts.against and warm[0] != "-c":
                        timed(warm, env, 1, opts.against)
                base, base_cpu = timed(["--version"], env, opts.repeat)
                for args in (["queue"], ["queue", "--json"], ["-c", DECODED], ["queue", "--all", "--json"],
                             ["daemon", "status", "--json"]):
                    # (with --against, the other tree's CLI right after this one's, against the same controller)
                    for tree in (None, opts.against) if opts.against and args[0] != "-c" else (None,):
                        t, cpu = timed(args, env, opts.repeat, tree)
                        name = "decoded (before)" if args[0] == "-c" else " ".join(args)
                        if tree is not None:
                            name = f"{name} (--against)"
                        print(f"{n:>8} {name:<32} {t:>8.3f} {t / base:>12.2f} {cpu:>8.3f} {cpu / base_cpu:>12.2f}")
                print(f"{n:>8} {'--version':<32} {base:>8.3f} {1.0:>12.2f} {base_cpu:>8.3f} {1.0:>12.2f}")
            finally:
                subprocess.run([sys.executable, "-m", "hsched", "daemon", "stop"], env=env,
                               stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
