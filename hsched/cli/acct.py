"""`hsched acct`: accounting, as sacct is (ended and running jobs of a time window, their runs, GPU-hours);
`hsched metrics`: one scrape of the controller's Prometheus metrics."""

from __future__ import annotations

import re
import time
from datetime import datetime
from typing import Any

import typer

from hsched.cli._common import handle_errors, print_json
from hsched.errors import UserError

FIELDS = {
    "jobid": lambda j: j.get("display_id") or j["id"], "jobname": lambda j: j["name"], "user": lambda j: j["user"],
    "state": lambda j: j["state"], "reason": lambda j: j["reason"], "qos": lambda j: j["qos"],
    "exitcode": lambda j: _exit_code(j["exit_code"]), "submit": lambda j: j["submit_time"],
    "start": lambda j: j["start_time"] or "", "end": lambda j: _end(j),
    "elapsed": lambda j: _elapsed(j), "gpus": lambda j: j["gpus"], "nodes": lambda j: j["nodes"],
    "restarts": lambda j: j["restarts"], "gpuhours": lambda j: f"{_gpu_hours(j):.2f}",
    "nodelist": lambda j: ",".join(sorted({r["node"] for r in j.get("runs") or []})),
}
FIELDS["workload"] = lambda j: j.get("workload") or "-"  # issue 30: training, inference, preprocessing
DEFAULT_FORMAT = "jobid,jobname,user,state,exitcode,elapsed,gpus,gpuhours,nodelist"


def _exit_code(code: int | None) -> str:
    """sacct's ExitCode `N:S`: the exit status and the signal that ended it. hsched keeps a death by signal S as
    128 + S (as a shell says it), so 137 reads `0:9`."""
    if code is None:
        return ""
    if 128 < code <= 128 + 64:
        return f"0:{code - 128}"
    return f"{code}:0"


def _ts(iso_text: str | None) -> float | None:
    return datetime.fromisoformat(iso_text.replace("Z", "+00:00")).timestamp() if iso_text else None


def _end(j: dict[str, Any]) -> str:
    """The end as recorded; never shown before the start (a last guard: the controller records a job's start as
    its first run's, on the clock its end is clamped to; a row kept by an older controller may still say so)."""
    start, end = _ts(j["start_time"]), _ts(j["end_time"])
    if start is not None and end is not None and end < start:
        return str(j["start_time"])
    return j["end_time"] or ""


def _elapsed(j: dict[str, Any]) -> str:
    start, end = _ts(j["start_time"]), _ts(j["end_time"])
    if start is None:
        return "0:00:00"
    from hsched.cli.jobs import _clock

    return _clock(max(0, int((end or time.time()) - start)))


def _gpu_hours(j: dict[str, Any]) -> float:
    total = 0.0
    for r in j.get("runs") or []:
        start, end = _ts(r["start_time"]), _ts(r["end_time"])
        if start is not None:
            total += max(0.0, (end or time.time()) - start) * len(r["devices"]) / 3600
    return total


_RELATIVE = re.compile(r"^now(?:-(\d+)([smhdw]))?$")


def parse_when(text: str, now: float, option: str) -> float:
    """sacct's times: 2026-12-01, 2026-12-01T10:30[:00], now, now-2h, now-3d (s, m, h, d, w)."""
    t = text.strip()
    m = _RELATIVE.match(t.lower())
    if m:
        if not m.group(1):
            return now
        mult = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}[m.group(2)]
        return now - int(m.group(1)) * mult
    try:
        return datetime.fromisoformat(t).timestamp()
    except ValueError:
        raise UserError(f"{option} {text!r}: expected a time such as 2026-12-01, 2026-12-01T10:30 or now-2d") from None


def register(app: typer.Typer) -> None:
    @app.command()
    @handle_errors
    def metrics() -> None:
        """Print one scrape of the controller's Prometheus metrics (what settings `metrics` serves)."""
        from hsched.cli.jobs import _client

        with _client() as c:
            print(c.call("metrics")["text"], end="")

    @app.command()
    @handle_errors
    def acct(
        users: str | None = typer.Option(None, "--user", "-u", help="Only these users (comma-separated)."),
        start: str | None = typer.Option(None, "--starttime", "-S",
                                         help="Window start: 2026-12-01, 2026-12-01T10:30, now-2d (default: "
                                              "midnight today, as sacct)."),
        end: str | None = typer.Option(None, "--endtime", "-E", help="Window end (default: now)."),
        states: str | None = typer.Option(None, "--state", "-s", help="Only these states (names or codes)."),
        name: str | None = typer.Option(None, "--name", help="Only jobs with this name (comma-separated)."),
        fmt: str = typer.Option(DEFAULT_FORMAT, "--format", "-o",
                                help=f"Fields, comma-separated: {', '.join(FIELDS)}."),
        parsable: bool = typer.Option(False, "--parsable2", "-P", help="Fields joined by |, no padding."),
        summary: bool = typer.Option(False, "--gpu-hours", help="GPU-hours by user and by GPU model."),
        as_json: bool = typer.Option(False, "--json", help="Jobs with their runs, and GPU-hours, as JSON."),
        jobs_given: str | None = typer.Option(None, "--jobs", "-j", help="Only these jobs (comma-separated; 12 for "
                                              "a whole array, 12_3 one task), whenever they ran, as sacct -j."),
        allocations: bool = typer.Option(False, "--allocations", "-X", help="Jobs only, no steps: what hsched lists "
                                         "anyway (sacct -X)."),
        noheader: bool = typer.Option(False, "--noheader", "-n", help="No header lines, as sacct -n."),
    ) -> None:
        """Accounting (sacct's role): the jobs of a time window, their runs and GPU-hours."""
        from hsched.cli.jobs import _client, _states
        from hsched.cli.listing import _job_set

        now = time.time()
        only = _job_set(jobs_given) if jobs_given else None
        # sacct -j: the jobs named, from the epoch on unless a start is given
        since = parse_when(start, now, "--starttime") if start else 0.0 if only else datetime.now().replace(
            hour=0, minute=0, second=0, microsecond=0).timestamp()
        until = parse_when(end, now, "--endtime") if end else None
        fields = [f.strip().lower() for f in fmt.split(",") if f.strip()]
        bad = [f for f in fields if f not in FIELDS]
        if bad:
            raise UserError(f"--format: unknown field {bad[0]!r}; known: {', '.join(FIELDS)}")
        wanted = _states(states) if states else None
        with _client() as c:
            reply = c.call("acct", since=since, **({"until": until} if until is not None else {}))
        jobs = reply["jobs"]
        if users:
            allowed = {u.strip() for u in users.split(",") if u.strip()}
            jobs = [j for j in jobs if j["user"] in allowed]
        if wanted:
            jobs = [j for j in jobs if j["state"] in wanted]
        if name:
            names = {n.strip() for n in name.split(",")}
            jobs = [j for j in jobs if j["name"] in names]
        if only is not None:
            jobs = [j for j in jobs if str(j["id"]) in only or str(j.get("array_id")) in only
                    or f"{j.get('array_id')}_{j.get('array_task')}" in only]
        if as_json:
            print_json({"jobs": jobs, "gpu_hours": reply["gpu_hours"]})
            return
        if summary:
            hours = reply["gpu_hours"]
            print(f"GPU-hours {hours['total']:.2f}")
            for title, key in (("by user", "by_user"), ("by GPU model", "by_model"), ("by workload", "by_workload")):
                print(f"  {title}:")
                for k, v in hours.get(key, {}).items():
                    print(f"    {k:<28} {v:10.2f}")
            return
        rows = [[str(FIELDS[f](j)) for f in fields] for j in component_rows(jobs)]
        if parsable:
            if not noheader:
                print("|".join(f.capitalize() for f in fields))
            for r in rows:
                print("|".join(r))
            return
        widths = [max([len(f)] + [len(r[i]) for r in rows]) for i, f in enumerate(fields)]
        if not noheader:
            print("  ".join(f.capitalize().ljust(w) for f, w in zip(fields, widths, strict=True)).rstrip())
            print("  ".join("-" * w for w in widths))
        for r in rows:
            print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


def component_rows(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The jobs as sacct's rows: a heterogeneous job as one row per component (`12+0`, `12+1`), each with its own
    state, exit code, GPUs, nodes and runs; other jobs as they are."""
    out: list[dict[str, Any]] = []
    for j in jobs:
        if not j.get("components"):
            out.append(j)
            continue
        for c in j["components"]:
            ranks = {r["rank"] for r in c.get("runs") or ()}
            out.append(dict(j, display_id=c["display_id"], state=c["state"], gpus=c["gpus"], nodes=c["nodes"],
                            exit_code=c.get("exit_code", j["exit_code"]),
                            runs=[r for r in j.get("runs") or () if r["rank"] in ranks]))
    return out
