"""Issue 32: the communication-aware placement rule measured before it runs. Gavel's 0e4a51 trace (1,181 jobs, 745
multi-GPU) on 16:16:16 as 4 servers of 4 GPUs per type, each type's servers under two leaves (hsched.sim.fabric:
200 Gb/s NICs, 100 Gb/s of leaf uplink per server, 30% of a step communicating at NIC speed), comm-blind placement
(consolidating best fit, whatever leaves it spans) against comm-aware (one leaf when one leaf holds the gang):
average JCT side by side, and the same trace without a fabric (the default figures).

    python tests/bench/bench_fabric.py [--policy hsched --policy las-hetero]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from hsched.sched import make_policy
from hsched.sim.cluster import parse_cluster
from hsched.sim.engine import SimConfig, SimCosts, simulate
from hsched.sim.fabric import FabricPlacer, two_leaves
from hsched.sim.trace import load_trace

TRACE = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "gavel-msr" / "seed=0" / "0e4a51.trace"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", action="append")
    args = ap.parse_args()
    tr = load_trace(TRACE)
    servers = parse_cluster("v100:16,p100:16,k80:16", 4)
    for name in args.policy or ["hsched", "las-hetero"]:
        none = simulate(tr, servers, make_policy(name), SimConfig()).summary
        print(f"{name:11s} avg JCT without a fabric {none['avg_jct_s']:>10,.0f} s", flush=True)
        for interleaved in (False, True):
            t0 = time.perf_counter()
            fabric = two_leaves(servers, interleaved=interleaved)
            cfg = SimConfig(costs=SimCosts(fabric=fabric))
            blind = simulate(tr, servers, make_policy(name), cfg).summary
            aware = simulate(tr, servers, make_policy(name), cfg, placer=FabricPlacer(fabric)).summary
            layout = "interleaved" if interleaved else "by name"
            print(f"{name:11s} leaves {layout:11s}: avg JCT comm-blind {blind['avg_jct_s']:>10,.0f} s | comm-aware "
                  f"{aware['avg_jct_s']:>10,.0f} s ({aware['avg_jct_s'] / blind['avg_jct_s']:.3f}x); makespan "
                  f"{blind['makespan_s']:,.0f} / {aware['makespan_s']:,.0f} s  [{time.perf_counter() - t0:.0f} s]",
                  flush=True)


if __name__ == "__main__":
    main()
