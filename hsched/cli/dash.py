"""`hsched dash`: the live dashboard. Textual is imported inside the command only, so other commands stay fast."""

from __future__ import annotations

import typer

from hsched.cli._common import EXIT_USAGE, die, handle_errors


def register(app: typer.Typer) -> None:
    @app.command("dash")
    @handle_errors
    def dash(
        readonly: bool = typer.Option(False, "--readonly", help="Watch only: hide every action that changes "
                                      "jobs or nodes."),
        me: bool = typer.Option(False, "--me", help="Show only my jobs in the Jobs view (m toggles)."),
        interval: float = typer.Option(1.0, "--interval", help="Seconds between updates at most (the "
                                       "controller pushes a frame when something changes)."),
        view: str = typer.Option("fleet", "--view",
                                 help="The view to open: fleet, topology, jobs, events or processes."),
    ) -> None:
        """The live dashboard: fleet, topology, jobs, events, processes; `?` lists the keys."""
        import getpass
        import os

        from hsched.client import Client

        if interval <= 0:
            die("--interval: expected seconds above 0, e.g. --interval 1", EXIT_USAGE)
        if view not in ("fleet", "topology", "jobs", "events", "processes"):
            die(f"--view: expected fleet, topology, jobs, events or processes, found {view!r}", EXIT_USAGE)
        # start (or reach) the controller before the screen switches, so that a broken fleet file is one clear
        # line on the terminal rather than a banner
        with Client() as c:
            c.call("ping")
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = str(os.getuid())

        from hsched.paths import Home
        from hsched.tui.app import DashApp

        DashApp(Home.from_env(), readonly=readonly, me=user if me else None, user=user, interval=interval,
                view=view).run()
