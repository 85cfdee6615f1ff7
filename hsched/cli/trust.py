"""`hsched node trust NAME`: fetch an ssh node's host key, show its fingerprint, add it to known_hosts.

The SSH executor refuses a host whose key known_hosts does not hold and says to run this command. It asks
before writing (or takes --yes); a key that has *changed* is never replaced here: the old line must be
removed by hand (`ssh-keygen -R`), so that a changed key is always a deliberate decision.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import typer

from hsched.cli import complete
from hsched.cli._common import EXIT_USAGE, die, handle_errors, print_json


def _node_app(app: typer.Typer) -> typer.Typer:
    """The `hsched node` group that hsched/cli/fleet.py registers, or a new one if it is not there."""
    for group in app.registered_groups:
        if group.name == "node" and group.typer_instance is not None:
            return group.typer_instance
    node_app = typer.Typer(help="Take a node out of service and back.", no_args_is_help=True)
    app.add_typer(node_app, name="node")
    return node_app


def _find_node(name: str) -> Any:
    from hsched.config import load_fleet
    from hsched.errors import UserError
    from hsched.paths import Home

    home = Home.from_env()
    if home.lab:
        from hsched.errors import PermissionDenied

        # the lab's known_hosts is the controller account's (root's, or a service account's): trusting a key
        # for everyone is an admin's call, made in that account's name
        try:
            owner = home.root.stat().st_uid
        except OSError:
            owner = 0
        if os.geteuid() != owner:
            import pwd

            try:
                account = pwd.getpwuid(owner).pw_name
            except KeyError:
                account = str(owner)
            how = f"sudo hsched node trust {name}" if owner == 0 else f"sudo -u {account} hsched node trust {name}"
            raise PermissionDenied(f"permission denied: the lab's known hosts are {account}'s, who runs its "
                                   f"controller: {how}")
    fleet = load_fleet(home.fleet_file())
    for n in fleet.nodes:
        if n.name == name:
            if n.executor == "slurm" and n.login:
                from hsched.executors.slurm.executor import login_config

                return login_config(n)  # a Slurm group reached over SSH: its login node's key
            if n.executor != "ssh":
                raise UserError(f"{fleet.source}: node {name!r} uses executor {n.executor!r}; only ssh nodes have "
                                "host keys to trust")
            return n
    names = ", ".join(n.name for n in fleet.nodes)
    raise UserError(f"{fleet.source}: no node named {name!r} (nodes: {names})")


def register(app: typer.Typer) -> None:
    node_app = _node_app(app)

    @node_app.command("trust")
    @handle_errors
    def trust(
        name: str = typer.Argument(..., help="The node's name in the fleet file.", autocompletion=complete.node_names),
        yes: bool = typer.Option(False, "--yes", "-y", help="Trust the key without asking."),
        as_json: bool = typer.Option(False, "--json", help="One JSON object: host, fingerprint, file, added."),
    ) -> None:
        """Fetch NAME's ssh host key, show its fingerprint and add it to known_hosts after confirmation."""
        import asyncio

        from hsched.executors import _sshconfig
        from hsched.executors.ssh import scan_host_key

        cfg = _find_node(name)
        scan = asyncio.run(scan_host_key(cfg))
        target, key = scan.target, scan.key
        info: dict[str, Any] = {"node": name, "host": target.known_hosts_name, "file": str(target.trust_file),
                                "fingerprint": _sshconfig.fingerprint(key), "added": False,
                                "already_trusted": scan.trusted}
        if scan.trusted:
            if as_json:
                print_json(info)
            else:
                print(f"{name}: {target.known_hosts_name} is already trusted ({info['fingerprint']})")
            return
        if scan.changed:
            die(f"{name}: HOST KEY CHANGED for {target.known_hosts_name}: it now offers {info['fingerprint']}, "
                f"not the key in known_hosts. If the change is expected, remove the old key with "
                f"ssh-keygen -R '{target.known_hosts_name}' -f {target.trust_file} and run this again.")
        msg = (f"{name}: {target.known_hosts_name} ({target.destination}) offers the host key\n"
               f"  {info['fingerprint']}")
        print(msg, file=sys.stderr if as_json else sys.stdout)
        if not yes:
            if not sys.stdin.isatty():
                die("not confirmed: run it in a terminal to answer, or add --yes", EXIT_USAGE)
            if not typer.confirm(f"Trust it and add it to {target.trust_file}?", default=False):
                die("not trusted: nothing written", 1)
        _sshconfig.append_known_host(target, key)
        info["added"] = True
        if as_json:
            print_json(info)
        else:
            print(f"added to {target.trust_file}; hsched will now connect to {name}")
