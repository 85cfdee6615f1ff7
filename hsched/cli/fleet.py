"""Fleet commands: nodes, node drain|resume|helper-script."""

from __future__ import annotations

from typing import Any

import typer

from hsched.cli import complete
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
        name: str = typer.Argument(..., autocompletion=complete.node_names),
        reason: str = typer.Option("", "--reason"), as_json: bool = typer.Option(False, "--json")
    ) -> None:
        """Start no new jobs on NAME (running ones go on)."""
        from hsched.client import Client

        with Client() as c:
            n = c.call("node_admin", name=name, action="drain", reason=reason)
        print_json(n) if as_json else print(f"{n['name']}: {n['state']}")

    @node_app.command("resume")
    @handle_errors
    def resume(name: str = typer.Argument(..., autocompletion=complete.node_names),
               as_json: bool = typer.Option(False, "--json")) -> None:
        """Put a drained node back in service."""
        from hsched.client import Client

        with Client() as c:
            n = c.call("node_admin", name=name, action="resume")
        print_json(n) if as_json else print(f"{n['name']}: {n['state']}")

    @node_app.command("helper-script")
    @handle_errors
    def helper_script(
        account: str = typer.Option("hsched", "--account", help="The service account the lab controller runs as."),
        key: str = typer.Option(None, "--key", help="The account's public key file (its id_ed25519.pub), "
                                "authorized for its SSH logins to the node."),
        prefix: str = typer.Option("/usr/local/libexec/hsched", "--prefix", help="Where the helper is installed."),
        root: str = typer.Option("/var/lib/hsched-node", "--root", help="The one folder the helper may touch: runs "
                                 "and checkpoints."),
        min_uid: int = typer.Option(1000, "--min-uid", help="The lowest uid a job may run as (never root)."),
        sudoers: str = typer.Option("/etc/sudoers.d/hsched", "--sudoers", help="The sudo rule's file."),
        install: bool = typer.Option(False, "--install", help="Run the script on this machine now (as root)."),
        keygen: bool = typer.Option(False, "--keygen", help="Give the account an SSH key of its own if it has "
                                    "none (on the controller's machine)."),
    ) -> None:
        """The script that prepares a node for a lab controller running as a service account (not root): run
        it as root on every node, this machine included. It installs the node helper root-owned, confined to
        one folder and starting jobs only as the lab's users, and a sudo rule that lets the account run
        exactly that helper (docs/lab.md: Set up a lab)."""
        import os
        import subprocess
        import sys
        from pathlib import Path

        from hsched.cli._common import EXIT_USAGE, die
        from hsched.labsetup import helper_script as make

        public = None
        if key is not None:
            try:
                public = Path(key).expanduser().read_text()
            except OSError as e:
                die(f"--key {key}: {e.strerror}; give the service account's public key file (ssh-keygen makes it)",
                    EXIT_USAGE)
        try:
            script = make(account=account, prefix=prefix, root=root, min_uid=min_uid, sudoers=sudoers,
                          public_key=public, keygen=keygen)
        except ValueError as e:
            die(str(e), EXIT_USAGE)
        if not install:
            sys.stdout.write(script)
            return
        if os.geteuid() != 0:
            die("node helper-script --install sets up sudo and an account: run it as root (or without --install "
                "to print the script)")
        done = subprocess.run(["sh", "-s"], input=script, text=True, check=False)
        if done.returncode != 0:
            raise typer.Exit(done.returncode)
