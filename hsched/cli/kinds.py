"""`hsched kinds`: what hsched learnt of each job kind, from the jobs' progress reports, and the profile its
jobs usually show (hsched.learn.profiles)."""

from __future__ import annotations

from typing import Any

import typer

from hsched.cli._common import handle_errors, print_json


def render_kinds(kinds: list[dict[str, Any]]) -> None:
    """One table: a kind's first row has its job counts (NOW: queued or running, DONE: completed, the jobs its
    predictions learn from) and its usual profile; then one row per measured speed. (Two tables counted different
    jobs under one heading, and read as if they disagreed.)"""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("KIND", "NOW", "DONE", "PROFILE", "GPU", "GPUS", "PLACED", "STEPS/S", "RUNS", "WORKLOAD"):
        table.add_column(col, justify="right" if col in ("NOW", "DONE", "GPUS", "STEPS/S", "RUNS") else "left")
    for k in kinds:
        rates = k["rates"] or [None]
        for i, r in enumerate(rates):
            # a kind is the lab's text (a command's words): shown as written, never read as markup
            name = Text(k["kind"] or "(no kind)") if i == 0 else Text("")
            now = str(k["jobs_now"]) if i == 0 else ""
            done = str(k.get("completed", 0)) if i == 0 else ""
            profile = _profile(k) if i == 0 else ""
            workload = (k.get("workload") or "-") if i == 0 else ""  # issue 30: training, inference, preprocessing
            if r is None:
                table.add_row(name, now, done, profile, "-", "-", "-", "not measured", "0", workload)
            else:
                table.add_row(name, now, done, profile, r["gpu_type"], str(r["gpus"]), r["class"],
                              f"{r['steps_per_s']:.3g}", str(r["runs"]), workload)
    con = Console(highlight=False)
    if not con.is_terminal:
        # piped or captured: whole lines (a kind split over two rows is lost to grep), not 80 columns
        con = Console(highlight=False, width=240)
    con.print(table)
    if not kinds:
        con.print("no job kinds yet: jobs report progress with hsched.progress (docs/user-guide.md)",
                  style="dim")


def _profile(k: dict[str, Any]) -> str:
    """The kind's usual profile, short (`compute 4/5`: 4 of its last 5 profiled jobs), or `-`."""
    counts = k.get("profiles") or {}
    if not counts:
        return "-"
    best = k.get("profile") or "unknown"
    return f"{best.removesuffix('-bound')} {counts.get(best, 0)}/{sum(counts.values())}"


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
