"""Fleet commands: nodes, node drain|resume."""

from __future__ import annotations

from typing import Any

import typer

from hsched.cli._common import handle_errors, print_json


def _mib(v: int | None) -> str:
    if v is None:
        return "N/A"
    return f"{v / 1024:.0f}G" if v >= 1024 else f"{v}M"


def render_nodes(nodes: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from hsched.theme import NODE_STYLE

    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("NODE", "STATE", "EXEC", "CPUS", "MEMORY", "GPUS", "FREE", "MODEL"):
        table.add_column(col)
    # the note is folded, never cut: it may hold a host key fingerprint to compare with `ssh-keygen -l`
    table.add_column("NOTE", overflow="fold", min_width=20)
    for n in nodes:
        label, color = NODE_STYLE.get(n["state"], (n["state"].lower(), "white"))
        models = sorted({d["model"] for d in n["devices"]})
        # nothing is placed on a node that is probing, unhealthy or away: none of its GPUs is free to take
        takes_work = n["state"] in ("UP", "DRAINED")
        free = str(sum(1 for d in n["devices"] if d["job"] is None)) if takes_work else "-"
        # what nodes and users wrote is shown as text, never read as rich markup ("[10.0.0.2]:22", "[/]")
        table.add_row(Text(n["name"]), Text(label, style=color), n["executor"], str(n["cpus"] or "N/A"),
                      _mib(n["memory_total_mib"]), str(len(n["devices"])), free, Text(", ".join(models) or "-"),
                      Text(n.get("message") or ""))
    Console(highlight=False).print(table)


def register(app: typer.Typer) -> None:
    @app.command()
    @handle_errors
    def nodes(as_json: bool = typer.Option(False, "--json", help="A JSON list of node objects.")) -> None:
        """The fleet: every node, its state and its devices."""
        from hsched.client import Client

        with Client() as c:
            result = c.call("nodes")
        if as_json:
            print_json(result)
        else:
            render_nodes(result)

    node_app = typer.Typer(help="Take a node out of service and back.", no_args_is_help=True)
    app.add_typer(node_app, name="node")

    @node_app.command("drain")
    @handle_errors
    def drain(
        name: str, reason: str = typer.Option("", "--reason"), as_json: bool = typer.Option(False, "--json")
    ) -> None:
        """Start no new jobs on NAME (running ones go on)."""
        from hsched.client import Client

        with Client() as c:
            n = c.call("node_admin", name=name, action="drain", reason=reason)
        print_json(n) if as_json else print(f"{n['name']}: {n['state']}")

    @node_app.command("resume")
    @handle_errors
    def resume(name: str, as_json: bool = typer.Option(False, "--json")) -> None:
        """Put a drained node back in service."""
        from hsched.client import Client

        with Client() as c:
            n = c.call("node_admin", name=name, action="resume")
        print_json(n) if as_json else print(f"{n['name']}: {n['state']}")
