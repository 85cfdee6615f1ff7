"""Errors that cross module boundaries.

    HschedError
    ├── UserError          bad input: names the file, the key, what was expected and what was found
    │   └── ConfigError    one or more problems in a TOML file (one line each)
    ├── ControllerError    the controller could not be reached or refused a request
    └── ExecutorError      a node could not do what was asked (launch, signal, probe)

The CLI turns a UserError into exit code 2 and one line per problem on stderr, never a traceback.
"""

from __future__ import annotations


class HschedError(Exception):
    """Root of every error hsched raises on purpose."""


class UserError(HschedError):
    """The user's input is wrong; the message says where and how to fix it."""

    def __init__(self, message: str, *, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or [message]


class ConfigError(UserError):
    """Problems found while validating a TOML file: one line each, all reported at once."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems), problems=problems)


class ControllerError(HschedError):
    """The controller is unreachable, or answered with an error that is not the user's."""


class ExecutorError(HschedError):
    """A node failed to probe, launch, signal or report."""
