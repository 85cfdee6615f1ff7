"""Job commands: submit, queue, show, wait, cancel, logs."""

from __future__ import annotations

import base64
import os
import sys
import time
from pathlib import Path
from typing import Any

import typer

from hsched.cli import complete
from hsched.cli._common import EXIT_FAILED, handle_errors, print_json
from hsched.cli.listing import (  # noqa: F401  (the queue's pieces, typer-free there; imported from here too)
    _clock,
    _elapsed,
    _limit,
    _states,
    _where,
    format_queue,
    queue_rows,
    render_queue,
)
from hsched.errors import UserError


def _client() -> Any:
    from hsched.client import Client

    return Client()


def _given(value: Any) -> bool:
    """An option the user gave (not its default): 0 is given, None/False/empty are not."""
    return value is not None and value is not False and not (isinstance(value, list | tuple) and not value)


def batch_script(path: str) -> Any:
    """The BatchScript at `path` if it is one (a text file with a #! line or #SBATCH/#HSCHED lines), else None."""
    from hsched.spec.batch import read_batch_script

    return read_batch_script(Path(path))


def _expected_line(job: dict[str, Any]) -> str:
    """`ends about 2026-12-02T06:10:00Z (from its progress); its kind runs about 1h20m` or `-`."""
    parts = []
    end = job.get("predicted_end")
    if end:
        parts.append(f"ends about {end['time']} (from its {end['from']})")
    exp = job.get("expected_duration_s")
    if exp is not None:
        s = int(exp)
        parts.append(f"its kind runs about {s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else
                     f"its kind runs about {s // 60}m{s % 60:02d}s")
    return "; ".join(parts) or "-"


def _multifactor(p: dict[str, Any] | None) -> str:
    """The job's multifactor priority (hsched.controller.shares.job_priority) as a sum; "-" once it ended."""
    if not p:
        return "-"
    from hsched.learn.fairshare import priority_line

    return priority_line(p)


def _progress_line(p: dict[str, Any] | None, ended: bool = False) -> str:
    """`step 1200 of 50000 (2.4%), 3.1 steps/s, about 4h22m left, loss 0.31` from a job's progress; a job not running
    (ended, or waiting to run again) has no time left shown: its last report's estimate is history, not a prediction."""
    if not p or p.get("step") is None:
        return "- (no report: hsched.progress)"
    step, total = p["step"], p.get("total")
    parts = [f"step {step:g}" + (f" of {total:g} ({100 * step / total:.1f}%)" if total else "")]
    if p.get("steps_per_s"):
        parts.append(f"{p['steps_per_s']:.3g} steps/s on {p['gpus']} x {p['gpu_type']} ({p['class']})")
    if p.get("remaining_s") is not None and not ended:
        left = int(p["remaining_s"])
        parts.append(f"about {left // 3600}h{left % 3600 // 60:02d}m left" if left >= 3600
                     else f"about {left // 60}m{left % 60:02d}s left")
    if p.get("loss") is not None:
        parts.append(f"loss {p['loss']:.4g}")
    return ", ".join(parts)


def _files_line(job: dict[str, Any]) -> str:
    """Where the job's output goes besides `hsched logs` (sbatch's -o/-e patterns, as scontrol's StdOut/StdErr)."""
    out, err = job.get("output"), job.get("error")
    if not out and not err:
        return f"hsched logs {job.get('display_id', job['id'])}"
    if out and (not err or err == out):
        return f"{out} (stdout and stderr)"
    return f"stdout {out or '(hsched logs only)'}, stderr {err}"


def register(app: typer.Typer) -> None:
    @app.command(context_settings={"allow_interspersed_args": False})
    @handle_errors
    def submit(
        ctx: typer.Context,
        args: list[str] = typer.Argument(None, help="[SPEC.toml] [-- COMMAND ARGS...]", show_default=False),
        gpus: str | None = typer.Option(None, "--gpus", "-G",
                                        help="GPUs in all, as sbatch (split evenly over --nodes); MIN-MAX "
                                             "(2-8): an elastic job, grown and shrunk between them."),
        gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", min=0, help="GPUs on each node."),
        gpu_type: list[str] = typer.Option(None, "--gpu-type",
                                           help="GPU model substring, or a settings alias (repeatable)."),
        constraint: str | None = typer.Option(
            None, "--constraint", "-C",
            help="Node labels the job needs, as sbatch: nvme, \"nvme&ib\" (and), \"a100|h100\" (or), parentheses."),
        partition: str | None = typer.Option(
            None, "--partition", "-p",
            help="Run on nodes of this partition (a fleet file node label); a,b: any of them, as sbatch."),
        nodelist: str | None = typer.Option(
            None, "--nodelist", "-w",
            help="Run only on these nodes, as sbatch: n1,gpu5 or a host list n[1-3] (one of them per --nodes)."),
        exclude: str | None = typer.Option(
            None, "--exclude", "-x", help="Never run on these nodes, as sbatch: n1,gpu5 or n[1-3]."),
        ntasks: int | None = typer.Option(
            None, "--ntasks", "-n", min=1,
            help="Tasks, as sbatch: the script runs once, `srun CMD` in it runs CMD once per task (one node)."),
        gpu_memory: str | None = typer.Option(None, "--gpu-memory", help="Minimum memory per GPU, e.g. 40G."),
        nodes: str | None = typer.Option(None, "--nodes", "-N",
                                         help="Nodes (all-or-nothing); MIN-MAX (2-4): an elastic gang."),
        name: str | None = typer.Option(None, "--name", "-J", "--job-name", help="Job name."),
        qos: str | None = typer.Option(None, "--qos", help="QoS class (built in: prod, normal, scavenger).",
                                       autocompletion=complete.qos_names),
        tasks_per_node: int | None = typer.Option(None, "--tasks-per-node", min=1,
                                                  help="Ranks per node, each with torchrun's environment."),
        priority: int | None = typer.Option(None, "--priority", help="Priority inside the QoS class."),
        interconnect: str | None = typer.Option(None, "--interconnect", help="nvlink (required) or any."),
        offload: bool = typer.Option(False, "--offload",
                                     help="The job offloads to host memory (ZeRO-Offload): prefer nodes with more "
                                          "host memory per GPU."),
        shared: bool = typer.Option(False, "--shared", "--gpu-share",
                                    help="A fraction of one GPU, --gpu-memory of it (inference, small evals): packed "
                                         "with other shared jobs, under CUDA MPS where the node has it."),
        cpus: int | None = typer.Option(None, "--cpus", "-c", min=1, help="CPUs."),
        memory: str | None = typer.Option(None, "--memory", "--mem",
                                          help="Host memory per node, e.g. 64G (a cgroup limit where the node has "
                                               "cgroups; going over it ends the job with reason oom)."),
        checkpoint_signal: str | None = typer.Option(
            None, "--checkpoint-signal",
            help="SIG@SECONDS sent to every process of the job on preemption, e.g. USR1@60; B:USR1@60 sends it to "
                 "the batch shell only."),
        resize_signal: str | None = typer.Option(
            None, "--resize-signal",
            help="An elastic job that resizes in place: on a resize it gets this signal (e.g. USR2) and its new "
                 "devices in $HSCHED_RESIZE_FILE, instead of a checkpoint and restart."),
        time_limit: str | None = typer.Option(
            None, "--time", "-t",
            help="Time limit as sbatch: 90 (minutes), MM:SS, HH:MM:SS, D-HH[:MM[:SS]]; or 90s, 1h30m."),
        warn_signal: str | None = typer.Option(
            None, "--signal", help="SIG@SECONDS sent that long before the time limit (B:SIG@SECONDS: the batch "
                                   "shell only, as sbatch)."),
        retries: int | None = typer.Option(
            None, "--retries", min=0, max=100,
            help="Retry a failed run (nonzero exit, lost) this many times, after 10 s, 20 s, 40 s ... "
                 "(default: settings `retries`, 0). Preemption and node loss never use a retry."),
        array: str | None = typer.Option(
            None, "--array", "-a",
            help="A job array as sbatch: 0-99, 1,3,5-7, 0-15:4, with %N for at most N tasks at once; each task "
                 "sees HSCHED_ARRAY_TASK_ID (and SLURM_ARRAY_TASK_ID)."),
        dependency: str | None = typer.Option(
            None, "--dependency", "-d",
            help="Start after other jobs, as sbatch: afterok:12, afterany:13:14, afternotok:15, after:12, "
                 "singleton; joined by , (all) or ? (any)."),
        kill_on_invalid_dep: bool = typer.Option(
            False, "--kill-on-invalid-dep", help="Cancel the job if a dependency can never be satisfied."),
        workdir: str | None = typer.Option(
            None, "--workdir", "-D", "--chdir",
            help="Working folder (default: where you submit, on nodes that see it)."),
        output: str | None = typer.Option(
            None, "--output", "-o",
            help="Also write the job's output to this file, as sbatch: %j job id, %A/%a array job/task id, %x "
                 "name, %u user, %N node, %%; relative to the working folder; appended to after a requeue."),
        error: str | None = typer.Option(
            None, "--error", "-e", help="Write the job's stderr to this file (default: with --output's)."),
        open_mode: str | None = typer.Option(
            None, "--open-mode", help="truncate (default: emptied at the job's first start) or append (never "
                                      "emptied); a requeued run appends either way."),
        env: list[str] = typer.Option(None, "--env", help="NAME=VALUE for the job (repeatable)."),
        hold: bool = typer.Option(False, "--hold", help="Queue the job held; `hsched release` lets it run."),
        kind: str | None = typer.Option(None, "--kind", help="What the job is (e.g. resnet50-bs64), for the "
                                        "speeds hsched learns; default: its script and model/batch arguments."),
        data: str | None = typer.Option(None, "--data", help="Datasets the job reads, NAME[,NAME] (the fleet file's "
                                        "[[dataset]]s): placed near them or copied first; $HSCHED_DATA_<NAME> "
                                        "is the path on the node."),
        as_json: bool = typer.Option(False, "--json", help="Print the job as JSON."),
        parsable: bool = typer.Option(False, "--parsable", help="Print the job id alone."),
        test_only: bool = typer.Option(False, "--test-only", help="Queue nothing: say when and on which node "
                                       "the job would start (sbatch's): the controller's round stepped through the "
                                       "running jobs' predicted ends."),
        workload: str | None = typer.Option(None, "--workload", help="training, inference or preprocessing "
                                            "(what accounting, `hsched kinds` and placement group it by)."),
    ) -> None:
        """Queue a job: a spec file, a command after --, or both (options override the file)."""
        from hsched.cli import submitting

        args = list(args or [])
        o = dict(ctx.params)
        table: dict[str, Any] = {}
        source = "<command line>"
        if args and args[0].lower().endswith(".toml"):
            from hsched.config import read_toml

            spec_path = Path(args.pop(0)).expanduser().absolute()
            table = read_toml(spec_path)
            if isinstance(table.get("service"), dict):  # issue 30: a service's spec file
                raise UserError(f"{spec_path}: a [service] table is a service, not a job: start it with "
                                f"`hsched serve start {spec_path}`")
            source = str(spec_path)
            base = spec_path.parent
            if isinstance(table.get("workdir"), str):
                table["workdir"] = str((base / table["workdir"]).expanduser())
            if args and args[0].startswith("-") and args[0] != "--":
                # `hsched submit job.toml --qos prod`: options after the spec file are options (the parser
                # stopped at the file, so they came as arguments); they win over those before it
                later = ctx.command.make_context(ctx.info_name or "submit", args, parent=ctx.parent)
                o.update({k: v for k, v in later.params.items() if _given(v)})
                args = list(later.params.get("args") or [])
        elif args and args[0] != "--" and (script := batch_script(args[0])) is not None:
            # `hsched submit train.sh ARGS`: its #SBATCH/#HSCHED lines are options (the command line's win),
            # the script itself the command, as sbatch
            source = f"{args[0]} (#SBATCH lines)"
            from_script = ctx.command.make_context(ctx.info_name or "submit", script.options, parent=ctx.parent)
            o = {**{k: v for k, v in from_script.params.items() if _given(v)},
                 **{k: v for k, v in o.items() if _given(v)}}
            extra = args[1:]
            args = [*script.command, *extra]
            for more in script.components:  # `#SBATCH hetjob`: each later component runs the script too
                args += [":", *more, "--", *script.command, *extra]
            for line in script.warnings:
                print(f"hsched: warning: {line}", file=sys.stderr)
            if o.get("output") is None:
                # sbatch's default: the script's output in slurm-%j.out (slurm-%A_%a.out for an array task) in its
                # working folder, where scripts and people look for it; not where the submitter cannot write
                workdir = o.get("workdir") or os.getcwd()
                if os.access(workdir, os.W_OK):
                    o["output"] = "slurm-%A_%a.out" if o.get("array") else "slurm-%j.out"
        # the rest is the quick path's too (hsched/cli/submitting.py): one way to make and send the job
        submitting.submit(o, args, table, source)

    # `-h` is squeue's --noheader here (scripts write `squeue -h -o ...`); --help stays help
    @app.command(context_settings={"help_option_names": ["--help"]})
    @handle_errors
    def queue(
        all_jobs: bool = typer.Option(False, "--all", "-a", help="Include ended jobs."),
        me: bool = typer.Option(False, "--me", help="Only my jobs."),
        users: str | None = typer.Option(None, "--user", "-u", help="Only these users' jobs (comma-separated)."),
        states: str | None = typer.Option(
            None, "--states", "-t",
            help="Only jobs in these states, as squeue -t: names or codes, comma-separated (PD,R or "
                 "pending,running; ended states imply --all)."),
        fmt: str | None = typer.Option(
            None, "--format", "-o",
            help="squeue's -o: %i id, %j name, %u user, %t state code, %T state, %q qos, %p priority, "
                 "%b GPUs, %D nodes, %M time, %l time limit, %R nodes or reason, %V submit time, %S start "
                 "time, %r reason, %P or %f the constraint (partitions are labels); widths as %.10i (right) or "
                 "%10j (left)."),
        as_json: bool = typer.Option(False, "--json", help="A JSON list of job objects."),
        start: bool = typer.Option(False, "--start", help="The pending jobs and when and where each is predicted "
                                   "to start (squeue --start): the controller's round stepped through the "
                                   "running jobs' predicted ends."),
        jobs_given: str | None = typer.Option(None, "--jobs", "-j", help="Only these jobs (comma-separated: 12 for "
                                              "a whole array, 12_3 for one task), as squeue -j."),
        noheader: bool = typer.Option(False, "--noheader", "-h", help="No header line, as squeue -h."),
    ) -> None:
        """List jobs (pending and active; --all for every job). SQUEUE_FORMAT is the format when -o is not given."""
        from hsched.cli import listing

        listing.queue(all_jobs=all_jobs, me=me, users=users, states=states, fmt=fmt, as_json=as_json, start=start,
                      jobs_given=jobs_given, noheader=noheader)

    @app.command()
    @handle_errors
    def show(
        job_id: str = typer.Argument(..., metavar="JOB", autocompletion=complete.job_ids),
        as_json: bool = typer.Option(False, "--json", help="The job object with runs and events."),
    ) -> None:
        """Everything about one job: spec, placement, runs and events."""
        with _client() as c:
            from hsched.cli.control import job_ids_of

            job = c.call("show", id=job_ids_of(c, [job_id], whole_arrays=False)[0])
        if as_json:
            print_json(job)
            return
        from rich.console import Console
        from rich.markup import escape

        from hsched.learn.profiles import profile_line
        from hsched.theme import state_color

        con = Console(highlight=False, soft_wrap=True)  # long commands stay whole lines when piped
        color = state_color(job["state"])
        # what users wrote (names, commands, messages quoting them) is printed as text, never as rich markup
        con.print(f"[bold]Job {job.get('display_id', job['id'])}[/] {escape(job['name'])}  "
                  f"[{color}]{job['state']}[/]" + (f" ({escape(job['reason'])})" if job["reason"] else ""))
        rows = [
            ("user", job["user"]), ("qos / priority", f"{job['qos']} / {job['priority']}"
                                                      + (f" (set by {job['priority_by']})" if job.get("priority_by")
                                                         else "")),
            ("multifactor", _multifactor(job.get("priority_factors"))),
            ("command", " ".join(job["command"])),
            ("kind", job.get("kind") or "-"),
            ("workload", (job.get("workload") or "-") + (f" (service {job['service']}, replica {job['replica']})"
                                                          if job.get("service") else "")),
            ("progress", _progress_line(job.get("progress"), ended=job["state"] != "RUNNING")),
            ("profile", profile_line(job.get("profile"))),
            ("expected", _expected_line(job)),
            ("workdir", job.get("workdir") or "(the submit folder, where a node sees it)"),
            ("output", _files_line(job)),
            ("data", ", ".join(job.get("data") or ()) or "-"),
            ("resources", _resources_line(job["resources"])),
            ("constraint", job.get("constraint") or "-"),  # --partition's labels too (hsched.spec.constraints)
            ("submitted", job["submit_time"]), ("started", job["start_time"]), ("ended", job["end_time"]),
            ("time limit", _limit(job.get("time_limit_s"))),
            ("signals", f"checkpoint {job.get('checkpoint_signal')}"
                        + (f", warning {job['warn_signal']} before the limit" if job.get("warn_signal") else "")),
            ("exit code", job["exit_code"]), ("restarts", job["restarts"]),
            ("retries used", f"{job.get('retries_used', 0)} of "
                             f"{'the default' if job.get('retries') is None else job['retries']}"
                             + (f", next not before {job['begin_time']}" if job.get("begin_time")
                                and job["state"] == "PENDING" else "")),
            ("preemptions", _preemptions_line(job.get("preemptions") or {})),
            ("moves", _moves_line(job.get("moves") or [])),
            *([("elastic", _elastic_line(job)), ("resizes", _resizes_line(job.get("resizes") or []))]
              if job.get("elastic") else []),
            ("placement", _where(job) if job["placement"] else "-"),
            ("why there", job.get("placement_explanation") or "-"),
            ("checkpoint dir", job["checkpoint_dir"]),
        ]
        for k, v in rows:
            con.print(f"  {k:>15}: {'' if v is None else escape(str(v))}")
        if job.get("components"):
            from hsched.cli.listing import component_lines

            con.print("  [bold]components[/]")
            for line in component_lines(job["components"]):
                con.print(escape(f"    {line}"))
        if job["runs"]:
            con.print("  [bold]runs[/]")
            for r in job["runs"]:
                con.print(escape(f"    #{r['attempt']} {r['state']:<10} {r['node']} pid={r['pid']} "
                                 f"exit={r['exit_code']} {r['start_time'] or ''} -> {r['end_time'] or ''}"))
        con.print("  [bold]events[/]")
        for e in job["events"]:
            con.print(escape(f"    {e['time']}  {e['kind']:<12} {e['message']}"))

    @app.command()
    @handle_errors
    def wait(
        job_ids: list[str] = typer.Argument(..., metavar="JOB...", autocompletion=complete.job_ids),
        timeout: float | None = typer.Option(None, "--timeout", help="Give up after SECONDS (exit 1)."),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """Return when every job has ended; exit 0 only if all completed successfully."""
        from hsched.cli.control import job_ids_of

        deadline = time.monotonic() + timeout if timeout is not None else None
        with _client() as c:
            ids = job_ids_of(c, job_ids)  # an array's id waits for every task of it
            while True:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                chunk = 60.0 if left is None else min(60.0, left)
                reply = c.call("wait", ids=ids, timeout=chunk)
                if reply["done"] or (left is not None and left <= chunk):
                    break
        jobs = reply["jobs"]
        if as_json:
            print_json(jobs)
        else:
            for j in jobs:
                print(f"job {j.get('display_id', j['id'])}: {j['state']}" + (f" (exit code {j['exit_code']})"
                                                         if j["exit_code"] is not None else ""), file=sys.stderr)
        if not reply["done"]:
            print(f"hsched: timed out after {timeout:g} s", file=sys.stderr)
            raise typer.Exit(EXIT_FAILED)
        if not all(j["state"] == "COMPLETED" for j in jobs):
            raise typer.Exit(EXIT_FAILED)

    @app.command()
    @handle_errors
    def cancel(
        job_ids: list[str] = typer.Argument(None, metavar="[JOB...]", autocompletion=complete.job_ids),
        users: str | None = typer.Option(None, "--user", "-u", help="Every active job of these users "
                                         "(comma-separated), as scancel -u; the owner's or an admin's to cancel."),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """Cancel jobs: pending ones at once, running ones with SIGTERM, then SIGKILL."""
        from hsched.cli.control import each

        ids: list[str] = list(job_ids or [])
        if users:
            wanted = {u.strip() for u in users.split(",") if u.strip()}
            with _client() as c:
                # an array's task by its own name (`20_3`): `20` alone would stand for the whole array
                ids += [f"{j['array_id']}_{j['array_task']}" if j.get("array_id") is not None else str(j["id"])
                        for j in c.call("queue") if j["user"] in wanted]
            if not ids:
                return  # scancel -u of a user with no jobs: nothing to do, exit 0
        if not ids:
            raise UserError("hsched cancel: name the jobs (JOB...) or their users (-u USER)")
        each("cancel", ids, as_json)

    @app.command()
    @handle_errors
    def logs(
        job_id: str = typer.Argument(..., metavar="JOB", autocompletion=complete.job_ids),
        follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing as the job writes."),
        run: int | None = typer.Option(None, "--run", help="Which run (default: the latest)."),
        rank: int = typer.Option(0, "--rank", min=0, help="Which rank of a gang (each keeps its own log)."),
    ) -> None:
        """Print a job's output (stdout and stderr of its latest run; a gang's rank 0, or --rank N)."""
        out = sys.stdout.buffer
        offset = 0
        current_run = run
        with _client() as c:
            from hsched.cli.control import job_ids_of

            [the_id] = job_ids_of(c, [job_id], whole_arrays=False)
            while True:
                reply = c.call("logs", id=the_id, offset=offset, run=current_run, rank=rank)
                if current_run is None and reply.get("run") is not None:
                    # pinned to the run we started on: the next run's log is followed from its first byte
                    current_run = reply["run"]
                data = base64.b64decode(reply["data"])
                if data:
                    out.write(data)
                    out.flush()
                offset = reply["offset"]
                if data:
                    continue  # drain what is there before anything else
                if not follow:
                    break
                if current_run is not None and reply["ended"] and run is None:
                    # this run is over: on to the next one when there is one, as `tail -F` follows a new file
                    if _has_run(c, the_id, current_run + 1, rank):
                        current_run, offset = current_run + 1, 0
                        out.write(f"==> job {job_id}: run {current_run} <==\n".encode())
                        out.flush()
                        continue
                    if reply.get("state") not in ("PENDING", "LAUNCHING", "RUNNING", "PREEMPTING", "COMPLETING"):
                        break  # ended for good
                elif reply["ended"] and reply.get("state") not in ("PENDING", "LAUNCHING"):
                    break
                time.sleep(0.25)


def _has_run(c: Any, job_id: int, attempt: int, rank: int = 0) -> bool:
    try:
        c.call("logs", id=job_id, offset=0, run=attempt, max_bytes=1, rank=rank)
    except UserError:
        return False
    return True


def _moves_line(moves: list[dict[str, Any]]) -> str:
    """The policy's moves of the job to faster GPUs: from, to, and what each was expected to save."""
    if not moves:
        return "0"
    parts = []
    for m in moves:
        gain = m.get("gain_s")
        parts.append(f"{m.get('from')} -> {m.get('to')}"
                     + (f" (to save ~{gain / 60:.0f} min for {m.get('cost_s'):g} s)" if gain is not None else ""))
    return f"{len(moves)}: " + "; ".join(parts)


def _elastic_line(job: dict[str, Any]) -> str:
    """An elastic job's range and size now: `2-8 GPUs per node, now 8` (hsched.serialize.elastic_fields)."""
    text = f"{job['gpus_min']}-{job['gpus_max']} GPUs per node"
    if job.get("nodes_max", 1) != job.get("nodes_min", 1):
        text += f" on {job['nodes_min']}-{job['nodes_max']} nodes"
    now = job.get("gpus_now")
    return text + (f", now {now}" + (f" on {job['nodes_now']} nodes" if (job.get("nodes_now") or 1) > 1 else "")
                   if now is not None else ", not running")


def _resizes_line(resizes: list[dict[str, Any]]) -> str:
    """Its grows and shrinks: sizes and the speedup each expected (measured, or the prior)."""
    if not resizes:
        return "0"
    parts = []
    for r in resizes:
        speed = r.get("speedup")
        parts.append(f"{r.get('kind')} {r.get('from')} -> {r.get('to')}"
                     + (f" ({speed:.2f}x steps/s, {r.get('scaling')})" if speed is not None else ""))
    return f"{len(resizes)}: " + "; ".join(parts)


def _preemptions_line(p: dict[str, Any]) -> str:
    if not p.get("count"):
        return "0"
    frees = [t for t in p.get("time_to_free_s") or [] if t is not None]
    lost = p.get("lost_gpu_s")
    return (f"{p['count']}, {lost if lost is not None else 'N/A'} GPU-s lost"
            + (f", GPUs free {', '.join(f'{t:.1f}' for t in frees)} s after the decision" if frees else ""))


def _resources_line(r: dict[str, Any]) -> str:
    parts = [f"{r['gpus']} GPU" + ("s" if r["gpus"] != 1 else "")]
    if r.get("gpus_max") is not None and r["gpus_max"] > r["gpus"]:
        parts[0] = f"{r['gpus']}-{r['gpus_max']} GPUs (elastic)"
    if r.get("gpu_types"):
        parts.append("type " + "/".join(r["gpu_types"]))
    if r.get("gpu_memory_mib"):
        parts.append(f">= {r['gpu_memory_mib']} MiB each")
    if r.get("interconnect") == "nvlink":
        parts.append("NVLink")
    if r.get("cpus"):
        parts.append(f"{r['cpus']} CPUs")
    if r.get("memory_mib"):
        parts.append(f"{r['memory_mib']} MiB RAM")
    if r.get("offload"):
        parts.append("offloads to host memory")
    if r.get("shared"):
        parts.append("shared GPU")
    if r.get("nodes_max") is not None and r["nodes_max"] > r.get("nodes", 1):
        parts.append(f"x {r.get('nodes', 1)}-{r['nodes_max']} nodes (elastic)")
    elif r.get("nodes", 1) > 1:
        parts.append(f"x {r['nodes']} nodes")
    return ", ".join(parts)


