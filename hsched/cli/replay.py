"""`hsched replay`: a trace through the live controller, next to the simulator's figures for it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from hsched.cli._common import handle_errors, print_json
from hsched.errors import UserError


def register(app: typer.Typer) -> None:
    @app.command()
    @handle_errors
    def replay(
        trace: Path = typer.Argument(..., help="Trace file: Gavel .trace, Tiresias CSV, or CSV with --columns."),
        throughputs: Path | None = typer.Option(None, "--throughputs",
                                                help="Gavel simulation_throughputs.json (default: beside the trace)."),
        cluster: str = typer.Option("v100:4,p100:4,k80:4", "--cluster",
                                    help="The simulated fleet: TYPE:COUNT,... (as hsched sim's)."),
        gpus_per_node: int = typer.Option(4, "--gpus-per-node", help="GPUs per node for --cluster."),
        max_jobs: int = typer.Option(60, "--max-jobs", help="Replay the first N jobs of the trace."),
        speedup: float = typer.Option(0.0, "--speedup", help="Trace seconds per wall second (default: what makes "
                                      "the simulated makespan last --wall seconds)."),
        wall: float = typer.Option(120.0, "--wall", help="Wall seconds the replay should take, for the default "
                                   "--speedup."),
        policy: str = typer.Option("hsched", "--policy", help="The live controller's (and the simulator's) policy."),
        knowledge: str = typer.Option("table", "--knowledge", help="table: the controller starts knowing the "
                                      "trace's throughputs (as the simulator does); learn: from its prior, "
                                      "learning from the jobs' progress."),
        time_sharing: bool = typer.Option(False, "--time-sharing/--no-time-sharing",
                                          help="Jobs checkpoint once at the end of their first quantum, which "
                                          "proves they can, so the controller time-shares them, against the "
                                          "simulator with time-sharing and --checkpoint-cost the restart cost "
                                          "(--restart-cost) times the speedup; its default's figures are shown "
                                          "too. Default: no job ever stopped, against hsched sim "
                                          "--no-time-sharing."),
        restart_cost: float = typer.Option(0.0, "--restart-cost", help="With --time-sharing: wall seconds a "
                                           "stand-in job's checkpoint and restart costs here (default: 0.35, "
                                           "measured on a loaded 2-core machine); the simulator charges it times "
                                           "the speedup."),
        keep: Path | None = typer.Option(None, "--keep", help="Run the controller in this folder and keep it "
                                         "(default: a temporary one)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Drive the live controller with a trace on simulated nodes (a controller of its own: your queue is not
        touched) and print its metrics next to the simulator's for the same jobs, cluster and policy."""
        import tempfile

        from hsched.cli.sim import _load, _run_one, _servers
        from hsched.replay import KNOWLEDGE, RESTART_WALL_S, SIM_ROUND_S, live_quantum_s, live_summary, run_live
        from hsched.sched.registry import make_policy
        from hsched.sim.cluster import cluster_nodes
        from hsched.sim.engine import default_rule

        if knowledge not in KNOWLEDGE:
            raise UserError(f"--knowledge {knowledge!r}: expected table or learn")
        # finite too: a nan --speedup passed `< 0` and reached time.sleep
        if max_jobs < 1 or not 0 < wall <= 86400 * 7 or not 0 <= speedup <= 1e9:
            raise UserError("--max-jobs must be >= 1, --wall > 0 (at most a week of seconds) and --speedup a finite "
                            "number >= 0")
        if not 0 <= restart_cost <= 3600:
            raise UserError("--restart-cost must be a number of wall seconds from 0 to 3600 (0: the default, 0.35)")
        tr = _load(trace, throughputs, None, None, 0, 4.0, max_jobs)
        servers = _servers(None, cluster, gpus_per_node, tr.throughput.gpu_types)
        nodes = cluster_nodes(cluster, gpus_per_node)
        # with time-sharing, the simulator's default; without, the live controller moves jobs only through QoS
        # preemption: the simulator without time-sharing
        rule = default_rule(time_sharing=time_sharing)
        sim = default = _run_one(tr, servers, policy, 0.0, SIM_ROUND_S, 1.0, 1.0, rule).summary
        if default.get("unschedulable_jobs"):
            raise UserError(f"{default['unschedulable_jobs']} job(s) of this slice can never run on --cluster "
                            f"{cluster}")
        factor = speedup or max(1.0, float(default["makespan_s"]) / wall)
        quantum = cost = None
        if time_sharing:
            # a checkpoint and restart costs the stand-in job its wall seconds whatever the speedup: at 70,000x,
            # 0.35 s is 25,000 of the trace's seconds, so the simulator is told that cost, and both sides keep a
            # (re)started job as long as the policy does under it (`live_quantum_s`)
            cost = (restart_cost or RESTART_WALL_S) * factor
            quantum = live_quantum_s(make_policy(policy), cost)
            sim = _run_one(tr, servers, policy, cost, SIM_ROUND_S, 1.0, 1.0, rule).summary

        def say(msg: str) -> None:
            if not as_json:
                print(f"hsched replay: {msg}", file=sys.stderr)

        say(f"{len(tr.jobs)} jobs of {trace.name} on {cluster}, {factor:.0f}x: about "
            f"{float(sim['makespan_s']) / factor:.0f} s")
        import time

        t0 = time.monotonic()
        if keep is not None:
            live_jobs = run_live(keep.expanduser().absolute(), tr, nodes, factor, policy=policy, knowledge=knowledge,
                                 say=say, quantum_s=quantum,
                                 restart_cost_s=cost or 0.0)
        else:
            with tempfile.TemporaryDirectory(prefix="hsched-replay-") as tmp:
                live_jobs = run_live(Path(tmp) / "home", tr, nodes, factor, policy=policy, knowledge=knowledge,
                                     say=say, quantum_s=quantum, restart_cost_s=cost or 0.0)
        live = live_summary(live_jobs, factor)
        ratio = live["avg_jct_s"] / float(sim["avg_jct_s"]) if sim.get("avg_jct_s") else None
        out: dict[str, Any] = {"trace": str(trace), "cluster": cluster, "policy": policy, "knowledge": knowledge,
                               "time_sharing": time_sharing,
                               "jobs": len(tr.jobs), "speedup": factor, "wall_s": time.monotonic() - t0,
                               "live": live, "sim": {k: sim.get(k) for k in ("avg_jct_s", "p50_jct_s", "p95_jct_s",
                                                                             "makespan_s", "preemptions",
                                                                             "migrations")},
                               "avg_jct_live_over_sim": ratio,
                               "makespan_live_over_sim": live["makespan_s"] / float(sim["makespan_s"])}
        if time_sharing:
            # what the simulator was told (the restart's cost in the trace's seconds) and its default (free restarts)
            out["restart_cost_s"] = cost
            out["sim_default"] = {k: default.get(k) for k in ("avg_jct_s", "p50_jct_s", "p95_jct_s", "makespan_s")}
            out["avg_jct_live_over_sim_default"] = live["avg_jct_s"] / float(default["avg_jct_s"])
            out["makespan_live_over_sim_default"] = live["makespan_s"] / float(default["makespan_s"])
        if as_json:
            print_json(out)
            return
        print(f"{'':<12}{'live':>14}{'simulator':>14}")
        for key, label in (("avg_jct_s", "avg JCT"), ("p50_jct_s", "p50 JCT"), ("p95_jct_s", "p95 JCT"),
                           ("makespan_s", "makespan")):
            s = sim.get(key)
            print(f"{label:<12}{live[key]:>13.0f}s{'' if s is None else f'{float(s):>13.0f}s'}")
        if ratio is not None:
            print(f"live avg JCT / simulated: {ratio:.3f} ({len(tr.jobs)} jobs, {out['wall_s']:.0f} s of wall time)")
        if time_sharing:
            print(f"(the simulator charged {cost:.0f} s a restart; with free restarts, its default: avg JCT "
                  f"{float(default['avg_jct_s']):.0f}s, makespan {float(default['makespan_s']):.0f}s; live / that: "
                  f"{out['avg_jct_live_over_sim_default']:.3f} and {out['makespan_live_over_sim_default']:.3f})")
