"""How long `hsched queue --json` takes with 1,000, 10,000 and 100,000 jobs in the store (--sizes).

Printed as ratios against `hsched --version` measured in the same run (the CLI's fixed start-up cost), so the
figures mean something on a shared, noisy machine. Run: python tests/bench/bench_queue.py [--repeat N]
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

from hsched.model import JobSpec, JobState
from hsched.paths import Home
from hsched.serialize import spec_to_dict
from hsched.store import Store


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


def timed(args: list[str], env: dict[str, str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "hsched", *args], env=env, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--sizes", default="1000,10000,100000", help="store sizes, comma-separated")
    ap.add_argument("--held-every", type=int, default=20,
                    help="one job in this many is pending (held), the rest ended (2000: a lab's long history)")
    opts = ap.parse_args()
    print(f"{'store':>8} {'command':<22} {'median s':>9} {'x --version':>12}")
    for n in (int(x) for x in opts.sizes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            home = Home(Path(tmp) / "home")
            fill(home, n, opts.held_every)
            env = dict(os.environ, HSCHED_HOME=str(home.root))
            env.pop("HSCHED_FLEET", None)
            subprocess.run([sys.executable, "-m", "hsched", "daemon", "start"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            try:
                base = timed(["--version"], env, opts.repeat)
                for args in (["queue"], ["queue", "--json"], ["queue", "--all", "--json"]):
                    t = timed(args, env, opts.repeat)
                    print(f"{n:>8} {' '.join(args):<22} {t:>9.3f} {t / base:>12.2f}")
                print(f"{n:>8} {'--version':<22} {base:>9.3f} {1.0:>12.2f}")
            finally:
                subprocess.run([sys.executable, "-m", "hsched", "daemon", "stop"], env=env,
                               stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
