"""`hsched queue` without Typer: squeue's listing of the controller's jobs (table, -o format, or JSON).

The Typer command (hsched/cli/jobs.py) and `quick_queue`, which hsched/cli/__init__.py tries first, both end
in `queue`. `quick_queue` reads the options as hsched/cli/quick.py reads a plain argv and leaves the rest
(--help, a stray argument, anything unsure) to Typer. Typer's import (with the pydantic it loads to parse) was
most of a `hsched queue --json`; the default table still imports rich, the JSON and -o outputs do not.
"""

from __future__ import annotations

import gc
import os
import sys
import time

from hsched.cli import quick
from hsched.cli._common import print_json
from hsched.cli.quick import FLAG, TEXT
from hsched.errors import UserError

TYPE_CHECKING = False  # typing is left to the type checker: a quick path does without its import
if TYPE_CHECKING:
    from typing import Any

OPTIONS: dict[str, tuple[tuple[str, ...], str, int | None, int | None]] = {
    # parameter name: (option names, kind, min, max), as hsched/cli/jobs.py's queue declares them
    "all_jobs": (("--all", "-a"), FLAG, None, None),
    "me": (("--me",), FLAG, None, None),
    "users": (("--user", "-u"), TEXT, None, None),
    "states": (("--states", "-t"), TEXT, None, None),
    "fmt": (("--format", "-o"), TEXT, None, None),
    "as_json": (("--json",), FLAG, None, None),
    "start": (("--start",), FLAG, None, None),
    "jobs_given": (("--jobs", "-j"), TEXT, None, None),
    "noheader": (("--noheader", "-h"), FLAG, None, None),
}

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "LOST"}


def _client() -> Any:
    from hsched.client import Client

    return Client()


def quick_queue(argv: list[str]) -> int | None:
    """List the jobs for a plain `hsched queue ...` (argv after `queue`) and return the exit code; None: not
    handled, Typer's turn (nothing was done)."""
    parsed = quick.parse(argv, OPTIONS)
    if parsed is None or parsed[1]:
        return None  # an argument: Typer says it is unexpected
    # a short-lived process whose decoded listing holds no cycle: the cyclic collector would only walk 10,000 jobs'
    # objects again and again as they are decoded and laid out (~17% of a 10,000-job table's CPU); reference counting
    # still frees everything (and the collector is on again after: a test calls this in its own process)
    was = gc.isenabled()
    gc.disable()
    try:
        return quick.run(lambda: queue(**parsed[0]))
    finally:
        if was:
            gc.enable()


def queue(*, all_jobs: bool, me: bool, users: str | None, states: str | None, fmt: str | None,
          as_json: bool, start: bool = False, jobs_given: str | None = None, noheader: bool = False) -> None:
    """The jobs as squeue lists them: pending and active ones (--all: every job), filtered, in the format asked;
    --start: the pending ones with their predicted starts (squeue --start); -j: these jobs only (`12`: a whole
    array, `12_3` one task); -h: no header line; SQUEUE_FORMAT: the format when -o is not given, as squeue's."""
    if fmt is None and not as_json and os.environ.get("SQUEUE_FORMAT"):
        fmt = os.environ["SQUEUE_FORMAT"]
    only = _job_set(jobs_given) if jobs_given else None
    wanted = _states(states) if states else None
    if start:
        wanted = {"PENDING"}
    everything = all_jobs or bool(wanted and wanted & ENDED)
    if as_json and not start and not sys.stdout.isatty():
        # to a pipe, the controller's text is written through: the controller picks the jobs and keeps each one's
        # JSON, so a 10,000-job listing is not decoded and encoded again here (issue 33)
        allowed = _allowed(me, users)
        from hsched.client import WriterGone

        out = sys.stdout.buffer
        try:
            with _client() as c:
                got = c.write_text("queue", out, **_picks(everything, allowed, wanted, only))
        except WriterGone as e:
            raise e.error from None  # (a reader gone: `quick.run` stops quietly)
        if got is None:  # (written as it came)
            out.write(b"\n")
            out.flush()
            return
        print_json(_picked(got, allowed, wanted, only))
        return
    if not (as_json or start or fmt):
        # the table: the controller picks the jobs and sends only what a row shows, as text (10,000 jobs: decoding
        # their whole objects, ~10 MB, was half of `hsched queue`'s CPU)
        allowed = _allowed(me, users)
        with _client() as c:
            got = c.call_text("queue", **_picks(everything, allowed, wanted, only), fields=list(ROW_FIELDS))
        if isinstance(got, memoryview):
            import json

            render_queue(json.loads(bytes(got)), header=not noheader)
            return
        render_queue(_picked(got, allowed, wanted, only), header=not noheader)
        return
    with _client() as c:
        jobs = c.call("queue", all=everything)
        if start:
            jobs = with_starts(jobs, c.call("starts", detail=True))
    if me:
        from hsched.cli.submitting import _user

        user = _user()
        jobs = [j for j in jobs if j["user"] == user]
    if users:
        allowed = {u.strip() for u in users.split(",") if u.strip()}
        jobs = [j for j in jobs if j["user"] in allowed]
    if wanted:
        jobs = [j for j in jobs if j["state"] in wanted]
    if only is not None:
        jobs = [j for j in jobs if str(j["id"]) in only or str(j.get("array_id")) in only
                or f"{j.get('array_id')}_{j.get('array_task')}" in only]
    if as_json:
        print_json(jobs)
    elif start and not fmt:
        render_starts(jobs)
    elif fmt:
        lines = format_queue(jobs, fmt)
        sys.stdout.write("".join(line + "\n" for line in (lines[1:] if noheader else lines)))
    else:
        render_queue(jobs, header=not noheader)


def _picks(everything: bool, allowed: set[str] | None, wanted: set[str] | None, only: set[str] | None
           ) -> dict[str, Any]:
    """`queue`'s arguments that have the controller pick the jobs a listing shows."""
    return {"all": everything, "users": sorted(allowed) if allowed is not None else None,
            "states": sorted(wanted) if wanted else None, "ids": sorted(only) if only is not None else None}


def _picked(jobs: list[dict[str, Any]], allowed: set[str] | None, wanted: set[str] | None,
            only: set[str] | None) -> list[dict[str, Any]]:
    """The jobs a listing shows, picked here: a controller from before `text` sends every job's whole object."""
    from hsched.serialize import pick_jobs

    return pick_jobs(jobs, users=allowed, states=wanted or None, ids=only)


ROW_FIELDS = ("id", "display_id", "array_id", "array_task", "array_limit", "components", "name", "user", "state",
              "qos", "priority", "gpus", "elastic", "gpus_min", "gpus_max", "gpus_now", "nodes", "placement",
              "constraint", "reason", "start_time", "end_time")
"""What a row of the table (`render_queue`) reads of a job: all the controller sends for it."""


def _allowed(me: bool, users: str | None) -> set[str] | None:
    """The users `--me` and `-u` leave in a listing (None: everyone)."""
    allowed = {u.strip() for u in users.split(",") if u.strip()} if users else None
    if me:
        from hsched.cli.submitting import _user

        mine = {_user()}
        allowed = mine if allowed is None else allowed & mine
    return allowed


def _job_set(text: str) -> set[str]:
    """squeue -j's list: ids (`12`, an array's id: all its tasks) and tasks (`12_3`), comma-separated; checked as
    every id argument is (hsched.spec.jobids)."""
    from hsched.spec.jobids import job_id, task_index

    words = [w.strip() for w in text.split(",") if w.strip()]
    if not words:
        raise UserError(f"--jobs {text!r}: expected job ids such as 12,13_2")
    out = set()
    for w in words:
        head, sep, task = w.partition("_")
        try:
            out.add(f"{job_id(head)}_{task_index(task)}" if sep else str(job_id(head)))
        except ValueError as e:
            raise UserError(f"--jobs: expected {e}, found {w!r}") from None
    return out


def _elapsed(job: dict[str, Any]) -> str:
    start = job.get("start_time")
    if not start:
        return "0:00"
    from datetime import datetime

    t0 = datetime.fromisoformat(start.replace("Z", "+00:00")).timestamp()
    end = job.get("end_time")
    t1 = datetime.fromisoformat(end.replace("Z", "+00:00")).timestamp() if end else time.time()
    return _clock(max(0, int(t1 - t0)), short=True)


def _clock(s: int, *, short: bool = False) -> str:
    """Seconds as squeue writes times: D-HH:MM:SS, H:MM:SS, or (short) M:SS under an hour."""
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}-{h:02d}:{m:02d}:{s:02d}"
    return f"{h}:{m:02d}:{s:02d}" if h or not short else f"{m}:{s:02d}"


def _where(job: dict[str, Any]) -> str:
    """squeue's NODELIST(REASON): the nodes, comma-separated (a host list Slurm's tools read; `n1[2]` for two GPUs
    on n1 read as node n12 to them: the GPUs are their own column), else the reason in parentheses."""
    if job["placement"]:
        return ",".join(dict.fromkeys(p["node"] for p in job["placement"]))
    return f"({job['reason']})" if job.get("reason") else ""


def queue_rows(jobs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(JOBID text, job) per row, as squeue: an array's pending tasks in one row (`12_[3-99%8]`, at the place of
    its first), its other tasks one row each (`12_0`)."""
    from hsched.indices import pending_label

    pending: dict[int, list[dict[str, Any]]] = {}
    for j in jobs:
        if j.get("array_id") is not None and j["state"] == "PENDING":
            pending.setdefault(j["array_id"], []).append(j)
    rows: list[tuple[str, dict[str, Any]]] = []
    shown: set[int] = set()
    for j in jobs:
        aid = j.get("array_id")
        if aid is not None and j["state"] == "PENDING" and len(pending[aid]) > 1:
            if aid not in shown:
                shown.add(aid)
                limit = j.get("array_limit")
                rows.append((pending_label(aid, [t["array_task"] for t in pending[aid]], limit), j))
            continue
        if j.get("components"):
            # a heterogeneous job: one row per component (`12+0`, `12+1`), each with its own GPUs and nodes, as squeue
            rows.extend((c["display_id"], dict(j, gpus=c["gpus"], nodes=c["nodes"], placement=c["placement"],
                                               constraint=c.get("constraint")))
                        for c in j["components"])
            continue
        rows.append((str(j.get("display_id") or j["id"]), j))
    return rows


def _states(text: str) -> set[str]:
    """squeue -t's list: state names or codes (PD, R, CG, CD, F, CA, TO...), any case."""
    from hsched.model import JobState
    from hsched.theme import state_code

    by_code = {state_code(s.value): s.value for s in JobState}
    out = set()
    for raw in text.split(","):
        word = raw.strip().upper()
        if not word:
            continue
        if word in {s.value for s in JobState}:
            out.add(word)
        elif word in by_code:
            out.add(by_code[word])
        else:
            known = ", ".join(f"{code} ({name.lower()})" for code, name in sorted(by_code.items()))
            raise UserError(f"--states {raw.strip()!r}: not a state; known: {known}")
    return out


def gpus_cell(j: dict[str, Any]) -> str:
    """The GPUS column: the count; an elastic job's range, with the size it runs at now (`2-8:8`)."""
    if not j.get("elastic"):
        return str(j["gpus"])
    text = f"{j['gpus_min']}-{j['gpus_max']}" if j["gpus_max"] != j["gpus_min"] else str(j["gpus_min"])
    return text + (f":{j['gpus_now']}" if j.get("gpus_now") is not None else "")


def format_queue(jobs: list[dict[str, Any]], fmt: str) -> list[str]:
    """Lines as squeue -o FORMAT writes them (a header line first), one per queue row."""
    import re

    from hsched.theme import state_code

    fields: dict[str, tuple[str, Any]] = {
        "i": ("JOBID", lambda label, j: label), "j": ("NAME", lambda label, j: j["name"]),
        "u": ("USER", lambda label, j: j["user"]), "t": ("ST", lambda label, j: state_code(j["state"])),
        "T": ("STATE", lambda label, j: j["state"]), "q": ("QOS", lambda label, j: j["qos"]),
        "p": ("PRIORITY", lambda label, j: j["priority"]), "b": ("GPUS", lambda label, j: j["gpus"]),
        "D": ("NODES", lambda label, j: j["nodes"]), "M": ("TIME", lambda label, j: _elapsed(j)),
        "l": ("TIME_LIMIT", lambda label, j: _limit(j.get("time_limit_s"))),
        "R": ("NODELIST(REASON)", lambda label, j: _where(j)), "r": ("REASON", lambda label, j: j["reason"]),
        "V": ("SUBMIT_TIME", lambda label, j: j["submit_time"]),
        "S": ("START_TIME", lambda label, j: j.get("start_time") or j.get("predicted_start")),
        # a partition is a node label here, kept in the job's constraint with any --constraint: both show it
        "P": ("PARTITION", lambda label, j: j.get("constraint") or "(null)"),
        "f": ("FEATURES", lambda label, j: j.get("constraint") or "(null)"),
    }
    spec = re.compile(r"%(\.)?(\d+)?([A-Za-z%])")
    for m in spec.finditer(fmt):
        if m.group(3) not in fields and m.group(3) != "%":
            raise UserError(f"--format {fmt!r}: unknown field %{m.group(3)}; known: "
                            + " ".join(f"%{k}" for k in fields))

    def line(row: tuple[str, dict[str, Any]] | None) -> str:
        def one(m: re.Match[str]) -> str:
            if m.group(3) == "%":
                return "%"
            title, get = fields[m.group(3)]
            value = title if row is None else get(row[0], row[1])
            text = "" if value is None else str(value)
            if m.group(2):
                width = int(m.group(2))
                text = text[:width]
                text = text.rjust(width) if m.group(1) else text.ljust(width)
            return text
        return spec.sub(one, fmt)

    return [line(None), *(line(r) for r in queue_rows(jobs))]


def _limit(seconds: float | None) -> str:
    return _clock(int(seconds)) if seconds else "UNLIMITED"


def _plain_queue(rows: list[tuple[str, dict[str, Any]]], header: bool = True) -> None:
    """The queue's columns as plain text, widths from the longest cell (no colour: a long listing is read by
    grep and less more than by eye)."""
    from hsched.theme import state_code

    head = ("JOBID", "NAME", "USER", "ST", "QOS", "PRIO", "GPUS", "TIME", "NODES(REASON)")
    right = {0, 5, 6, 7}
    codes: dict[str, str] = {}  # (a state's code, once per state)
    table = [head] + [(label, _printable(j["name"][:24]), j["user"],
                       codes.get(j["state"]) or codes.setdefault(j["state"], state_code(j["state"])), j["qos"],
                       str(j["priority"]), gpus_cell(j), _elapsed(j), _where(j))
                      for label, j in rows]
    # one format for every line, each line made in one call (10,000 rows: a cell at a time was ~40 ms)
    line = " ".join(f"{{:{'>' if k in right else '<'}{max(map(len, column))}}}"
                    for k, column in enumerate(zip(*table, strict=True)))
    sys.stdout.write("".join(line.format(*r).rstrip() + "\n" for r in (table if header else table[1:])))


def _printable(text: str) -> str:
    """A submitter's text with its unprintable characters shown as `?`: they never reach the terminal."""
    return text if text.isprintable() else "".join(c if c.isprintable() else "?" for c in text)


def with_starts(jobs: list[dict[str, Any]], when: dict[str, Any]) -> list[dict[str, Any]]:
    """The jobs with their predictions (the controller's `starts`, hsched.controller.forecast): `predicted_start`
    (ISO time or None, as before) and `prediction` (node(s), not before, the round's reason). A controller from
    before predictions said where answers the time alone."""
    out = []
    for j in jobs:
        got = when.get(str(j["id"]))
        if isinstance(got, dict):
            out.append(dict(j, predicted_start=got.get("start_time"), prediction=got))
        else:
            out.append(dict(j, predicted_start=got))
    return out


def start_cells(j: dict[str, Any]) -> tuple[str, str]:
    """squeue --start's START_TIME and SCHEDNODES for a job: the predicted time and node(s); else N/A, or the moment
    it starts no earlier than ("not before ...") and no node."""
    p = j.get("prediction") or {}
    if j.get("predicted_start"):
        return _seconds(j["predicted_start"]), ",".join(p.get("nodes") or []) or "-"
    return (f"not before {_seconds(p['not_before'])}" if p.get("not_before") else "N/A"), "-"


def _seconds(when: str) -> str:
    """An ISO time to the second, as squeue shows it (`2026-12-03T17:55:12Z`; the JSON keeps the milliseconds)."""
    head, dot, _rest = when.partition(".")
    return head + "Z" if dot and when.endswith("Z") else when


def render_starts(jobs: list[dict[str, Any]]) -> None:
    """squeue --start's table: each pending job, when and where it is predicted to start (N/A: cannot be told)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("JOBID", "NAME", "USER", "ST", "START_TIME", "GPUS", "SCHEDNODES", "NODES(REASON)"):
        table.add_column(col, justify="right" if col in ("JOBID", "GPUS") else "left")
    for label, j in queue_rows(jobs):
        when, where = start_cells(j)
        table.add_row(label, escape(j["name"]), escape(j["user"]), "PD", when, gpus_cell(j), escape(where),
                      escape(_where(j)))
    Console(highlight=False).print(table)


PLAIN_ROWS = 200
"""More rows than this are printed as plain columns: rich's table lays 5,000 rows out in ~10 s, squeue in ms."""


def render_queue(jobs: list[dict[str, Any]], header: bool = True) -> None:
    rows = queue_rows(jobs)
    # plain columns, as squeue's, for a pipe or a file (what grep, awk and scripts read) and for long listings;
    # rich's coloured table only for a person at a terminal: laying 150 rows out cost 0.6 s of a 0.8 s `queue`
    if len(rows) > PLAIN_ROWS or not sys.stdout.isatty() or not header:
        _plain_queue(rows, header)
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from hsched.theme import state_code, state_color

    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("JOBID", "NAME", "USER", "ST", "QOS", "PRIO", "GPUS", "TIME", "NODES(REASON)"):
        table.add_column(col, justify="right" if col in ("JOBID", "PRIO", "GPUS", "TIME") else "left")
    for label, j in rows:
        color = state_color(j["state"])
        # names and users are the submitters' text: shown as written, never read as rich markup
        table.add_row(label, escape(j["name"][:24]), escape(j["user"]), f"[{color}]{state_code(j['state'])}[/]",
                      j["qos"], str(j["priority"]), gpus_cell(j), _elapsed(j), escape(_where(j)))
    Console().print(table)


def component_lines(components: list[dict[str, Any]]) -> list[str]:
    """`show`'s lines for a heterogeneous job's components: id, state, resources, placement, command."""
    out = []
    for c in components:
        types = "|".join(c.get("gpu_types") or ())
        gpus = f"{c['gpus']} GPU(s){' ' + types if types else ''}" if c["gpus"] else "CPU only"
        res = ", ".join(x for x in (gpus, f"{c['cpus']} CPUs" if c.get("cpus") else "",
                                    f"{c['nodes']} nodes" if c.get("nodes", 1) > 1 else "") if x)
        where = ", ".join(f"{p['node']}" + (f" [{','.join(p['devices'])}]" if p["devices"] else "")
                          for p in c.get("placement") or ()) or "-"
        code = f" exit={c['exit_code']}" if c.get("exit_code") is not None else ""
        out.append(f"{c['display_id']:<8} {c['state']:<10}{code} {res}; on {where}; {' '.join(c['command'])}")
    return out
