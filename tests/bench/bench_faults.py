"""The fault matrix at scale (issue 12): the kill loop with 1,000 controller SIGKILLs interleaved with submits, and
200 seeds of the randomized fault history against 3 sshd hosts (tests/faults/ runs 200 and 20 in CI).

Prints the figures for the closing note: kills, acknowledged submits, lost, duplicated, ran twice; per history
seed its actions, jobs, the faults' effects and violations, then totals. A failing seed leaves a replayable report
(`python -m tests.faults.history --replay REPORT`). Needs root (network namespaces, per-host boot ids) and sshd.

    python tests/bench/bench_faults.py                      # 1,000 kills and 200 seeds (about an hour here)
    python tests/bench/bench_faults.py --kills 100 --seeds 20
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `tests` as a package, run from anywhere

from tests.faults.cluster import Cluster, wait_for
from tests.faults.history import KILL_LOOP_FLEET, history_lab, kill_loop, run_history


def end_time_after_downtime(lab: Cluster, downtime: float) -> tuple[float, int | None]:
    """A job ends while no controller runs; the controller comes back `downtime` s later. Returns how far the
    recorded end time is from the job's real end, and the recorded exit code."""
    gate, ended = lab.root / "gate", lab.root / "ended"
    lab.start()
    jid = lab.submit(["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done; date +%s.%N > {ended}; exit 7"])
    lab.wait_state(jid, "RUNNING")
    lab.kill()
    gate.touch()
    wait_for(lambda: ended.exists() and ended.read_text().strip(), "the job to end")
    real = float(ended.read_text())
    time.sleep(max(0.0, real + downtime - time.time()))  # the downtime itself: what is measured
    lab.start()
    job = lab.wait_state(jid, "FAILED", "COMPLETED", "LOST")
    return abs(job["end_time"] - real), job["exit_code"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=1000)
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--first", type=int, default=0, help="the first seed")
    ap.add_argument("--reports", type=Path, default=Path("fault-reports"))
    ap.add_argument("--downtime", type=float, default=60.0,
                    help="seconds of controller downtime while a job ends (its end time's error is printed; 0: skip)")
    args = ap.parse_args()
    bad = 0
    with tempfile.TemporaryDirectory(prefix="hsched-bench-faults-") as tmp:
        base = Path(tmp)
        if args.downtime:
            with Cluster(base / "downtime", fleet_text=KILL_LOOP_FLEET) as lab:
                err, code = end_time_after_downtime(lab, args.downtime)
            print(f"end time after {args.downtime:g} s of downtime: off by {err:.3f} s, exit code {code} (7 expected)",
                  flush=True)
            bad += err > 1.0 or code != 7
        if args.kills:
            with Cluster(base / "killloop", fleet_text=KILL_LOOP_FLEET) as lab:
                figures = kill_loop(lab, args.kills, seed=1)
            print(figures.line(), flush=True)
            for v in figures.violations:
                print("   ", v)
            bad += bool(figures.violations or figures.lost or figures.duplicates or figures.ran_twice)
        if args.seeds:
            t0 = time.monotonic()
            totals: dict[str, int] = {}
            jobs = violations = failed = 0
            took = []
            with history_lab(base) as (lab, hosts):
                for seed in range(args.first, args.first + args.seeds):
                    res = run_history(lab, hosts, seed, report_dir=args.reports)
                    took.append(res.seconds)
                    jobs += res.jobs
                    violations += len(res.violations)
                    failed += bool(res.violations)
                    for k, n in res.happened.items():
                        totals[k] = totals.get(k, 0) + n
                    print(f"seed {seed}: {len(res.actions)} actions, {res.jobs} jobs {res.states}, {res.happened}, "
                          f"{len(res.violations)} violations, {res.seconds:.1f} s"
                          + (f", report {res.report}" if res.report else ""), flush=True)
                    for v in res.violations:
                        print("   ", v)
            print(f"randomized history: {args.seeds} seeds, {jobs} jobs, {violations} invariant violations in "
                  f"{failed} seeds; median {statistics.median(took):.1f} s a seed, {time.monotonic() - t0:.0f} s in "
                  f"all; {hosts.reboots} reboots; totals {dict(sorted(totals.items()))}", flush=True)
            bad += failed
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
