"""`hsched kinds`: what hsched learnt of each job kind, from the jobs' progress reports, and the profile its
jobs usually show (hsched.profiles)."""

from __future__ import annotations

from typing import Any

import typer

from hsched.cli._common import handle_errors, print_json


def render_kinds(kinds: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("KIND", "JOBS", "GPU", "GPUS", "PLACED", "STEPS/S", "RUNS"):
        table.add_column(col, justify="right" if col in ("JOBS", "GPUS", "STEPS/S", "RUNS") else "left")
    for k in kinds:
        rates = k["rates"] or [None]
        for i, r in enumerate(rates):
            # a kind is the lab's text (a command's words): shown as written, never read as markup
            name = Text(k["kind"] or "(no command)") if i == 0 else Text("")
            jobs = str(k["jobs_now"]) if i == 0 else ""
            if r is None:
                table.add_row(name, jobs, "-", "-", "-", "not measured yet", "0")
            else:
                table.add_row(name, jobs, r["gpu_type"], str(r["gpus"]), r["class"], f"{r['steps_per_s']:.3g}",
                              str(r["runs"]))
    con = Console(highlight=False)
    con.print(table)
    # the usual profiles in a table of their own: a column more would squeeze the speeds' table past 80 columns
    profiled = [k for k in kinds if k.get("profiles")]
    if profiled:
        usual = Table(box=None, header_style="bold", pad_edge=False)
        usual.add_column("KIND")
        usual.add_column("USUAL PROFILE")
        usual.add_column("OF JOBS", justify="right")
        for k in profiled:
            counts = k["profiles"]
            best = k.get("profile")
            usual.add_row(Text(k["kind"] or "(no command)"), best or "unknown",
                          f"{counts.get(best or 'unknown', 0)}/{sum(counts.values())}")
        con.print()
        con.print(usual)
    if not kinds:
        con.print("no job kinds yet: jobs report progress with hsched.progress (docs/user-guide.md)",
                  style="dim")


def register(app: typer.Typer) -> None:
    @app.command()
    @handle_errors
    def kinds(as_json: bool = typer.Option(False, "--json", help="A JSON list of kinds and their speeds.")) -> None:
        """Job kinds and how fast each runs where: steps per second per GPU type, GPU count and placement
        (single GPU, NVLink, PCIe, spanning nodes), learnt from the jobs' progress reports."""
        from hsched.client import Client

        with Client() as c:
            result = c.call("kinds")
        if as_json:
            print_json(result)
        else:
            render_kinds(result)
