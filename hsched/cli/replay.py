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
                                          "simulator's default (not yet close: 1.70x on 60 jobs of ed69ec, a "
                                          "restart at the replay's speedup being hours of trace time). Default: "
                                          "no job ever stopped, against hsched sim --no-time-sharing."),
        keep: Path | None = typer.Option(None, "--keep", help="Run the controller in this folder and keep it "
                                         "(default: a temporary one)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Drive the live controller with a trace on simulated nodes (a controller of its own: your queue is not
        touched) and print its metrics next to the simulator's for the same jobs, cluster and policy."""
        import tempfile

        from hsched.cli.sim import _load, _run_one, _servers
        from hsched.replay import KNOWLEDGE, live_summary, run_live
        from hsched.sim.cluster import cluster_nodes
        from hsched.sim.engine import default_rule

        if knowledge not in KNOWLEDGE:
            raise UserError(f"--knowledge {knowledge!r}: expected table or learn")
        # finite too: a nan --speedup passed `< 0` and reached time.sleep
        if max_jobs < 1 or not 0 < wall <= 86400 * 7 or not 0 <= speedup <= 1e9:
            raise UserError("--max-jobs must be >= 1, --wall > 0 (at most a week of seconds) and --speedup a finite "
                            "number >= 0")
        tr = _load(trace, throughputs, None, None, 0, 4.0, max_jobs)
        servers = _servers(None, cluster, gpus_per_node, tr.throughput.gpu_types)
        nodes = cluster_nodes(cluster, gpus_per_node)
        # with time-sharing, the simulator's default; without, the live controller moves jobs only through QoS
        # preemption: the simulator without time-sharing
        sim = _run_one(tr, servers, policy, 0.0, 360.0, 1.0, 1.0, default_rule(time_sharing=time_sharing)).summary
        from hsched.sched.registry import make_policy

        # the live quantum: the policy's own (hsched's 1.5 h), else the simulator's round
        quantum = float(getattr(make_policy(policy), "quantum_s", 360.0)) if time_sharing else None
        if sim.get("unschedulable_jobs"):
            raise UserError(f"{sim['unschedulable_jobs']} job(s) of this slice can never run on --cluster {cluster}")
        factor = speedup or max(1.0, float(sim["makespan_s"]) / wall)

        def say(msg: str) -> None:
            if not as_json:
                print(f"hsched replay: {msg}", file=sys.stderr)

        say(f"{len(tr.jobs)} jobs of {trace.name} on {cluster}, {factor:.0f}x: about "
            f"{float(sim['makespan_s']) / factor:.0f} s")
        import time

        t0 = time.monotonic()
        if keep is not None:
            live_jobs = run_live(keep.expanduser().absolute(), tr, nodes, factor, policy=policy, knowledge=knowledge,
                                 say=say, quantum_s=quantum)
        else:
            with tempfile.TemporaryDirectory(prefix="hsched-replay-") as tmp:
                live_jobs = run_live(Path(tmp) / "home", tr, nodes, factor, policy=policy, knowledge=knowledge,
                                     say=say, quantum_s=quantum)
        live = live_summary(live_jobs, factor)
        ratio = live["avg_jct_s"] / float(sim["avg_jct_s"]) if sim.get("avg_jct_s") else None
        out: dict[str, Any] = {"trace": str(trace), "cluster": cluster, "policy": policy, "knowledge": knowledge,
                               "time_sharing": time_sharing,
                               "jobs": len(tr.jobs), "speedup": factor, "wall_s": time.monotonic() - t0,
                               "live": live, "sim": {k: sim.get(k) for k in ("avg_jct_s", "p50_jct_s", "p95_jct_s",
                                                                             "makespan_s")},
                               "avg_jct_live_over_sim": ratio}
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
