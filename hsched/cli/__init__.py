"""The `hsched` command line (Typer). Each submodule registers its commands on the one app.

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
    add_completion=False,
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
    from hsched.cli import control, daemon, fleet, jobs, sim, topo

    for mod in (jobs, control, fleet, daemon, topo, sim):
        mod.register(app)
    from hsched.cli import dash; dash.register(app)  # noqa: E702, I001  (hsched dash, tui/)
    from hsched.cli import trust; trust.register(app)  # noqa: E702, I001  (hsched node trust; after fleet)


_register()


def main() -> None:
    app()
