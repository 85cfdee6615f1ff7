"""What every CLI command shares: JSON output, one-line errors, exit codes (CONTRACT.md)."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import typer

from hsched.errors import ControllerError, ExecutorError, HschedError, UserError

F = TypeVar("F", bound=Callable[..., Any])

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def print_json(obj: Any) -> None:
    """One JSON document on stdout, nothing else there; indented for people, compact for pipes (faster)."""
    indent = 2 if sys.stdout.isatty() else None
    sys.stdout.write(json.dumps(obj, indent=indent, default=str) + "\n")
    sys.stdout.flush()


def error(message: str) -> None:
    for line in message.splitlines() or [message]:
        sys.stderr.write(f"hsched: error: {line}\n")


def die(message: str, code: int = EXIT_FAILED) -> NoReturn:
    error(message)
    raise typer.Exit(code)


def handle_errors(fn: F) -> F:
    """Turn hsched's errors into one clear line each and the contract's exit code; never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            for p in e.problems:
                error(p)
            raise typer.Exit(EXIT_USAGE) from None
        except (ControllerError, ExecutorError, HschedError) as e:
            die(str(e), EXIT_FAILED)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]
