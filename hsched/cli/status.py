"""`hsched daemon status [--json]`, without Typer (hsched/cli/__init__.py's quick paths): scripts and monitoring
poll it, and Typer's import was most of its cost (issue 33: 5.5-10.9x `--version`)."""

from __future__ import annotations

import sys

from hsched.cli._common import EXIT_FAILED, EXIT_OK, print_json


def quick_status(argv: list[str]) -> int | None:
    """`hsched daemon status` with nothing or `--json` after it (argv after `status`): its exit code; None:
    anything else, Typer's turn (nothing was done)."""
    if argv not in ([], ["--json"]):
        return None
    from hsched.cli import quick

    said: list[int] = []
    code = quick.run(lambda: said.append(daemon_status(bool(argv))))
    return said[0] if said and code == EXIT_OK else code


def daemon_status(as_json: bool) -> int:
    """Print whether a controller runs for this HSCHED_HOME and is healthy; the exit code: 1 if it runs
    unhealthy or does not answer."""
    from hsched.client import Client, controller_pid
    from hsched.errors import ControllerError

    client = Client(autostart=False)
    pid = controller_pid(client.home)
    info: dict[str, object] = {"running": pid is not None, "pid": pid, "home": str(client.home.root),
                               "mode": client.home.mode, "socket": str(client.home.socket)}
    if pid is None and client.home.lab:
        # a user cannot read the lab's lock file: the controller answering is what says it runs
        try:
            with client as c:
                info.update(c.call("ping"))
            pid = info.get("pid")  # type: ignore[assignment]
            info["running"] = True
        except ControllerError as e:
            info["error"] = str(e)
    if pid is not None and "api" not in info:
        try:
            with client as c:
                info.update(c.call("ping"))
        except ControllerError as e:
            info["error"] = str(e)
            info["health"] = "unknown"
            info["health_error"] = f"the controller does not answer: {e}"
    # a controller that does not answer is as good as an unhealthy one; one from before health reports
    # (no `health` field) is taken at its word that it runs
    unhealthy = pid is not None and (info.get("health") == "unhealthy" or "error" in info)
    if as_json:
        print_json(info)
    elif pid is None:
        print(f"{'lab ' if client.home.lab else ''}controller not running for {client.home.root}")
    else:
        print(f"{'lab ' if info.get('mode') == 'lab' else ''}controller running (pid {pid}) for "
              f"{info.get('home', client.home.root)}: {info.get('health', 'unknown')}")
        if unhealthy:
            print(f"hsched: error: {info.get('health_error') or 'unhealthy'}", file=sys.stderr)
    if unhealthy:
        return EXIT_FAILED
    return EXIT_OK
