"""`hsched kinds`: what hsched learnt of each job kind, from the jobs' progress reports, and the profile its
jobs usually show (hsched.profiles)."""

from __future__ import annotations

from typing import Any

import typer

from hsched.cli._common import handle_errors, print_json


def _profile(k: dict[str, Any]) -> str:
    """The kind's most common profile, with how many of its jobs showed it (`input-bound (3 of 4)`), `-` with
    no job profiled (hsched.profiles)."""
    best, counts = k.get("profile"), k.get("profiles") or {}
    if not best:
        return "-" if not counts else "unknown"
    return f"{best} ({counts.get(best, 0)} of {sum(counts.values())})"


def render_kinds(kinds: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("KIND", "JOBS", "PROFILE", "GPU", "GPUS", "PLACED", "STEPS/S", "RUNS"):
        table.add_column(col, justify="right" if col in ("JOBS", "GPUS", "STEPS/S", "RUNS") else "left")
    for k in kinds:
        rates = k["rates"] or [None]
        for i, r in enumerate(rates):
            # a kind is the lab's text (a command's words): shown as written, never read as markup
            name = Text(k["kind"] or "(no command)") if i == 0 else Text("")
            jobs = str(k["jobs_now"]) if i == 0 else ""
            profile = _profile(k) if i == 0 else ""
            if r is None:
                table.add_row(name, jobs, profile, "-", "-", "-", "not measured yet", "0")
            else:
                table.add_row(name, jobs, profile, r["gpu_type"], str(r["gpus"]), r["class"],
                              f"{r['steps_per_s']:.3g}", str(r["runs"]))
    con = Console(highlight=False)
    con.print(table)
    if not kinds:
        con.print("no job kinds yet: jobs report progress with hsched.progress (README: Progress and kinds)",
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
