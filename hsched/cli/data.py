"""`hsched data`: the fleet file's datasets, where each is, and the copies under way; `hsched data scan` looks for
them at their declared paths (hsched.controller.data)."""

from __future__ import annotations

from typing import Any

import typer

from hsched.cli._common import handle_errors, print_json


def _size(n: int | None) -> str:
    from hsched.datasets import show_bytes

    return show_bytes(n) if n else "?"


def render_data(items: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    con = Console(highlight=False)
    if not items:
        con.print(Text("no datasets: declare them in the fleet file's [[dataset]] tables (docs/user-guide.md)",
                       style="dim"))
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("DATASET", "SIZE", "NODE", "STATE", "HOW", "PATH"):
        table.add_column(col, justify="right" if col == "SIZE" else "left", overflow="fold")
    copies: list[Text] = []
    for d in items:
        rows: list[tuple[str, str, str, str]] = []
        if d["shared"]:
            rows.append(("(every node)", "ready", "shared", d["path"] or ""))
        for w in d["where"]:
            state = w["state"] if not w["message"] else f"{w['state']}: {w['message']}"
            rows.append((w["node"], state, w["origin"], w["path"]))
        for t in d["transfers"]:
            rows.append((t["node"], "copying", t["why"], ""))
            pct = 100.0 * t["done"] / t["total"] if t["total"] else 0.0
            rate = t["done"] / t["seconds"] / 1e6 if t["seconds"] > 0 else 0.0
            who = f" for job {t['job_id']}" if t["job_id"] is not None else ""
            copies.append(Text(f"{d['name']} {t['from']} -> {t['node']}: {pct:.0f}% ({_size(t['done'])} of "
                               f"{_size(t['total'])}, {rate:.0f} MB/s), {t['why']}{who}"))
        if not rows:
            rows.append(("-", "nowhere yet", "", "hsched data scan looks at the declared paths"))
        for i, (node, state, how, path) in enumerate(rows):
            # names and paths are the lab's text: shown as written, never read as markup
            table.add_row(Text(d["name"]) if i == 0 else Text(""), _size(d["size"]) if i == 0 else "",
                          Text(node), Text(state), Text(how), Text(path))
    con.print(table)
    if copies:
        con.print()
        con.print(Text("copies under way:", style="bold"))
        for line in copies:
            con.print(Text("  ") + line)


def register(app: typer.Typer) -> None:
    data_app = typer.Typer(help="Datasets: where each is, copies under way, and a scan of the declared paths.",
                           invoke_without_command=True)
    app.add_typer(data_app, name="data")

    @data_app.callback()
    @handle_errors
    def data(ctx: typer.Context,
             as_json: bool = typer.Option(False, "--json", help="A JSON list of datasets, places and copies.")) -> None:
        """The fleet file's datasets: size, the nodes holding each (declared, found by a scan, or copied there by
        hsched) and the copies under way with their progress."""
        if ctx.invoked_subcommand is not None:
            return
        from hsched.client import Client

        with Client() as c:
            result = c.call("data")
        if as_json:
            print_json(result)
        else:
            render_data(result)

    @data_app.command("scan")
    @handle_errors
    def scan(as_json: bool = typer.Option(False, "--json", help="What was found, as JSON.")) -> None:
        """Look at each dataset's declared path on every node that is up and record its size there, or that it is
        absent: placement then knows where the data already is."""
        from rich.console import Console
        from rich.text import Text

        from hsched.client import Client

        with Client() as c:
            found = c.call("data_scan")
        if as_json:
            print_json(found)
            return
        con = Console(highlight=False)
        for f in found:
            if "error" in f:
                con.print(Text(f"{f['dataset']} on {f['node']}: could not look: {f['error']}"))
            elif f["present"]:
                con.print(Text(f"{f['dataset']} on {f['node']}: {f['path']} ({_size(f['bytes'])}, {f['files']} files)"))
            else:
                con.print(Text(f"{f['dataset']} on {f['node']}: not at {f['path']}"))
        if not found:
            con.print("nothing to scan: no dataset has a declared path on a node that is up", style="dim")
