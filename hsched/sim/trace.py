"""Trace loaders: Gavel (7 and 10 columns), Tiresias CSV, a generic CSV with a column mapping, synthetic.

Every loader returns a `Trace`: jobs as frozen records plus the throughput model that says how fast each
job runs on each GPU type. Work is in the trace's own unit: steps for Gavel (rates are steps per second),
seconds on a reference GPU type for traces that give durations. Rows that cannot become jobs are kept in
`Trace.rejected` with a reason, so nothing is dropped silently.
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

from hsched.errors import UserError
from hsched.model import DEFAULT_QOS
from hsched.sched.throughput import ThroughputModel
from hsched.sim.bounds import (
    MAX_DURATION_S,
    MAX_JOB_GPUS,
    MAX_JOBS,
    MAX_SPAN_S,
    MAX_STEPS,
    check,
    number,
    whole,
)


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace. `work` is the truth the simulator runs down; no policy ever sees it."""

    id: int
    job_type: str
    gpus: int
    arrival_s: float
    work: float
    name: str = ""
    user: str = ""
    qos: str = DEFAULT_QOS
    priority: int = 0
    time_limit_s: float | None = None
    max_servers: int | None = None
    checkpointable: bool = True
    """Resumes from a checkpoint when stopped, as Gavel's jobs do: the round may time-share it, and a stop
    loses nothing (but the checkpoint cost). False: never time-shared (as the live controller treats its
    jobs); a QoS preemption makes it start over."""
    constraint: str = ""
    """`--constraint`: the node labels it needs (read by the live round mode alone: hsched.sim.live)."""
    shared: bool = False
    """`--shared`: it takes `gpu_memory_mib` of one GPU that other shared jobs use too (live round mode alone)."""
    gpu_memory_mib: int | None = None
    """`--gpu-memory`: the GPU memory it needs (live round mode alone; a shared job's share of its GPU)."""


@dataclass(frozen=True, slots=True)
class Trace:
    jobs: tuple[TraceJob, ...]
    throughput: ThroughputModel
    source: str
    work_unit: str = "steps"
    rejected: tuple[tuple[str, str], ...] = field(default=())
    """(row or job name, reason) for rows that could not become jobs."""


GAVEL_THROUGHPUTS = "simulation_throughputs.json"
PRIORITY_BOUND = 1e9


def find_gavel_throughputs(trace_path: Path) -> Path | None:
    """Gavel keeps the table beside the seed folders: look in the trace's folder and two above it."""
    for d in (trace_path.parent, *list(trace_path.parents)[1:3]):
        cand = d / GAVEL_THROUGHPUTS
        if cand.is_file():
            return cand
    return None


def load_gavel_throughputs(path: Path) -> ThroughputModel:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise UserError(f"{path}: cannot read the throughput table ({e.strerror}); pass --throughputs FILE") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: not valid JSON ({e.msg}); expected Gavel's "
                        f"{GAVEL_THROUGHPUTS}") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise UserError(f"{path}: expected {{gpu_type: {{\"('job type', scale)\": {{\"null\": rate}}}}}}")
    # JSON takes NaN and Infinity: a rate of either made jobs finish at once or never
    for gpu_type, entries in data.items():
        for key, val in entries.items():
            alone = val.get("null") if isinstance(val, dict) else val
            if isinstance(alone, int | float) and not isinstance(alone, bool):
                check(alone, f"{path}", f"{gpu_type} {key} rate", low=0, high=1e12)
    return ThroughputModel.from_gavel_json(data)


def load_gavel(path: Path, throughputs: Path | None = None) -> Trace:
    """Gavel's tab-separated trace, 7 columns (the MSR/Philly-derived traces) or 10 (Gavel's own):

    7:  job_type, command, num_steps_arg, needs_data_dir, total_steps, arrival_time, scale_factor
    10: job_type, command, working_directory, num_steps_arg, needs_data_dir, total_steps, scale_factor,
        priority_weight, SLO, arrival_time
    """
    tp_path = throughputs or find_gavel_throughputs(path)
    if tp_path is None:
        raise UserError(f"{path}: no {GAVEL_THROUGHPUTS} beside the trace; pass --throughputs FILE")
    model = load_gavel_throughputs(tp_path)
    jobs: list[TraceJob] = []
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise UserError(f"{path}: cannot read the trace ({e.strerror})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        cols = line.split("\t")
        where = f"{path}:{n}"
        if len(cols) == 7:
            job_type, steps, arrival, scale = cols[0], cols[4], cols[5], cols[6]
            priority = 0
        elif len(cols) == 10:
            job_type, steps, scale, arrival = cols[0], cols[5], cols[6], cols[9]
            priority = int(number(cols[7], where, "priority_weight", low=-PRIORITY_BOUND, high=PRIORITY_BOUND))
        else:
            raise UserError(f"{where}: expected 7 or 10 tab-separated columns, found {len(cols)}")
        # each field finite and in range (hsched.sim.bounds): a nan step count never finishes
        gpus = whole(scale, where, "scale_factor", low=1, high=MAX_JOB_GPUS)
        work = number(steps, where, "total_steps", low=0, high=MAX_STEPS, above=True)
        at = number(arrival, where, "arrival_time", low=0, high=MAX_SPAN_S)
        jobs.append(TraceJob(len(jobs), job_type.strip(), gpus, at, work, name=f"{path.stem}:{n}",
                             priority=priority))
    return Trace(tuple(jobs), model, str(path), "steps")


def load_tiresias(path: Path, reference_type: str = "v100") -> Trace:
    """Tiresias CSV: job_id,num_gpu,submit_time,iterations,model_name,duration,interval (seconds).

    Durations were measured on one GPU type; they become seconds of work on `reference_type`, and other
    types run at the prior's relative speed.
    """
    model = ThroughputModel(reference_type=reference_type)
    rows = _read_csv(path)
    need = ("job_id", "num_gpu", "submit_time", "duration")
    _require_columns(path, rows, need, "Tiresias columns: job_id,num_gpu,submit_time,...,duration")
    jobs: list[TraceJob] = []
    rejected: list[tuple[str, str]] = []
    for n, r in enumerate(rows, 2):
        where = f"{path}:{n}"
        gpus = whole(r["num_gpu"], where, "num_gpu", low=0, high=MAX_JOB_GPUS)
        at = number(r["submit_time"], where, "submit_time", low=0, high=MAX_SPAN_S)
        dur = number(r["duration"], where, "duration", low=0, high=MAX_DURATION_S)
        if gpus < 1 or dur <= 0:
            rejected.append((r["job_id"], "no GPUs or no duration"))
            continue
        jobs.append(TraceJob(len(jobs), "", gpus, at, dur, name=r["job_id"], user=r.get("user", "") or ""))
    return Trace(tuple(sorted(jobs, key=lambda j: (j.arrival_s, j.id))), model, str(path), "seconds",
                 tuple(rejected))


# Presets for published cluster traces; any other layout is given as --columns key=column,...
CSV_PRESETS: Mapping[str, Mapping[str, str]] = {
    "helios": {"id": "job_id", "submit": "submit_time", "duration": "duration", "gpus": "gpu_num",
               "nodes": "node_num", "user": "user", "vc": "vc", "state": "state"},
    "philly": {"id": "jobid", "submit": "submitted_time", "duration": "duration", "gpus": "num_gpus",
               "user": "user", "vc": "vc", "state": "status"},
    "acme": {"id": "job_id", "submit": "submit_time", "duration": "duration", "gpus": "gpu_num",
             "nodes": "node_num", "user": "user", "vc": "vc", "state": "state"},
}
CSV_KEYS = ("id", "submit", "duration", "gpus", "nodes", "user", "vc", "state", "time_limit", "job_type", "qos",
            "constraint", "shared", "gpu_memory_mib")
LIVE_KEYS = ("qos", "constraint", "shared", "gpu_memory_mib")
"""Optional columns read under their own names when the mapping does not name them: what the live round mode
(hsched.sim.live) reads of a job beyond the default rounds' (its QoS, node constraint, shared GPU, GPU memory)."""
TRUE_WORDS = ("1", "true", "yes", "y")
FALSE_WORDS = ("", "0", "false", "no", "n")


def _live_columns(r: Mapping[str, str], columns: Mapping[str, str], where: str
                  ) -> tuple[str, bool, int | None]:
    """A row's constraint, shared flag and GPU memory (MiB): one line naming the row and column when bad."""
    from hsched.spec.constraints import parse_constraint

    constraint = (r.get(columns.get("constraint", ""), "") or "").strip()
    if constraint:
        try:
            parse_constraint(constraint)
        except (UserError, ValueError) as e:
            raise UserError(f"{where}: {columns['constraint']}: bad constraint {constraint!r} ({e})") from None
    word = (r.get(columns.get("shared", ""), "") or "").strip().lower()
    if word not in TRUE_WORDS + FALSE_WORDS:
        raise UserError(f"{where}: {columns['shared']}: {word!r}: expected true or false (1/0, yes/no)")
    mem_text = (r.get(columns.get("gpu_memory_mib", ""), "") or "").strip()
    mem = whole(mem_text, where, columns["gpu_memory_mib"], low=1, high=2**31) if mem_text else None
    shared = word in TRUE_WORDS
    if shared and mem is None:
        col = columns.get("gpu_memory_mib", "gpu_memory_mib")
        raise UserError(f"{where}: a shared job needs its GPU memory: give its {col} column (MiB)")
    return constraint, shared, mem


def parse_columns(spec: str) -> dict[str, str]:
    """'submit=submit_time,duration=duration,gpus=gpu_num' or a preset name ('helios')."""
    if spec in CSV_PRESETS:
        return dict(CSV_PRESETS[spec])
    out: dict[str, str] = {}
    for part in spec.split(","):
        key, sep, col = part.partition("=")
        key = key.strip()
        if not sep or key not in CSV_KEYS or not col.strip():
            raise UserError(f"--columns {spec!r}: expected key=column pairs with keys from {', '.join(CSV_KEYS)} "
                            f"or a preset ({', '.join(CSV_PRESETS)})")
        out[key] = col.strip()
    return out


def _parse_time(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return datetime.fromisoformat(value.strip()).timestamp()


def load_csv(path: Path, columns: Mapping[str, str], reference_type: str = "v100") -> Trace:
    """A cluster log as CSV (Philly, Helios, Acme style): one row per job, columns named by `columns`.

    Needs submit, duration and gpus; arrivals are shifted so the first is at 0. Rows without GPUs (CPU
    jobs) or without a duration are listed in `rejected`.
    """
    for key in ("submit", "duration", "gpus"):
        if key not in columns:
            raise UserError(f"{path}: the column mapping needs '{key}=COLUMN' (have: {', '.join(columns)})")
    rows = _read_csv(path)
    _require_columns(path, rows, tuple(columns.values()), "fix --columns")
    columns = {**{k: k for k in LIVE_KEYS if k in rows[0]}, **columns}
    raw: list[tuple[float, TraceJob]] = []
    rejected: list[tuple[str, str]] = []
    for n, r in enumerate(rows, 2):
        name = r.get(columns.get("id", ""), "") or f"row{n}"
        where = f"{path}:{n}"
        try:
            at = _parse_time(r[columns["submit"]])
        except ValueError as e:
            raise UserError(f"{where}: {columns['submit']}: bad time ({e}); check the column mapping") from None
        check(at, where, columns["submit"], low=-MAX_SPAN_S * 10, high=MAX_SPAN_S * 10)
        dur = number(r[columns["duration"]] or "0", where, columns["duration"], low=0, high=MAX_DURATION_S)
        gpus = whole(r[columns["gpus"]] or "0", where, columns["gpus"], low=0, high=MAX_JOB_GPUS)
        nodes = (whole(r[columns["nodes"]], where, columns["nodes"], low=1, high=MAX_JOB_GPUS)
                 if "nodes" in columns and r[columns["nodes"]] else None)
        limit = (number(r[columns["time_limit"]], where, columns["time_limit"], low=0, high=MAX_SPAN_S, above=True)
                 if "time_limit" in columns and r[columns["time_limit"]] else None)
        if gpus < 1:
            rejected.append((name, "no GPUs"))
            continue
        if dur <= 0:
            rejected.append((name, "no duration"))
            continue
        constraint, shared, mem = _live_columns(r, columns, where)
        if shared and gpus != 1:
            raise UserError(f"{where}: a shared job takes part of one GPU; it asks for {gpus}")
        raw.append((at, TraceJob(0, r.get(columns.get("job_type", ""), "") or "", gpus, 0.0, dur, name=name,
                                 user=r.get(columns.get("user", ""), "") or "",
                                 qos=r.get(columns.get("qos", ""), "") or DEFAULT_QOS,
                                 time_limit_s=limit, max_servers=nodes, constraint=constraint, shared=shared,
                                 gpu_memory_mib=mem)))
    raw.sort(key=lambda x: x[0])
    t0 = raw[0][0] if raw else 0.0
    if raw and raw[-1][0] - t0 > MAX_SPAN_S:
        raise UserError(f"{path}: its submit times span {(raw[-1][0] - t0) / 86400:,.0f} days, more than the "
                        f"simulator's {MAX_SPAN_S / 86400:,.0f}; replay a slice of it (a CSV of fewer rows)")
    jobs = tuple(
        replace(j, id=i, arrival_s=at - t0) for i, (at, j) in enumerate(raw)
    )
    return Trace(jobs, ThroughputModel(reference_type=reference_type), str(path), "seconds", tuple(rejected))


def synthetic(
    n_jobs: int,
    seed: int = 0,
    jobs_per_hour: float = 4.0,
    throughput: ThroughputModel | None = None,
    reference_type: str = "v100",
    multi_gpu: bool = True,
) -> Trace:
    """Poisson arrivals with Philly-like sizes and durations (Gavel's generator's mix), seeded.

    Scale: 1 GPU 70 %, 2 10 %, 4 15 %, 8 5 %. Duration on the reference type: 10^U(1.5, 3) minutes for 80 %
    of jobs, 10^U(3, 4) minutes for the rest (a heavy tail). With a throughput table, each job gets a
    random job type known at its scale and work in steps; without one, work is seconds on the reference.
    """
    check(n_jobs, "--synthetic", "N", low=1, high=MAX_JOBS)
    check(jobs_per_hour, "--jobs-per-hour", "the arrival rate", low=0, high=1e9, above=True)
    rng = random.Random(seed)
    model = throughput or ThroughputModel(reference_type=reference_type)
    by_scale: dict[int, list[str]] = {}
    for jt, scale in model.known_keys():
        if model.rate(jt, scale, reference_type) is not None:
            by_scale.setdefault(scale, []).append(jt)
    jobs: list[TraceJob] = []
    t = 0.0
    for i in range(n_jobs):
        t += rng.expovariate(jobs_per_hour / 3600.0)
        r = rng.random()
        gpus = 1
        if multi_gpu:
            gpus = 2 if 0.7 <= r < 0.8 else 4 if 0.8 <= r < 0.95 else 8 if r >= 0.95 else 1
        lo, hi = (1.5, 3.0) if rng.random() < 0.8 else (3.0, 4.0)
        minutes = 10 ** rng.uniform(lo, hi)
        types = by_scale.get(gpus)
        if types:
            jt = types[rng.randrange(len(types))]
            work = minutes * 60.0 * (model.rate(jt, gpus, reference_type) or 1.0)
        else:
            jt, work = "", minutes * 60.0
        jobs.append(TraceJob(i, jt, gpus, round(t, 3), work, name=f"syn{i}"))
    unit = "steps" if by_scale else "seconds"
    return Trace(tuple(jobs), model, f"synthetic(n={n_jobs},seed={seed})", unit)


def load_trace(path: Path, *, throughputs: Path | None = None, columns: str | None = None,
               reference_type: str = "v100") -> Trace:
    """Pick the loader from the file: `.trace` is Gavel, a CSV with Tiresias's header is Tiresias, any
    other CSV needs a column mapping (or a preset name)."""
    if not path.is_file():
        raise UserError(f"{path}: no such trace file")
    if path.suffix == ".trace" or (throughputs is not None and path.suffix not in (".csv", ".tsv")):
        return load_gavel(path, throughputs)
    with path.open(newline="") as f:
        header = next(csv.reader(f), [])
    if columns:
        return load_csv(path, parse_columns(columns), reference_type)
    if {"job_id", "num_gpu", "submit_time", "duration"} <= set(header):
        return load_tiresias(path, reference_type)
    raise UserError(f"{path}: unknown trace layout (header: {','.join(header[:8])}); pass --columns "
                    f"submit=COL,duration=COL,gpus=COL or a preset ({', '.join(CSV_PRESETS)})")


def _read_csv(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as f:
            return list(csv.DictReader(f))
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None


def _require_columns(path: Path, rows: list[dict[str, str]], need: tuple[str, ...], fix: str) -> None:
    if not rows:
        raise UserError(f"{path}: no rows")
    missing = [c for c in need if c not in rows[0]]
    if missing:
        raise UserError(f"{path}: missing column(s) {', '.join(missing)}; {fix}")


def too_long(trace: Trace, job: TraceJob, fastest_rate: float) -> None:
    """A UserError when `job` runs longer than MAX_DURATION_S at `fastest_rate` (its work per second on its
    fastest GPU type): a Gavel job's steps are bounded only by the table's rates, known once the cluster is."""
    seconds = job.work / fastest_rate if fastest_rate > 0 else math.inf
    if seconds > MAX_DURATION_S:
        raise UserError(f"{trace.source}: job {job.name or job.id}: {job.work:,.0f} {trace.work_unit} take "
                        f"{seconds / 86400:,.0f} days at its fastest; the simulator replays jobs of up to "
                        f"{MAX_DURATION_S / 86400:,.0f} days")
