"""Controller commands (daemon start|stop|restart|status) and the demo on the simulated lab."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import typer

from hsched.cli._common import EXIT_FAILED, die, handle_errors, print_json

READY_TIMEOUT_S = 120.0
"""`daemon start` waits this long at most for every node's first probe (each ends within its timeout)."""


def _wait_ready(c: Any, info: dict[str, Any]) -> dict[str, Any]:
    """Ping until the controller has probed every node once and adopted what a previous one left (`ready`);
    an older controller that does not say is taken as ready."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while info.get("ready") is False and time.monotonic() < deadline:
        time.sleep(0.05)
        info = c.call("ping")
    return info


def _started(as_json: bool, info: dict[str, Any]) -> None:
    if as_json:
        print_json({"running": True, **info})
        return
    print(f"controller running (pid {info['pid']}) for {info['home']}")
    for name in info.get("unhealthy_nodes") or ():
        print(f"hsched: warning: node {name} is unhealthy (`hsched nodes` says why)", file=sys.stderr)


def _stop(timeout: float) -> int | None:
    """Stop this HSCHED_HOME's controller and wait for it to exit; its pid, or None if none ran."""
    from hsched.client import Client, controller_pid
    from hsched.errors import ControllerError, PermissionDenied

    client = Client(autostart=False)
    pid = controller_pid(client.home)
    try:
        with client as c:
            if pid is None and client.home.lab:  # a user cannot read the lab's lock: the controller says
                pid = c.call("ping").get("pid")
            c.call("stop")  # an admin's action in a lab: PermissionDenied (exit 1) for the others
    except PermissionDenied:
        raise
    except ControllerError:
        if pid is None:
            return None
    deadline = time.monotonic() + timeout
    while _still_running(client.home, pid):
        if time.monotonic() > deadline:
            print(f"hsched: error: controller (pid {pid}) did not stop within {timeout:g} s", file=sys.stderr)
            raise typer.Exit(EXIT_FAILED)
        time.sleep(0.05)
    return pid


def _lab_home(mark: bool = True) -> Any:
    """The lab's home, once this hsched is one every user can run (else exit 2, one line); marked as a lab's unless
    `mark` is false (`daemon install --print` shows what it would do and changes nothing)."""
    from hsched.errors import UserError
    from hsched.labsetup import install_problem
    from hsched.paths import Home

    problem = install_problem()
    if problem is not None:
        raise UserError(problem)
    home = Home.for_lab()
    if mark:
        home.mark_lab()
    return home


def _me() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _still_running(home: Any, pid: int | None) -> bool:
    from hsched.client import controller_pid

    if controller_pid(home) is not None:
        return True
    # a lab user cannot read the lock: the process itself (same pid namespace) says
    return pid is not None and home.lab and Path(f"/proc/{pid}").exists()


def register(app: typer.Typer) -> None:
    daemon_app = typer.Typer(help="The controller process for this HSCHED_HOME.", no_args_is_help=True)
    app.add_typer(daemon_app, name="daemon")

    @daemon_app.command("start")
    @handle_errors
    def start(
        as_json: bool = typer.Option(False, "--json"),
        lab: bool = typer.Option(False, "--lab", help="One controller for every user of this machine (run as "
                                 "root): state in /var/lib/hsched (or HSCHED_HOME), socket /run/hsched/hsched.sock."),
    ) -> None:
        """Start the controller (no-op if it runs); return once every node was probed once."""
        from hsched.client import Client

        home = _lab_home() if lab else None
        if home is not None and os.geteuid() != 0:
            # not root: a service account's lab, every node (this one included) reached through its installed
            # helper; say so, since a node without it is refused at its first probe
            print(f"hsched: the lab controller runs as {_me()}: it reaches every node through the helper "
                  "`hsched node helper-script` installs there (docs/lab.md: Set up a lab)", file=sys.stderr)
        with Client(home, start_lab=True) as c:
            info = _wait_ready(c, c.call("ping"))
        _started(as_json, info)

    @daemon_app.command("install")
    @handle_errors
    def install(
        print_only: bool = typer.Option(False, "--print", help="Print the unit instead of writing it."),
        user: str = typer.Option("root", "--user", help="The account the controller runs as (a service account "
                                 "needs the sudo rule of docs/lab.md (a service account) on every node)."),
    ) -> None:
        """Install the lab controller as a systemd service (hsched.service): restarted on failure, jobs kept
        running across its restarts (KillMode=process), its socket in /run/hsched."""
        from hsched.labsetup import UNIT_PATH, systemd_unit

        home = _lab_home(mark=not print_only)
        unit = systemd_unit(home, user=user)
        if print_only:
            sys.stdout.write(unit)
            return
        if os.geteuid() != 0:
            die(f"daemon install writes {UNIT_PATH}: run it as root (or --print the unit)")
        if user != "root":
            from hsched.labsetup import give_home

            try:
                give_home(home, user)  # the service account runs the controller: the lab's state is its own
            except KeyError:
                die(f"--user {user}: no such account here; `hsched node helper-script --install` makes it")
        UNIT_PATH.write_text(unit)
        os.chmod(UNIT_PATH, 0o644)
        print(f"wrote {UNIT_PATH}\nnext: systemctl daemon-reload && systemctl enable --now hsched")

    @daemon_app.command("stop")
    @handle_errors
    def stop(
        as_json: bool = typer.Option(False, "--json"),
        timeout: float = typer.Option(30.0, "--timeout", help="Seconds to wait for it to exit."),
    ) -> None:
        """Stop the controller cleanly. Running jobs keep running; the next start adopts them."""
        pid = _stop(timeout)
        if pid is None:
            print_json({"running": False, "pid": None}) if as_json else print("controller not running")
            return
        print_json({"running": False, "pid": None, "stopped": pid}) if as_json else print(f"controller {pid} stopped")

    @daemon_app.command("restart")
    @handle_errors
    def restart(
        as_json: bool = typer.Option(False, "--json"),
        timeout: float = typer.Option(30.0, "--timeout", help="Seconds to wait for the old one to exit."),
    ) -> None:
        """Stop the controller and start it again on this hsched (after an upgrade). Jobs keep running and are
        adopted by the new controller."""
        from hsched.client import Client

        old = _stop(timeout)
        # the controller it stopped: a lab's home is found by its marker once its socket is gone, so a lab started
        # without systemd restarts as the lab, never as root's personal controller
        with Client(start_lab=True) as c:
            info = _wait_ready(c, c.call("ping"))
        if old is not None and not as_json:
            print(f"controller {old} stopped", file=sys.stderr)
        _started(as_json, info)

    @daemon_app.command("reload")
    @handle_errors
    def reload(as_json: bool = typer.Option(False, "--json")) -> None:
        """Read the fleet file and the settings again (as SIGHUP and `systemctl reload hsched` do): both are checked
        first (a mistake changes nothing: one line per problem, exit 2), what can change while the controller runs
        is applied at once, and what needs `hsched daemon restart` is said. Admins only."""
        from hsched.client import Client

        with Client(autostart=False) as c:
            result = c.call("reload")
        if as_json:
            print_json(result)
            return
        applied = ", ".join(result.get("applied") or []) or "nothing changed"
        print(f"reloaded {result.get('fleet')} and the settings: {applied}")
        for what in result.get("restart_needed") or []:
            print(f"hsched: warning: {what}: applied by `hsched daemon restart` (runs go on)", file=sys.stderr)

    @daemon_app.command("status")
    @handle_errors
    def status(as_json: bool = typer.Option(False, "--json")) -> None:
        """Is a controller running for this HSCHED_HOME, and is it healthy? Exit 1 if it runs unhealthy or
        does not answer."""
        from hsched.cli.status import daemon_status

        code = daemon_status(as_json)
        if code:
            raise typer.Exit(code)

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
        from importlib import resources  # the demo's files: only the demo needs importlib.resources

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
                    # the user is who the kernel says connected; the controller takes no name from a request
                    job = c.call("submit", spec=table, source=str(path), environ=env)
                    print(f"submitted job {job['id']}: {job['name']}", file=sys.stderr)
                time.sleep(wait_s)
            nodes = c.call("nodes")
            queue = c.call("queue")
        render_nodes(nodes)
        print()
        render_queue(queue)
        print("\nnext: hsched queue | hsched show JOB | hsched logs -f JOB | hsched dash", file=sys.stderr)
