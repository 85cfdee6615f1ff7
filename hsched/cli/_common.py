"""What every CLI command shares: JSON output, one-line errors, exit codes (CONTRACT.md).

Typer-free at import: the quick paths of hsched/cli/__init__.py (`--version`, a plain `submit`) use this module
without loading Typer; only `die` and `handle_errors`, which raise Typer's Exit, import it, when they run.
"""

from __future__ import annotations

import functools
import json
import os
import sys

from hsched.errors import ControllerError, ExecutorError, HschedError, UserError

TYPE_CHECKING = False  # typing is left to the type checker: a quick `hsched submit` does without its import
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn, TypeVar

    F = TypeVar("F", bound=Callable[..., Any])

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def print_json(obj: Any) -> None:
    """One JSON document on stdout, nothing else there; indented for people, compact for pipes (faster)."""
    indent = 2 if sys.stdout.isatty() else None
    sys.stdout.write(json.dumps(obj, indent=indent, default=str) + "\n")
    sys.stdout.flush()


def error(message: str) -> None:
    for line in message.splitlines() or [message]:
        sys.stderr.write(f"hsched: error: {line}\n")


def die(message: str, code: int = EXIT_FAILED) -> NoReturn:
    import typer

    error(message)
    raise typer.Exit(code)


def exit_code_of(e: BaseException) -> int | None:
    """Say what `e` means to the user (one line per problem on stderr) and return the contract's exit code for
    it; None for an exception that is not hsched's to explain (it propagates as it is)."""
    if isinstance(e, UserError):
        for p in e.problems:
            error(p)
        return EXIT_USAGE
    if isinstance(e, ControllerError | ExecutorError | HschedError):
        error(str(e))
        return EXIT_FAILED
    if isinstance(e, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(e, BrokenPipeError):
        # the reader went away (`hsched queue | head`): stop quietly with 1, as Click does on Typer's paths;
        # stdout goes to /dev/null, or Python's own flush of it at exit fails again, with a traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_FAILED
    return None


def permission_problem(e: PermissionError) -> int:
    """A folder or file this user may not use (HSCHED_HOME elsewhere, a read-only mount): say which; exit 2."""
    where = f"{e.filename}: " if e.filename else ""
    sys.stderr.write(f"hsched: error: {where}{e.strerror}; check its permissions or set HSCHED_HOME\n")
    return EXIT_USAGE


def handle_errors(fn: F) -> F:
    """Turn hsched's errors into one clear line each and the contract's exit code; never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (HschedError, KeyboardInterrupt) as e:
            import typer

            code = exit_code_of(e)
            assert code is not None
            raise typer.Exit(code) from None

    return wrapper  # type: ignore[return-value]
