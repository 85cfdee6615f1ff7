"""Manual control of queued jobs: hold, release, requeue, priority."""

from __future__ import annotations

import sys
from typing import Any

import typer

from hsched.cli import complete
from hsched.cli._common import EXIT_FAILED, EXIT_USAGE, handle_errors, print_json
from hsched.errors import ControllerError, UserError
from hsched.spec import jobids


def job_ids_of(c: Any, tokens: list[str], *, whole_arrays: bool = True) -> list[int]:
    """Job ids for what a user typed: `12`, or `12_3` (task 3 of array 12, as squeue shows it). With
    `whole_arrays`, an array's id stands for every task of it (as scancel 12 cancels the whole array)."""
    out: list[int] = []
    listing: list[dict[str, Any]] | None = None
    # every token read first: one out of range is refused before any is asked about
    for token, job_id, index in [_parsed(t) for t in tokens]:
        sep = index is not None
        if not sep and not whole_arrays:
            out.append(job_id)
            continue
        try:
            first = c.call("show", id=job_id)
        except UserError:
            if sep:
                raise
            out.append(job_id)  # no such job: the command itself says so, per job, as before
            continue
        if first.get("array_id") != job_id:
            if sep:
                raise UserError(f"{token!r}: job {job_id} is not an array")
            out.append(job_id)
            continue
        if listing is None:
            listing = c.call("queue", all=True)
        tasks = {j["array_task"]: j["id"] for j in listing if j.get("array_id") == job_id}
        if not sep:
            out.extend(tasks[t] for t in sorted(tasks))
        elif index in tasks:
            out.append(tasks[index])
        else:
            raise UserError(f"{token!r}: array {job_id} has no task {index} (tasks: "
                            f"{', '.join(map(str, sorted(tasks)))})")
    return out


def _parsed(token: str) -> tuple[str, int, int | None]:
    """(token, job id, task index or None) of `12` or `12_3`; a UserError for anything else, or for a number
    beyond the store's range (hsched.spec.jobids)."""
    head, sep, task = token.strip().partition("_")
    if not head.isdigit() or (sep and not task.isdigit()):
        raise UserError(f"{token!r}: expected a job id such as 12 or an array task such as 12_3")
    try:
        return token, jobids.job_id(head), jobids.task_index(task) if sep else None
    except ValueError as e:
        raise UserError(f"{token[:60]!r}: expected {e}") from None


def each(op: str, job_ids: list[int] | list[str], as_json: bool, **args: Any) -> None:
    """Apply `op` to each job; report each result and one line per failure. Exit 2 if a request was wrong
    (no such job), else 1 if one could not be done (the job had already ended), as scancel does."""
    from hsched.client import Client

    out, failed, refused = [], False, False
    with Client() as c:
        ids = job_ids_of(c, [str(j) for j in job_ids])
        for job_id in ids:
            try:
                out.append(c.call(op, id=job_id, **args))
            except UserError as e:
                failed = True
                print(f"hsched: error: {e}", file=sys.stderr)
            except ControllerError as e:
                refused = True
                print(f"hsched: error: {e}", file=sys.stderr)
    if as_json:
        print_json(out)
    else:
        for j in out:
            print(f"job {j.get('display_id', j['id'])}: {j['state']}" + (f" ({j['reason']})" if j["reason"] else ""))
    if failed:
        raise typer.Exit(EXIT_USAGE)
    if refused:
        raise typer.Exit(EXIT_FAILED)


def _together(job_ids: list[str], as_json: bool, hold: bool) -> None:
    from hsched.client import Client

    with Client() as c:
        out = c.call("hold", ids=job_ids_of(c, job_ids), hold=hold)
    if as_json:
        print_json(out)
    else:
        for j in out:
            print(f"job {j.get('display_id', j['id'])}: {j['state']}" + (f" ({j['reason']})" if j["reason"] else ""))


def register(app: typer.Typer) -> None:
    @app.command()
    @handle_errors
    def hold(job_ids: list[str] = typer.Argument(..., metavar="JOB...", autocompletion=complete.job_ids),
             as_json: bool = typer.Option(False, "--json")) -> None:
        """Keep pending jobs from starting until released."""
        _together(job_ids, as_json, hold=True)

    @app.command()
    @handle_errors
    def release(job_ids: list[str] = typer.Argument(..., metavar="JOB...", autocompletion=complete.job_ids),
                as_json: bool = typer.Option(False, "--json")) -> None:
        """Let held jobs start (all together, in one scheduling round)."""
        _together(job_ids, as_json, hold=False)

    @app.command()
    @handle_errors
    def preempt(job_ids: list[str] = typer.Argument(..., metavar="JOB...", autocompletion=complete.job_ids),
                as_json: bool = typer.Option(False, "--json")) -> None:
        """Preempt running jobs now: checkpoint signal, grace, escalation, then back to the queue."""
        each("preempt", job_ids, as_json)

    @app.command()
    @handle_errors
    def checkpoint(job_ids: list[str] = typer.Argument(..., metavar="JOB...", autocompletion=complete.job_ids),
                   as_json: bool = typer.Option(False, "--json")) -> None:
        """Send running jobs their checkpoint signal without stopping them."""
        each("checkpoint", job_ids, as_json)

    @app.command()
    @handle_errors
    def requeue(job_ids: list[str] = typer.Argument(..., metavar="JOB...", autocompletion=complete.job_ids),
                as_json: bool = typer.Option(False, "--json")) -> None:
        """Put ended jobs back in the queue under the same id."""
        each("requeue", job_ids, as_json)

    @app.command()
    @handle_errors
    def priority(
        job_id: int = typer.Argument(..., metavar="JOB", autocompletion=complete.job_ids),
        value: int = typer.Argument(..., metavar="PRIORITY"),
        qos: str | None = typer.Option(None, "--qos", help="Move the job to another QoS class too."),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """Change a job's priority (and QoS class)."""
        each("priority", [job_id], as_json, priority=value, qos=qos)
