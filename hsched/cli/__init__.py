"""The `hsched` command line: a Typer app (hsched/cli/_app.py), each submodule registering its commands on it.

`main()`, the console script, answers the hottest commands without importing Typer, whose import (with the
click it carries, and the pydantic it loads to parse) costs several times a bare Python start: `hsched
--version`, a plain `hsched submit [OPTIONS] -- COMMAND` (hsched/cli/submitting.py), `hsched queue [OPTIONS]`
(hsched/cli/listing.py) and `hsched daemon status [--json]` (hsched/cli/status.py). Whatever a quick path is not
sure of (a spec file, a batch script, --help, a value it would have to check: hsched/cli/quick.py) goes to Typer,
which answers exactly as it always did. `from hsched.cli import app` still gives the Typer app (built on first
use).
"""

from __future__ import annotations

import os
import sys

from hsched import __version__

TYPE_CHECKING = False  # typing is left to the type checker: `hsched --version` does without its import
if TYPE_CHECKING:
    from typing import Any

    from hsched.cli._app import app as app


def main() -> None:
    """The console script (also `python -m hsched`)."""
    argv = sys.argv[1:]
    if "_HSCHED_COMPLETE" not in os.environ:  # shell completion is Typer's
        if argv == ["--version"]:
            sys.stdout.write(f"hsched {__version__}\n")
            sys.stdout.flush()
            sys.exit(0)
        if argv[:1] == ["submit"]:
            from hsched.cli.submitting import quick_submit

            code = quick_submit(argv[1:])
            if code is not None:
                sys.exit(code)
        elif argv[:1] == ["queue"]:
            from hsched.cli.listing import quick_queue

            code = quick_queue(argv[1:])
            if code is not None:
                sys.exit(code)
        elif argv[:2] == ["daemon", "status"]:
            from hsched.cli.status import quick_status

            code = quick_status(argv[2:])
            if code is not None:
                sys.exit(code)
    from hsched.cli._app import run

    run()


def __getattr__(name: str) -> Any:
    if name == "app":  # the Typer app, for tests and tools that drive it (typer.testing.CliRunner)
        from hsched.cli._app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
