"""`hsched sim`: replay a trace through the scheduling core, and `hsched sim compare` for several policies."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from hsched.cli._common import handle_errors, print_json
from hsched.errors import UserError

sim_app = typer.Typer(
    help="Replay a job trace in the simulator and print metrics next to the lower bounds.",
    invoke_without_command=True,
    no_args_is_help=False,
)

_TRACE = typer.Option(None, "--trace", help="Trace file: Gavel .trace, Tiresias CSV, or CSV with --columns.")
_THROUGHPUTS = typer.Option(None, "--throughputs", help="Gavel simulation_throughputs.json (default: beside trace).")
_COLUMNS = typer.Option(None, "--columns", help="CSV column mapping key=COL,... or a preset (helios, philly, acme).")
_FLEET = typer.Option(None, "--fleet", help="Fleet TOML whose nodes have \\[node.simulate] tables.")
_CLUSTER = typer.Option(None, "--cluster", help="Short fleet spec: v100:16,p100:16,k80:16 (optional @pcie).")
_GPN = typer.Option(4, "--gpus-per-node", help="GPUs per server for --cluster.")
_SPEEDS = typer.Option(
    None, "--speeds", metavar="TYPE=REL,...",
    help="Training speed relative to a V100 (1.0) of GPU types the throughput table lacks "
         "(tenstorrent-n300=0.8): the table's jobs run there at their table rates times that. A type that "
         "neither the table, the built-in prior nor the accelerator catalog knows needs one.")
_CKPT = typer.Option(0.0, "--checkpoint-cost", help="Seconds a preempted or moved job loses on resume.")
_ROUND = typer.Option(360.0, "--round-s", help="Round length (quantum) for time-sharing policies.")
_SPAN = typer.Option(1.0, "--span-factor", help="Throughput multiplier for a gang spanning servers.")
_PCIE = typer.Option(1.0, "--pcie-factor", help="Throughput multiplier for a gang on a server without NVLink.")
_MAX_JOBS = typer.Option(None, "--max-jobs", help="Replay only the first N jobs of the trace.")
_SYN = typer.Option(None, "--synthetic", help="Instead of --trace: N seeded synthetic jobs (Poisson, Philly-like).")
_SEED = typer.Option(0, "--seed", help="Seed for --synthetic, and for Gavel's shuffles with --round-mode gavel.")
_RATE = typer.Option(4.0, "--jobs-per-hour", help="Arrival rate for --synthetic.")
_JSON = typer.Option(False, "--json", help="Print one JSON document.")
_PLOT = typer.Option(None, "--plot", metavar="FILE.png",
                     help="Also draw JCT distributions and utilization over time to a PNG (needs hsched\\[plot]).")
_SETTINGS = typer.Option(None, "--settings", metavar="FILE",
                         help="hsched's settings.toml: its QoS table decides who may preempt whom "
                              "(default: the controller's default table); with --round-mode live, also its QoS "
                              "caps (max_gpus, max_gpus_per_user, max_jobs_per_user) and move_min_run_s.")
_ROUND_MODE = typer.Option(
    "event", "--round-mode", metavar="event|gavel|live",
    help="event: rounds on arrivals and completions (the controller's timing). gavel: Gavel's simulator "
         "reproduced: 360 s rounds only, and for fifo, las, las-hetero, ftf Gavel's own allocation over time "
         "fractions and per-type priorities (needs numpy for the LP policies: pip install 'hsched[gavel]'). "
         "live: event timing, but each round is the live controller's own pipeline: QoS caps (--settings), "
         "node constraints (--labels, the trace's constraint column), shared GPUs (its shared and "
         "gpu_memory_mib columns), the reservation and moves as they run live.")
_LABELS = typer.Option(
    None, "--labels", metavar="NODE_PREFIX=LABEL[+LABEL],...",
    help="With --round-mode live: node labels the trace's constraint column is matched against; every simulated "
         "node whose name starts with the prefix gets them (v100=fast+ib,k80-0=old).")
_TIME_SHARING = typer.Option(True, "--time-sharing/--no-time-sharing",
                             help="Let preemptive policies stop and move jobs that checkpoint (as Gavel does); "
                                  "off, only QoS preemption stops a job, as in the live controller.")
_LEARNED = typer.Option(
    False, "--learned",
    help="The policy learns throughputs from the jobs' own progress as the trace unfolds, starting from the "
         "accelerator table's relative speeds alone (as the live controller does), instead of reading the "
         "trace's throughput table (the oracle). Jobs still run at the table's rates.")
_LEARNED_PRIOR = typer.Option(
    "measured", "--learned-prior", metavar="measured|catalog",
    help="With --learned: how GPU types a job type has not run on are filled in. measured: the speed ratios "
         "measured so far between GPU types, over all job types (the live controller's rule); catalog: the "
         "accelerator table's relative speeds alone.")
_PREDICT = typer.Option(
    False, "--predict",
    help="Policies that need durations get predictions from the jobs completed so far (the median of the "
         "last runs of the job type, as hsched predicts) instead of the truth: *-oracle policies' remaining "
         "times, backfill's runtime estimates.")
_DATA_MODEL = typer.Option(
    None, "--data-model", metavar="synthetic[:K[:LO-HI]]",
    help="Jobs read datasets that live on servers, and a start where the data is not holds its GPUs for the copy: "
         "K datasets (default 16) of LO-HI GB (default 50-500, log-uniform), one per job type (or user), each on "
         "one server at first; drawn from --seed.")
_LOCALITY = typer.Option(
    None, "--locality", metavar="aware|ignore",
    help="With --data-model: aware places jobs on servers holding their data and waits for a busy holder when it "
         "is predicted to free before the copy would finish; ignore places as without data and pays every copy. "
         "Default aware; `compare` takes aware,ignore to run both.")
_LINK = typer.Option(10.0, "--data-link-gbps", help="With --data-model: link speed copies run at, Gbit/s.")
_QUOTA = typer.Option(1000.0, "--data-quota", metavar="GB",
                      help="With --data-model: GB of copies a server keeps (least recently used evicted past it).")
_PREFETCH = typer.Option(
    False, "--prefetch",
    help="With --data-model: after each round, copy the data of the first waiting jobs ahead (no GPUs held) to where "
         "each is predicted to start within --prefetch-horizon plus the copy's time, as the live controller's "
         "prefetch does; a job that starts there waits only for the rest. Default: off.")
# (a separate option, not --prefetch [HORIZON_S]: Typer has no option whose value may be left out)
_PREFETCH_HORIZON = typer.Option(
    900.0, "--prefetch-horizon", metavar="S",
    help="With --prefetch: how far ahead, in seconds, a job must be predicted to start for its data to be copied "
         "ahead (plus the copy's own time); the live setting prefetch_horizon_s, 900 by default.")
_SHARES = typer.Option(None, "--shares", metavar="USER=N,...",
                       help="Fair share between the trace's users (its user column): alice=2,bob=1; others hold 1.")
_SLURM_POOL = typer.Option(
    None, "--slurm-pool", metavar="TYPE:N[:QUEUE_WAIT_S[:GPUS_PER_NODE]]",
    help="Add a Slurm-backed pool of N GPUs that the policy sees as one server: jobs handed over reach Slurm's queue "
         "QUEUE_WAIT_S later (default 0) and Slurm's FIFO with EASY backfill starts them on its nodes (of "
         "GPUS_PER_NODE, default --gpus-per-node); they run there to their end. `compare` takes none,SPEC to run "
         "the workstations alone and with the pool.")


_SERVICE = typer.Option(None, "--service", metavar="TRACE.csv",
                        help="An inference service beside the training trace: its request trace (TIMESTAMP, "
                             "ContextTokens, GeneratedTokens: the Azure LLM trace's form), autoscaled.")
_SVC_SPEEDUP = typer.Option(10.0, "--service-speedup", help="With --service: replay it this many times faster.")
_SVC_SCALE = typer.Option(1.0, "--service-scale", help="With --service: multiply its arrivals (0.5: every other one).")
_SVC_REPLICAS = typer.Option("1-8", "--service-replicas", metavar="MIN-MAX", help="With --service: replica bounds.")
_SVC_GPR = typer.Option(1, "--service-gpus-per-replica", help="With --service: GPUs each replica takes.")
_SVC_SLO = typer.Option("p99=1500ms", "--service-slo", metavar="p99=DURATION", help="With --service: the objective.")
_SVC_TARGET = typer.Option(8.0, "--service-target-concurrency",
                           help="With --service: requests in flight per replica the autoscaler aims at.")
_SVC_QOS = typer.Option("prod", "--service-qos", help="With --service: the replicas' class (prod preempts training).")
_SVC_STATIC = typer.Option(None, "--service-static", metavar="N",
                           help="With --service: N replicas throughout (no autoscaling): the baseline.")
_SVC_INITIAL = typer.Option(None, "--service-initial", metavar="N",
                            help="With --service: replicas launched before the first request (default: MIN).")
_SVC_COLD = typer.Option("20s", "--service-cold-start", metavar="DURATION",
                         help="With --service: a replica's launch to ready.")
_SVC_WINDOW = typer.Option("60s", "--service-stable-window", metavar="DURATION",
                           help="With --service: the autoscaler's stable window (panic window 1/10, scale-down "
                                "delay 1/2 of it).")


def _service(path: Path | None, rule: Any, **options: Any) -> Any:
    """--service FILE and its options -> a hsched.sim.service.ServiceSim (None without --service)."""
    if path is None:
        for key in ("static", "initial"):
            if options.get(key) is not None:
                raise UserError(f"--service-{key} needs --service TRACE.csv")
        return None
    from hsched.sim.service import service_from_options

    try:
        text = path.read_text()
    except OSError as e:
        raise UserError(f"--service {path}: cannot read it ({e.strerror})") from None
    try:
        return service_from_options(text, str(path), qos_names=tuple(rule.qos_preempts) or ("prod",), **options)
    except ValueError as e:
        raise UserError(str(e)) from None


def _pools(spec: str | None, gpus_per_node: int, servers: Any) -> list[Any]:
    """The Slurm pools to run with (None: the workstations alone), from `--slurm-pool`."""
    from hsched.sim.slurm import POOL_NAME, parse_slurm_pool

    if spec is None:
        return [None]
    out: list[Any] = []
    for part in spec.split(","):
        pool = None if part.strip().lower() == "none" else parse_slurm_pool(part, gpus_per_node)
        if pool is not None and any(sv.name == POOL_NAME for sv in servers):
            raise UserError(f"--slurm-pool: a server is already named {POOL_NAME!r}; rename it in the fleet file")
        if pool not in out:
            out.append(pool)
    return out


def _data(tr: Any, servers: Any, data_model: str | None, locality: str | None, seed: int, link_gbps: float,
          quota_gb: float) -> tuple[Any, list[Any]]:
    """The data model (or None) and the locality modes to run (one None without a data model)."""
    from hsched.sched.locality import Locality
    from hsched.sim.data import parse_data_model, synthetic_data

    if data_model is None:
        if locality is not None:
            raise UserError("--locality needs --data-model (for instance --data-model synthetic)")
        return None, [None]
    modes: list[Any] = []
    for part in (locality or Locality.AWARE.value).split(","):
        try:
            mode = Locality(part.strip().lower())
        except ValueError:
            raise UserError(f"--locality {locality!r}: expected aware, ignore, or both as aware,ignore") from None
        if mode not in modes:
            modes.append(mode)
    return synthetic_data(tr, servers, parse_data_model(data_model), seed=seed, link_gbps=link_gbps,
                          quota_gb=quota_gb), modes


def _prefetch(on: bool, horizon_s: float, data: Any) -> float | None:
    """`--prefetch` and `--prefetch-horizon`: the horizon in seconds, or None when off."""
    if not horizon_s >= 0 or math.isinf(horizon_s):
        raise UserError(f"--prefetch-horizon {horizon_s:g}: expected seconds >= 0, such as --prefetch-horizon 900")
    if not on:
        return None
    if data is None:
        raise UserError("--prefetch needs --data-model (for instance --data-model synthetic)")
    return horizon_s


def _load(trace: Path | None, throughputs: Path | None, columns: str | None, synthetic: int | None, seed: int,
          rate: float, max_jobs: int | None) -> Any:
    from hsched.sim.trace import Trace, load_gavel_throughputs, load_trace
    from hsched.sim.trace import synthetic as make_synthetic

    if (trace is None) == (synthetic is None):
        raise UserError("hsched sim: give exactly one of --trace FILE or --synthetic N")
    if synthetic is not None:
        model = load_gavel_throughputs(throughputs) if throughputs else None
        tr = make_synthetic(synthetic, seed=seed, jobs_per_hour=rate, throughput=model)
    else:
        assert trace is not None
        tr = load_trace(trace, throughputs=throughputs, columns=columns)
    if max_jobs is not None:
        if max_jobs < 1:
            raise UserError(f"--max-jobs {max_jobs}: expected at least 1 job")
        tr = Trace(tr.jobs[:max_jobs], tr.throughput, tr.source, tr.work_unit, tr.rejected)
    return tr


def _servers(fleet: Path | None, cluster: str | None, gpus_per_node: int, known: tuple[str, ...]) -> Any:
    from hsched.sim.cluster import parse_cluster, servers_from_fleet

    if (fleet is None) == (cluster is None):
        raise UserError("hsched sim: give exactly one of --fleet FILE or --cluster SPEC (e.g. v100:16,p100:16,k80:16)")
    if fleet is not None:
        if not fleet.is_file():
            raise UserError(f"{fleet}: no such fleet file")
        return servers_from_fleet(fleet, known)
    assert cluster is not None
    return parse_cluster(cluster, gpus_per_node)


def _fit_speeds(tr: Any, servers: Any, speeds: str | None) -> tuple[Any, dict[str, float]]:
    """The trace with its throughput model made to know every GPU type of the fleet (hsched.sim.cluster)."""
    from hsched.sim.cluster import fit_speeds, parse_speeds

    model, used = fit_speeds(tr.throughput, servers, parse_speeds(speeds))
    return (replace(tr, throughput=model) if used else tr), used


def _policy(name: str) -> Any:
    from hsched.sched.registry import make_policy

    try:
        return make_policy(name.strip())
    except KeyError as e:
        raise UserError(f"--policy: {e.args[0]}") from None


def _progress_run(sim: Any, label: str) -> Any:
    """Run with a progress bar on stderr when stderr is a terminal (never on stdout: --json owns it)."""
    if not sys.stderr.isatty():
        return sim.run()
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn(label), BarColumn(), TextColumn("{task.completed}/{task.total} jobs"),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=len(sim.trace.jobs))
        sim.progress = lambda done, total: bar.update(task, completed=done, total=total)
        return sim.run()


def _rule(settings: Path | None, time_sharing: bool) -> Any:
    """The live controller's preemption rule, from its settings file when given."""
    from hsched.config import load_settings
    from hsched.sim.engine import default_rule

    if settings is not None and not settings.is_file():
        raise UserError(f"--settings {settings}: no such file")
    return default_rule(load_settings(settings) if settings is not None else None, time_sharing=time_sharing)


def _check_round_mode(round_mode: str) -> str:
    mode = round_mode.strip().lower()
    if mode not in ("event", "gavel", "live"):
        raise UserError(f"--round-mode {round_mode!r}: expected event, gavel or live")
    return mode


def _live(mode: str, settings: Path | None, labels: str | None, servers: Any, data: Any, pools: list[Any]) -> Any:
    """With --round-mode live: what the live round reads beyond the default rounds (hsched.sim.live.LiveInput)."""
    if mode != "live":
        if labels:
            raise UserError("--labels: node labels are read by the live round alone; add --round-mode live")
        return None
    from hsched.config import Settings, load_settings
    from hsched.sched.limits import QosLimits
    from hsched.sim.live import LiveInput, parse_labels

    if data is not None or any(p is not None for p in pools):
        raise UserError("--round-mode live does not model --data-model or --slurm-pool yet; drop them, or use "
                        "--round-mode event")
    conf = load_settings(settings) if settings is not None else Settings()
    return LiveInput(parse_labels(labels or "", [s.name for s in servers]), QosLimits.from_qos(conf.qos),
                     conf.move_min_run_s)


def _check_learned_prior(learned_prior: str) -> str:
    prior = learned_prior.strip().lower()
    if prior not in ("catalog", "measured"):
        raise UserError(f"--learned-prior {learned_prior!r}: expected catalog or measured")
    return prior


def _shares(text: str | None) -> dict[str, float]:
    """--shares alice=2,bob=1: each user's shares (a positive number); one line naming the option otherwise."""
    out: dict[str, float] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        user, sep, n = part.partition("=")
        try:
            value = float(n)
        except ValueError:
            value = -1.0
        if not sep or not user.strip() or not 0 < value < float("inf"):
            raise UserError(f"--shares {text!r}: expected USER=N pairs with N > 0, such as alice=2,bob=1")
        out[user.strip()] = value
    return out


def _run_one(tr: Any, servers: Any, policy_name: str, checkpoint_cost: float, round_s: float, span: float,
             pcie: float, rule: Any, round_mode: str = "event", seed: int = 0, *, learned: bool = False,
             learned_prior: str = "measured", predict: bool = False, data: Any = None, locality: Any = None,
             pool: Any = None, prefetch_s: float | None = None, shares: dict[str, float] | None = None,
             live: Any = None, service: Any = None) -> Any:
    from hsched.sim.bounds import MAX_DURATION_S, MAX_ROUND_S, MIN_ROUND_S, check
    from hsched.sim.engine import SimConfig, SimCosts, Simulator
    from hsched.sim.gavel import GAVEL_POLICIES

    # finite, and in a range (a nan --round-s made every round "not yet", for ever)
    check(checkpoint_cost, "--checkpoint-cost", "seconds", low=0, high=MAX_DURATION_S)
    check(round_s, "--round-s", "seconds", low=MIN_ROUND_S, high=MAX_ROUND_S)
    check(span, "--span-factor", "", low=0, high=1e6, above=True)
    check(pcie, "--pcie-factor", "", low=0, high=1e6, above=True)
    name = policy_name.strip()
    if service is not None and (round_mode != "event" or learned or data is not None or pool is not None):
        raise UserError("--service runs with --round-mode event, without --learned, --data-model or --slurm-pool "
                        "(not modelled together yet)")
    if round_mode == "gavel" and name in GAVEL_POLICIES:
        if pool is not None:
            raise UserError(f"--round-mode gavel replays Gavel's own allocation for {name}, which has no Slurm pool; "
                            f"--slurm-pool applies to hsched's rounds (--round-mode event)")
        if data is not None:
            raise UserError(f"--round-mode gavel replays Gavel's own allocation for {name}, which places no data; "
                            f"--data-model applies to hsched's rounds (--round-mode event)")
        if learned or predict:
            raise UserError(f"--round-mode gavel replays Gavel's own allocation for {name}, which reads the "
                            f"throughput table; --learned and --predict apply to hsched's rounds (--round-mode "
                            f"event, or policies Gavel does not have)")
        result = _run_gavel(tr, servers, name, checkpoint_cost, round_s, span, pcie, seed)
        result.summary["throughputs"], result.summary["durations"] = "table", "true"
        return result
    cfg = SimConfig(round_s=round_s, costs=SimCosts(checkpoint_cost, span, pcie), preempt=rule,
                    round_mode=round_mode, learned=learned, refine_prior=learned_prior == "measured",
                    predict=predict, data=data, slurm_pool=pool, prefetch_s=prefetch_s, shares=shares or {},
                    live=live)
    if locality is not None:
        cfg = replace(cfg, locality=locality)
    chosen = _policy(name)
    if round_mode == "live" and chosen.clairvoyant:
        raise UserError(f"--round-mode live --policy {name}: the live round knows no job durations; pick a policy "
                        f"that does not need them (see --list-policies)")
    sim = Simulator(tr, servers, chosen, cfg, service=service)
    result = _progress_run(sim, _label(name, locality, pool))
    result.summary["round_mode"] = round_mode
    result.summary["gavel_allocation"] = False
    if learned:
        result.summary["learned_prior"] = learned_prior
    return result


def _label(name: str, locality: Any, pool: Any) -> str:
    """The run's name in the table: the policy, its locality mode, its Slurm pool."""
    return (name + (f" ({locality})" if locality is not None else "")
            + (f" +slurm {pool.gpu_type}:{pool.gpus}" if pool is not None else ""))


def _run_gavel(tr: Any, servers: Any, name: str, checkpoint_cost: float, round_s: float, span: float, pcie: float,
               seed: int) -> Any:
    """Gavel's own mechanism (hsched.sim.gavel) for the policies it has."""
    from hsched.sim.gavel import GavelConfig, GavelSimulator

    if checkpoint_cost or span != 1.0 or pcie != 1.0:
        raise UserError(f"--round-mode gavel replays Gavel's simulator for {name}, which has no checkpoint, span or "
                        f"PCIe cost; leave --checkpoint-cost, --span-factor and --pcie-factor at their defaults")
    if name != "fifo":
        try:
            import numpy  # noqa: F401 - only to say what is missing before minutes of simulating
        except ImportError:
            raise UserError(f"--round-mode gavel --policy {name} solves Gavel's allocation with numpy; "
                            f"install it: pip install 'hsched[gavel]'") from None
    capacity: dict[str, int] = {}
    for sv in servers:
        capacity[sv.gpu_type] = capacity.get(sv.gpu_type, 0) + len(sv.devices)
    sim = GavelSimulator(tr, capacity, name, GavelConfig(round_s=round_s, seed=seed))
    result = _progress_run(sim, name)
    result.summary["round_mode"] = "gavel"
    result.summary["gavel_allocation"] = True
    return result


_SHOWN = (
    ("jobs", "jobs", "{:d}"), ("unschedulable_jobs", "unschedulable", "{:d}"), ("avg_jct_s", "avg JCT s", "{:,.0f}"),
    ("p50_jct_s", "p50", "{:,.0f}"), ("p99_jct_s", "p99", "{:,.0f}"), ("makespan_s", "makespan s", "{:,.0f}"),
    ("utilization", "util", "{:.3f}"), ("preemptions", "preempt", "{:d}"), ("avg_jct_over_bound", "JCT/LB", "{:.3f}"),
    ("makespan_over_bound", "mksp/LB", "{:.3f}"), ("max_ftf_rho", "max rho", "{:.2f}"), ("wall_s", "wall s", "{:.2f}"),
)


_DATA_SHOWN = (
    ("data_gb_copied", "copied GB", "{:,.0f}"), ("data_copies", "copies", "{:d}"),
    ("data_hit_rate", "hit rate", "{:.3f}"), ("data_copy_gpu_hours", "copy GPU h", "{:,.1f}"),
    ("data_waits", "waits", "{:d}"),
)

_PREFETCH_SHOWN = (
    ("data_prefetches", "prefetches", "{:d}"), ("data_prefetch_gb", "prefetched GB", "{:,.0f}"),
    ("data_prefetch_hits", "pf hits", "{:d}"), ("data_prefetch_wasted", "pf wasted", "{:d}"),
)

_POOL_SHOWN = (
    ("workstation_avg_jct_s", "ws JCT s", "{:,.0f}"), ("pool_jobs", "pool jobs", "{:d}"),
    ("pool_avg_jct_s", "pool JCT s", "{:,.0f}"), ("slurm_avg_wait_s", "slurm wait s", "{:,.0f}"),
    ("slurm_backfilled", "backfilled", "{:d}"),
)


def _check_plot(plot: Path | None) -> None:
    """Before the simulation: a missing matplotlib or folder should not cost minutes of simulating first."""
    if plot is not None:
        from hsched.sim.plot import check_target  # lazy: matplotlib only when a plot is asked for

        check_target(plot)


def _plot(results: list[Any], plot: Path) -> None:
    from hsched.sim.plot import plot_comparison

    s = results[0].summary
    cluster = ",".join(f"{t}:{n}" for t, n in s["cluster"].items())
    plot_comparison(results, plot, f"{s['trace']} on {cluster}")


def _table(summaries: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    first = summaries[0]
    knowledge = ""
    if first.get("throughputs") == "learned" or first.get("durations") == "predicted":
        knowledge = (f"  throughputs {first.get('throughputs')}"
                     + (f" ({first.get('learned_prior', 'catalog')} prior)" if first.get("throughputs") == "learned"
                        else "")
                     + f", durations {first.get('durations')}")
    if "data_model" in first:
        knowledge += f"  data {first['data_model']}"
        if first.get("data_prefetch_horizon_s") is not None:
            knowledge += f" prefetch={first['data_prefetch_horizon_s']:g}s"
    table = Table(title=f"{first['trace']} on {first['cluster']}  (lower bounds: avg JCT "
                        f"{first['lower_bound_avg_jct_s']:,.0f} s, makespan {first['lower_bound_makespan_s']:,.0f} s)"
                        f"{knowledge}")
    table.add_column("policy")
    prefetching = first.get("data_prefetch_horizon_s") is not None
    shown = (_SHOWN + (_DATA_SHOWN if "locality" in first else ()) + (_PREFETCH_SHOWN if prefetching else ())
             + (_POOL_SHOWN if any("slurm_pool" in s for s in summaries) else ()))
    for _, head, _ in shown:
        table.add_column(head, justify="right")
    for s in summaries:
        label = s["policy"] + (f" ({s['locality']})" if "locality" in s else "")
        if "slurm_pool" in s:
            label += f" +slurm {s['slurm_pool']}"
        table.add_row(label, *[fmt.format(s[k]) if s.get(k) is not None else "N/A" for k, _, fmt in shown])
    # wide enough for every column even when piped (rich assumes 80 columns off a terminal)
    wide = 40 * ("locality" in first) + 40 * prefetching + 50 * any("slurm_pool" in s for s in summaries)
    Console(width=max(Console().width, 170 + wide)).print(table)
    if first.get("prior_rate_jobs"):
        sys.stderr.write(f"hsched: {first['prior_rate_jobs']} job(s) have no throughput of their own in the table; "
                         f"they run at the table's scaling prior for their GPU count (or the GPU-type prior)\n")
    if first["unschedulable_jobs"]:
        ids = ", ".join(str(u["id"]) for u in first["unschedulable"][:20])
        more = " ..." if first["unschedulable_jobs"] > 20 else ""
        sys.stderr.write(f"hsched: {first['unschedulable_jobs']} job(s) this cluster can never run "
                         f"(ids {ids}{more}; see --json for reasons)\n")


@sim_app.callback()
@handle_errors
def sim(
    ctx: typer.Context,
    trace: Path | None = _TRACE,
    throughputs: Path | None = _THROUGHPUTS,
    columns: str | None = _COLUMNS,
    fleet: Path | None = _FLEET,
    cluster: str | None = _CLUSTER,
    gpus_per_node: int = _GPN,
    speeds: str | None = _SPEEDS,
    policy: str = typer.Option("hsched", "--policy", help="Policy name (see --list-policies)."),
    checkpoint_cost: float = _CKPT,
    round_s: float = _ROUND,
    span_factor: float = _SPAN,
    pcie_factor: float = _PCIE,
    max_jobs: int | None = _MAX_JOBS,
    synthetic: int | None = _SYN,
    seed: int = _SEED,
    jobs_per_hour: float = _RATE,
    jobs_csv: Path | None = typer.Option(None, "--jobs-csv", help="Write one CSV row per finished job."),
    list_policies: bool = typer.Option(False, "--list-policies", help="List policies with one line each."),
    as_json: bool = _JSON,
    plot: Path | None = _PLOT,
    settings: Path | None = _SETTINGS,
    time_sharing: bool = _TIME_SHARING,
    round_mode: str = _ROUND_MODE,
    learned: bool = _LEARNED,
    learned_prior: str = _LEARNED_PRIOR,
    predict: bool = _PREDICT,
    data_model: str | None = _DATA_MODEL,
    locality: str | None = _LOCALITY,
    data_link_gbps: float = _LINK,
    data_quota: float = _QUOTA,
    prefetch: bool = _PREFETCH,
    prefetch_horizon: float = _PREFETCH_HORIZON,
    slurm_pool: str | None = _SLURM_POOL,
    shares: str | None = _SHARES,
    labels: str | None = _LABELS,
    service: Path | None = _SERVICE,
    service_speedup: float = _SVC_SPEEDUP,
    service_scale: float = _SVC_SCALE,
    service_replicas: str = _SVC_REPLICAS,
    service_gpus_per_replica: int = _SVC_GPR,
    service_slo: str = _SVC_SLO,
    service_target_concurrency: float = _SVC_TARGET,
    service_qos: str = _SVC_QOS,
    service_static: int | None = _SVC_STATIC,
    service_initial: int | None = _SVC_INITIAL,
    service_cold_start: str = _SVC_COLD,
    service_stable_window: str = _SVC_WINDOW,
) -> None:
    """Replay a trace under one policy (or run `hsched sim compare` for several)."""
    if ctx.invoked_subcommand is not None:
        return
    if list_policies:
        _list_policies(as_json)
        return
    _check_plot(plot)
    mode = _check_round_mode(round_mode)
    prior = _check_learned_prior(learned_prior)
    per_user = _shares(shares)
    rule = _rule(settings, time_sharing)
    tr = _load(trace, throughputs, columns, synthetic, seed, jobs_per_hour, max_jobs)
    servers = _servers(fleet, cluster, gpus_per_node, tr.throughput.gpu_types)
    tr, speeds_used = _fit_speeds(tr, servers, speeds)
    data, modes = _data(tr, servers, data_model, locality, seed, data_link_gbps, data_quota)
    prefetch_s = _prefetch(prefetch, prefetch_horizon, data)
    if len(modes) > 1:
        raise UserError(f"--locality {locality!r}: `hsched sim` runs one mode; `hsched sim compare` runs several")
    pools = _pools(slurm_pool, gpus_per_node, servers)
    if len(pools) > 1:
        raise UserError(f"--slurm-pool {slurm_pool!r}: `hsched sim` runs one fleet; `hsched sim compare` runs several")
    if data is not None and pools[0] is not None:
        raise UserError("--slurm-pool with --data-model: the pool does not model data yet; give one of them")
    live = _live(mode, settings, labels, servers, data, pools)
    svc = _service(service, rule, speedup=service_speedup, scale=service_scale, replicas=service_replicas,
                   gpus_per_replica=service_gpus_per_replica, slo=service_slo,
                   target_concurrency=service_target_concurrency, qos=service_qos, static=service_static,
                   cold_start=service_cold_start, stable_window=service_stable_window, initial=service_initial)
    result = _run_one(tr, servers, policy, checkpoint_cost, round_s, span_factor, pcie_factor, rule, mode, seed,
                      learned=learned, learned_prior=prior, predict=predict, data=data, locality=modes[0],
                      pool=pools[0], prefetch_s=prefetch_s, shares=per_user, live=live, service=svc)
    if jobs_csv is not None:
        result.write_jobs_csv(jobs_csv)
    summary = dict(result.summary)
    summary["rejected_rows"] = len(tr.rejected)
    if speeds_used:
        summary["speeds"] = speeds_used
    if plot is not None:
        _plot([result], plot)
        summary["plot"] = str(plot)
    if as_json:
        print_json(summary)
    else:
        _table([summary])
        if "service" in summary:
            from hsched.sim.service import describe

            print("\n".join(describe(summary["service"])))
        if plot is not None:
            print(f"plot: {plot}")


@sim_app.command("compare")
@handle_errors
def compare(
    trace: Path | None = _TRACE,
    throughputs: Path | None = _THROUGHPUTS,
    columns: str | None = _COLUMNS,
    fleet: Path | None = _FLEET,
    cluster: str | None = _CLUSTER,
    gpus_per_node: int = _GPN,
    speeds: str | None = _SPEEDS,
    policy: str = typer.Option("fifo,las,las-hetero,hsched", "--policy", help="Comma-separated policy names."),
    checkpoint_cost: float = _CKPT,
    round_s: float = _ROUND,
    span_factor: float = _SPAN,
    pcie_factor: float = _PCIE,
    max_jobs: int | None = _MAX_JOBS,
    synthetic: int | None = _SYN,
    seed: int = _SEED,
    jobs_per_hour: float = _RATE,
    as_json: bool = _JSON,
    plot: Path | None = _PLOT,
    settings: Path | None = _SETTINGS,
    time_sharing: bool = _TIME_SHARING,
    round_mode: str = _ROUND_MODE,
    learned: bool = _LEARNED,
    learned_prior: str = _LEARNED_PRIOR,
    predict: bool = _PREDICT,
    data_model: str | None = _DATA_MODEL,
    locality: str | None = _LOCALITY,
    data_link_gbps: float = _LINK,
    data_quota: float = _QUOTA,
    prefetch: bool = _PREFETCH,
    prefetch_horizon: float = _PREFETCH_HORIZON,
    slurm_pool: str | None = _SLURM_POOL,
    labels: str | None = _LABELS,
) -> None:
    """Run several policies on the same trace and fleet; print them side by side with the bounds."""
    names = [p.strip() for p in policy.split(",") if p.strip()]
    if not names:
        raise UserError("--policy: give at least one policy name, comma-separated")
    for n in names:
        _policy(n)  # fail on a typo before spending minutes on the others
    _check_plot(plot)
    mode = _check_round_mode(round_mode)
    prior = _check_learned_prior(learned_prior)
    rule = _rule(settings, time_sharing)
    tr = _load(trace, throughputs, columns, synthetic, seed, jobs_per_hour, max_jobs)
    servers = _servers(fleet, cluster, gpus_per_node, tr.throughput.gpu_types)
    tr, speeds_used = _fit_speeds(tr, servers, speeds)
    data, modes = _data(tr, servers, data_model, locality, seed, data_link_gbps, data_quota)
    prefetch_s = _prefetch(prefetch, prefetch_horizon, data)
    pools = _pools(slurm_pool, gpus_per_node, servers)
    if data is not None and any(p is not None for p in pools):
        raise UserError("--slurm-pool with --data-model: the pool does not model data yet; give one of them")
    live = _live(mode, settings, labels, servers, data, pools)
    results = [_run_one(tr, servers, n, checkpoint_cost, round_s, span_factor, pcie_factor, rule, mode, seed,
                        learned=learned, learned_prior=prior, predict=predict, data=data, locality=loc, pool=pool,
                        prefetch_s=prefetch_s, live=live)
               for n in names for loc in modes for pool in pools]
    summaries = [dict(r.summary, **({"speeds": speeds_used} if speeds_used else {})) for r in results]
    if plot is not None:
        _plot(results, plot)
    if as_json:
        doc: dict[str, Any] = {
            "runs": summaries,
            "lower_bound_avg_jct_s": summaries[0]["lower_bound_avg_jct_s"],
            "lower_bound_makespan_s": summaries[0]["lower_bound_makespan_s"],
        }
        if plot is not None:
            doc["plot"] = str(plot)
        print_json(doc)
    else:
        _table(summaries)
        if plot is not None:
            print(f"plot: {plot}")


def _list_policies(as_json: bool) -> None:
    from hsched.sched.registry import make_policy, policy_names

    rows = []
    for name in policy_names():
        doc = (type(make_policy(name)).__doc__ or "").strip().split("\n\n")[0]
        rows.append({"name": name, "clairvoyant": name.endswith("-oracle"), "description": " ".join(doc.split())})
    if as_json:
        print_json(rows)
    else:
        for r in rows:
            print(f"{r['name']:12s} {r['description']}")


def register(app: typer.Typer) -> None:
    """Add `hsched sim` and `hsched sim compare` to the app."""
    app.add_typer(sim_app, name="sim")
