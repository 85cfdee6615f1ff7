"""`hsched serve start|list|show|scale|stop` (issue 30): services, each a router in the controller in front of
replicas that are jobs (hsched.controller.services).

    hsched serve start llm --replicas 1-4 --gpus-per-replica 1 --slo p99=300ms -- python server.py
    hsched serve start llm.toml            # a spec file's [service] table (the same keys)
    hsched serve show llm --json

Typer is imported only when one of these runs (hsched/cli/_app.py registers them); the plain paths of the CLI do
not pay for it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import typer

from hsched.cli._common import handle_errors, print_json
from hsched.errors import UserError


def _client() -> Any:
    from hsched.client import Client

    return Client()


def service_table(o: dict[str, Any], args: list[str], table: dict[str, Any]) -> dict[str, Any]:
    """The `[service]` table the controller gets: `table` (a spec file's, or empty) with the name or command in
    `args` and the options `o` over it. The replica's job keys go through `hsched submit`'s own mapping
    (hsched.cli.submitting.job_table), so --gpu-memory, --memory, --env mean what they mean there."""
    from hsched.cli.submitting import job_table
    from hsched.spec.service import parse_replicas, parse_slo, parse_window

    if o.get("replicas") is not None:
        parse_replicas(o["replicas"])  # the option's own line (--replicas ...), before anything is sent
        table["replicas"] = o["replicas"]
    if o.get("slo") is not None:
        parse_slo(o["slo"])
        table["slo"] = o["slo"]
    if o.get("stable_window") is not None:
        parse_window(o["stable_window"])
        table["stable_window"] = o["stable_window"]
    for key in ("target_concurrency", "ready_path", "port", "gpus_per_replica"):
        if o.get(key) is not None:
            table[key] = o[key]
    if o.get("ready_path") is not None and not str(o["ready_path"]).startswith("/"):
        raise UserError(f"--ready-path {o['ready_path']!r}: expected an HTTP path starting with / (e.g. /health)")
    if "slo" not in table:
        raise UserError("--slo: required, the latency objective (e.g. --slo p99=300ms)")
    job_o = {k: o.get(k) for k in ("gpu_type", "gpu_memory", "shared", "qos", "cpus", "memory", "env", "workdir",
                                   "kind")}
    if args[:1] == ["--"]:
        args = args[1:]
    if not args and "command" not in table:
        raise UserError("nothing to run: give the replica's command after -- (hsched serve start NAME --slo "
                        "p99=300ms -- python server.py)")
    return job_table(job_o, args, table)


def check(table: dict[str, Any], source: str) -> None:
    """What the controller would refuse, said here (as `hsched submit` does while no controller runs)."""
    from hsched.cli.submitting import check as check_job
    from hsched.model import JobSpec
    from hsched.spec.service import service_from_table, split_table

    own, job = split_table(table)
    check_job(job, source)
    service_from_table(own, JobSpec(command=("true",)), source)


def start(o: dict[str, Any], args: list[str]) -> None:
    """`serve start NAME [OPTIONS] -- CMD` or `serve start FILE.toml [OPTIONS]`."""
    table: dict[str, Any] = {}
    source = "<command line>"
    target = o.pop("target")
    if target.lower().endswith(".toml"):
        from hsched.config import read_toml

        path = Path(target).expanduser().absolute()
        whole = read_toml(path)
        section = whole.get("service")
        if not isinstance(section, dict):
            raise UserError(f"{path}: expected a [service] table (name, replicas, slo, command, resources, ...)")
        table = dict(section)
        source = str(path)
        if isinstance(table.get("workdir"), str):
            table["workdir"] = str((path.parent / table["workdir"]).expanduser())
    else:
        table["name"] = target
    table = service_table(o, args, table)
    table.setdefault("workdir", os.getcwd())
    environ = dict(os.environ)
    environ["PWD"] = os.getcwd()
    with _client() as c:
        if not c.reachable():
            check(table, source)  # fail fast, before a controller is started for it
        reply = c.call("serve", action="start", service=table, source=source, environ=environ)
    if o.get("as_json"):
        print_json(reply)
    else:
        r = reply["replicas"]
        print(f"Service {reply['name']} on {reply['address']}: {r['min']}-{r['max']} replicas, p99 target "
              f"{reply['slo_p99_ms']:g} ms")
        if reply.get("note"):
            print(f"hsched: note: {reply['note']}", file=sys.stderr)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.2f}%"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:g} ms"


def render_list(services: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("NAME", "USER", "STATE", "READY/WANTED", "MIN-MAX", "REQ/S", "P99", "SLO", "ATTAIN", "ADDRESS"):
        table.add_column(col, justify="right" if col in ("REQ/S", "P99", "SLO", "ATTAIN") else "left")
    for s in services:
        r = s["replicas"]
        table.add_row(escape(s["name"]), escape(s["user"]), s["state"], f"{r['ready']}/{r['wanted']}",
                      f"{r['min']}-{r['max']}", f"{s['requests_per_s']:g}", _ms(s.get("p99_ms")),
                      _ms(s["slo_p99_ms"]), _pct(s.get("slo_attainment")), s["address"])
    Console(highlight=False).print(table)


def render_show(s: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape

    con = Console(highlight=False)
    if "replicas" not in s:
        con.print(escape(f"service {s['name']} ({s['user']}): {s['state']}"))
    else:
        r = s["replicas"]
        rows = [
            ("name", s["name"]), ("user", s["user"]), ("state", s["state"]), ("address", s["address"]),
            ("replicas", f"{r['ready']} ready, {r['starting']} starting, {r['draining']} draining; wanted "
                         f"{r['wanted']} ({r['min']}-{r['max']})"),
            ("per replica", f"{s['gpus_per_replica']} GPU(s)" + (f" of {', '.join(s['gpu_types'])}"
                                                                 if s["gpu_types"] else "")
             + (", shared" if s["shared"] else "") + f", QoS {s['qos']}"),
            ("command", " ".join(s["command"])),
            ("slo", f"p99 {_ms(s['slo_p99_ms'])}; attainment {_pct(s.get('slo_attainment'))} of "
                    f"{s.get('requests') or 0} request(s)"),
            ("load", f"{s['requests_per_s']:g} req/s, p99 {_ms(s.get('p99_ms'))} (last 10 s)"),
            ("cold start", "-" if s.get("cold_start_s") is None else f"{s['cold_start_s']:g} s (median)"),
            ("last decision", s.get("last_decision") or "-"),
        ]
        for k, v in rows:
            con.print(f"[bold]{k:>14}[/]  {escape(str(v))}")
        for i in s.get("instances", []):
            con.print(escape(f"    replica {i['replica']}: job {i['job']} {i['phase']}"
                             + (f" on {i['node']} ({i['url']})" if i.get("node") else "")
                             + (f", cold start {i['cold_start_s']:.1f} s" if i.get("cold_start_s") is not None
                                else "")))
    events = s.get("events") or []
    if events:
        from hsched.serialize import iso

        con.print("[bold]events[/]")
        for e in events[-20:]:
            con.print(escape(f"    {iso(e['time'])}  {e['message']}"))


def register(app: typer.Typer) -> None:
    serve_app = typer.Typer(help="Services: replicas behind one address, scaled to meet a latency objective.",
                            no_args_is_help=True)
    app.add_typer(serve_app, name="serve")

    @serve_app.command("start")
    @handle_errors
    def start_cmd(
        target: str = typer.Argument(..., metavar="NAME|FILE.toml", help="The service's name, or a spec file with "
                                     "a [service] table."),
        args: list[str] = typer.Argument(None, help="-- COMMAND ARGS... (the replica's command)", show_default=False),
        replicas: str | None = typer.Option(None, "--replicas", help="MIN-MAX replicas (e.g. 1-4; default 1)."),
        gpus_per_replica: int | None = typer.Option(None, "--gpus-per-replica", min=0, help="GPUs of each replica."),
        gpu_type: list[str] = typer.Option(None, "--gpu-type", help="GPU models a replica may use (repeatable)."),
        gpu_memory: str | None = typer.Option(None, "--gpu-memory", help="GPU memory a replica needs (e.g. 20G)."),
        shared: bool = typer.Option(False, "--shared", help="Replicas may share a GPU with others (give "
                                    "--gpu-memory)."),
        qos: str | None = typer.Option(None, "--qos", help="The replicas' QoS class (prod preempts lower ones)."),
        slo: str | None = typer.Option(None, "--slo", help="The latency objective: p99=300ms."),
        target_concurrency: float | None = typer.Option(None, "--target-concurrency", min=0.001,
                                                        help="Requests in flight per replica to aim at (default 2)."),
        stable_window: str | None = typer.Option(None, "--stable-window", metavar="DURATION", help="The "
                                                 "autoscaler's stable window (default 60s; panic window a tenth, "
                                                 "scale-down delay a half)."),
        ready_path: str | None = typer.Option(None, "--ready-path", "--ready", help="HTTP path whose 2xx says a "
                                              "replica is ready (default: its port accepts)."),
        port: int | None = typer.Option(None, "--port", min=1, max=65535, help="The service's port (default: any "
                                        "free one, kept)."),
        cpus: int | None = typer.Option(None, "--cpus", "-c", min=1, help="CPUs of each replica."),
        memory: str | None = typer.Option(None, "--memory", "--mem", help="Host memory of each replica."),
        env: list[str] = typer.Option(None, "--env", help="NAME=VALUE for the replicas (repeatable)."),
        workdir: str | None = typer.Option(None, "--workdir", "-D", help="The replicas' working folder."),
        kind: str | None = typer.Option(None, "--kind", help="What the model is, for what hsched learns."),
        as_json: bool = typer.Option(False, "--json", help="The service object as JSON."),
    ) -> None:
        """Start a service: MIN..MAX replicas of CMD (each a job with HSCHED_SERVICE, HSCHED_REPLICA and HSCHED_PORT,
        the port it must listen on) behind one address that `serve show` prints."""
        o = {k: v for k, v in locals().items() if k != "args"}
        start(o, list(args or []))

    @serve_app.command("list")
    @handle_errors
    def list_cmd(as_json: bool = typer.Option(False, "--json", help="A JSON list of service objects.")) -> None:
        """The services: replicas ready and wanted, requests/s, p99 against the objective, attainment, address."""
        with _client() as c:
            reply = c.call("serve", action="list")
        print_json(reply) if as_json else render_list(reply)

    @serve_app.command("show")
    @handle_errors
    def show_cmd(name: str = typer.Argument(..., metavar="NAME"),
                 as_json: bool = typer.Option(False, "--json", help="The service object and its events as JSON.")
                 ) -> None:
        """One service: its replicas, its figures, its last scaling decision and its events."""
        with _client() as c:
            reply = c.call("serve", action="show", name=name)
        print_json(reply) if as_json else render_show(reply)

    @serve_app.command("scale")
    @handle_errors
    def scale_cmd(name: str = typer.Argument(..., metavar="NAME"),
                  replicas: str = typer.Argument(..., metavar="MIN-MAX"),
                  as_json: bool = typer.Option(False, "--json", help="The service object as JSON.")) -> None:
        """Change the replicas a service keeps between (its owner or a lab admin)."""
        from hsched.spec.service import parse_replicas

        parse_replicas(replicas, "MIN-MAX")
        with _client() as c:
            reply = c.call("serve", action="scale", name=name, replicas=replicas)
        if as_json:
            print_json(reply)
        else:
            r = reply["replicas"]
            print(f"Service {name}: {r['min']}-{r['max']} replicas (wanted {r['wanted']})")

    @serve_app.command("stop")
    @handle_errors
    def stop_cmd(name: str = typer.Argument(..., metavar="NAME"),
                 as_json: bool = typer.Option(False, "--json", help="The service object as JSON.")) -> None:
        """Drain every replica (no request cut), then stop them; the service ends (its owner or a lab admin)."""
        with _client() as c:
            reply = c.call("serve", action="stop", name=name)
        print_json(reply) if as_json else print(f"Service {name}: stopping (its replicas drain, then stop)")
