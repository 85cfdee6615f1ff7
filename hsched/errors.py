"""Errors that cross module boundaries.

    HschedError
    ├── UserError          bad input: names the file, the key, what was expected and what was found
    │   └── ConfigError    one or more problems in a TOML file (one line each)
    ├── ControllerError    the controller could not be reached or refused a request
    ├── PermissionDenied   lab mode: the job is another user's, or the action is for admins (exit 1)
    └── ExecutorError      a node could not do what was asked (launch, signal, probe)
        ├── NodeUnreachable    cannot reach it now (refused, reset, timed out, no route, DNS): try again later
        ├── NodeRefused        it turns us away in a way only a person can fix (host key, login, python3)
        ├── HelperError        the node helper answered one request with an error; the node itself is fine
        └── TransferError      one file copy failed (no such file, disk full there); the node itself is fine

Executors raise the subclasses, chosen from exception classes and exit statuses, never from message text;
`except ExecutorError` still catches them all.

The CLI turns a UserError into exit code 2 and one line per problem on stderr, never a traceback.
"""

from __future__ import annotations

import enum


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


class PermissionDenied(HschedError):
    """Lab mode: the peer may not do this (another user's job, an admin's action); nothing was changed."""


class ExecutorError(HschedError):
    """A node failed to probe, launch, signal or report."""

    retryable: bool = True
    """Whether the same call may succeed later without anyone doing anything."""


class NodeUnreachable(ExecutorError):
    """The node cannot be reached now: connection refused or reset, no answer in time, no route, a name that
    does not resolve, the link or the helper's channel gone. It may come back by itself."""


class Refusal(enum.StrEnum):
    """Why a node turns us away (what the person who fixes it has to look at)."""

    HOST_KEY_UNKNOWN = "host_key_unknown"
    """known_hosts holds no key for the node: `hsched node trust NAME`."""
    HOST_KEY_CHANGED = "host_key_changed"
    """The node offers a key other than the one known_hosts holds for it."""
    AUTH = "auth"
    """Our keys or user name were refused, or sshd does not let us open a session."""
    PYTHON = "python"
    """No python3 (>= 3.8) to run the node helper with."""
    CONFIG = "config"
    """Our side: an ssh config or key file that cannot be read or parsed."""
    INCOMPATIBLE = "incompatible"
    """No SSH algorithm or protocol version in common with the node."""


class NodeRefused(ExecutorError):
    """The node answers but refuses us in a way that needs a person: an unknown or changed host key, a
    refused login, no usable python3 there, an unreadable ssh config. Retrying changes nothing."""

    retryable = False

    def __init__(self, message: str, reason: Refusal = Refusal.AUTH) -> None:
        super().__init__(message, reason)
        self.reason = reason

    def __str__(self) -> str:
        return str(self.args[0])


class HelperError(ExecutorError):
    """The node helper answered one request with an error (or with output that is not its JSON reply):
    that request failed, the node and the connection to it are fine."""

    def __init__(self, message: str, command: str = "") -> None:
        super().__init__(message, command)
        self.command = command

    def __str__(self) -> str:
        return str(self.args[0])


class TransferError(ExecutorError):
    """One file transfer (put, get, a copy between nodes) failed on a file: no such file, no space, no
    permission. The node and the connection to it are fine."""
