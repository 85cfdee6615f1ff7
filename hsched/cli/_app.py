"""The Typer app: every command registered on one app, and `run()`, which runs it with the contract's one-line
usage errors. hsched/cli/__init__.py's `main()` comes here for everything its quick paths do not answer.

Heavy imports (textual, networkx, asyncio machinery) happen inside the commands that need them, so that
`hsched queue --json` stays fast.
"""

from __future__ import annotations

import typer

from hsched import __version__

app = typer.Typer(
    name="hsched",
    help="One intelligent queue for a small heterogeneous fleet of GPU machines.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion; job ids, nodes and QoS complete (hsched/cli/complete.py)
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"hsched {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """hsched: submit, watch and place GPU jobs across a small fleet."""


def _register() -> None:
    from hsched.cli import acct, control, daemon, fleet, jobs, sim, topo

    for mod in (jobs, control, acct, fleet, daemon, topo, sim):
        mod.register(app)
    from hsched.cli import dash; dash.register(app)  # noqa: E702, I001  (hsched dash, tui/)
    from hsched.cli import trust; trust.register(app)  # noqa: E702, I001  (hsched node trust; after fleet)
    from hsched.cli import share; share.register(app)  # noqa: E702, I001  (hsched share: fair share by user)
    from hsched.cli import eff; eff.register(app)  # noqa: E702, I001  (hsched eff: seff's role)
    from hsched.cli import kinds; kinds.register(app)  # noqa: E702, I001  (hsched kinds: learned speeds)
    from hsched.cli import replay; replay.register(app)  # noqa: E702, I001  (hsched replay: live vs simulator)
    from hsched.cli import data; data.register(app)  # noqa: E702, I001  (hsched data: datasets and copies)
    from hsched.cli import serve; serve.register(app)  # noqa: E702, I001  (hsched serve: services, issue 30)


_register()


def run() -> None:
    """Run the app on sys.argv. Usage mistakes (an unknown option, a bad value, a missing argument) are one line
    naming the option and the command's --help, exit 2, rather than the multi-line box Typer draws."""
    import sys

    from hsched.cli._common import permission_problem

    try:  # typer >= 0.2x carries its own click; older ones use click's
        from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError
    except ImportError:  # pragma: no cover - depends on the installed typer
        from click.exceptions import ClickException, NoArgsIsHelpError, UsageError  # type: ignore[no-redef]

    try:
        code = app(standalone_mode=False, prog_name="hsched")  # also `python -m hsched`: one completion variable
    except NoArgsIsHelpError as e:
        sys.stdout.write((e.ctx.get_help() if e.ctx else "") + "\n")
        sys.exit(0 if e.ctx is None or e.ctx.parent is None else 2)
    except UsageError as e:
        where = e.ctx.command_path if e.ctx else "hsched"
        message = " ".join(e.format_message().split())
        sys.stderr.write(f"hsched: error: {where}: {message} (see {where} --help)\n")
        sys.exit(2)
    except ClickException as e:
        sys.stderr.write(f"hsched: error: {' '.join(e.format_message().split())}\n")
        sys.exit(e.exit_code)
    except typer.Abort:
        sys.stderr.write("\n")
        sys.exit(130)
    except PermissionError as e:
        sys.exit(permission_problem(e))
    sys.exit(code if isinstance(code, int) else 0)
