"""Controller commands (daemon start|stop|status) and the demo on the simulated lab."""

from __future__ import annotations

import os
import sys
import time
from importlib import resources
from pathlib import Path

import typer

from hsched.cli._common import EXIT_FAILED, handle_errors, print_json


def register(app: typer.Typer) -> None:
    daemon_app = typer.Typer(help="The controller process for this HSCHED_HOME.", no_args_is_help=True)
    app.add_typer(daemon_app, name="daemon")

    @daemon_app.command("start")
    @handle_errors
    def start(as_json: bool = typer.Option(False, "--json")) -> None:
        """Start the controller (no-op if it runs)."""
        from hsched.client import Client

        with Client() as c:
            info = c.call("ping")
        if as_json:
            print_json({"running": True, **info})
        else:
            print(f"controller running (pid {info['pid']}) for {info['home']}")

    @daemon_app.command("stop")
    @handle_errors
    def stop(
        as_json: bool = typer.Option(False, "--json"),
        timeout: float = typer.Option(30.0, "--timeout", help="Seconds to wait for it to exit."),
    ) -> None:
        """Stop the controller cleanly. Running jobs keep running; the next start adopts them."""
        from hsched.client import Client, controller_pid
        from hsched.errors import ControllerError

        client = Client(autostart=False)
        pid = controller_pid(client.home)
        try:
            with client as c:
                c.call("stop")
        except ControllerError:
            if pid is None:
                print_json({"running": False, "pid": None}) if as_json else print("controller not running")
                return
        deadline = time.monotonic() + timeout
        while controller_pid(client.home) is not None:
            if time.monotonic() > deadline:
                print(f"hsched: error: controller (pid {pid}) did not stop within {timeout:g} s", file=sys.stderr)
                raise typer.Exit(EXIT_FAILED)
            time.sleep(0.05)
        print_json({"running": False, "pid": None, "stopped": pid}) if as_json else print(f"controller {pid} stopped")

    @daemon_app.command("status")
    @handle_errors
    def status(as_json: bool = typer.Option(False, "--json")) -> None:
        """Is a controller running for this HSCHED_HOME?"""
        from hsched.client import Client, controller_pid
        from hsched.errors import ControllerError

        client = Client(autostart=False)
        pid = controller_pid(client.home)
        info: dict[str, object] = {"running": pid is not None, "pid": pid, "home": str(client.home.root)}
        if pid is not None:
            try:
                with client as c:
                    info.update(c.call("ping"))
            except ControllerError as e:
                info["error"] = str(e)
        if as_json:
            print_json(info)
        else:
            print(f"controller running (pid {pid}) for {client.home.root}" if pid else
                  f"controller not running for {client.home.root}")

    @app.command()
    @handle_errors
    def demo(
        jobs: bool = typer.Option(True, "--jobs/--no-jobs", help="Submit the example jobs."),
        wait_s: float = typer.Option(3.0, "--wait", help="Seconds to let jobs start before showing the queue."),
    ) -> None:
        """Run the simulated lab: install its fleet in HSCHED_HOME, submit example jobs, show nodes and queue."""
        from hsched.cli.fleet import render_nodes
        from hsched.cli.jobs import render_queue
        from hsched.client import Client, controller_pid
        from hsched.paths import Home

        home = Home.from_env()
        home.ensure()
        lab = resources.files("hsched.examples") / "lab"
        fleet = home.root / "fleet.toml"
        if not fleet.exists() and not os.environ.get("HSCHED_FLEET"):
            fleet.write_text((lab / "fleet.toml").read_text())
            print(f"installed the simulated lab fleet in {fleet}", file=sys.stderr)
            if controller_pid(home) is not None:
                with Client(home) as c:
                    c.call("stop")
                while controller_pid(home) is not None:
                    time.sleep(0.05)
        with Client(home) as c:
            if jobs:
                specs = sorted((p for p in (lab / "jobs").iterdir() if p.name.endswith(".toml")), key=lambda p: p.name)
                for spec in specs:
                    from hsched.config import job_spec_from_table, read_toml

                    path = Path(str(spec))
                    table = read_toml(path)
                    job_spec_from_table(table, str(path))
                    env = dict(os.environ)
                    job = c.call("submit", spec=table, source=str(path), user=os.environ.get("USER", "demo"),
                                 environ=env)
                    print(f"submitted job {job['id']}: {job['name']}", file=sys.stderr)
                time.sleep(wait_s)
            nodes = c.call("nodes")
            queue = c.call("queue")
        render_nodes(nodes)
        print()
        render_queue(queue)
        print("\nnext: hsched queue | hsched show JOB | hsched logs -f JOB | hsched dash", file=sys.stderr)
