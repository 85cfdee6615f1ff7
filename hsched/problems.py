"""Problems found while reading a file a person wrote (a fleet file, settings, a job spec): one line each,
naming the file and the key, all raised at once as one ConfigError.

Below every reader of such files (hsched.config, hsched.datasets...), so each can take the collector without
importing the others.
"""

from __future__ import annotations

from typing import Any

from hsched.errors import ConfigError


class Problems:
    """Collects one line per problem, each naming the file and the key."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines: list[str] = []

    def add(self, key: str, message: str) -> None:
        where = f"{self.source}: {key}" if key else self.source
        self.lines.append(f"{where}: {message}")

    def expected(self, key: str, expected: str, found: Any) -> None:
        self.add(key, f"expected {expected}, found {shown(found)}")

    def raise_if_any(self) -> None:
        if self.lines:
            raise ConfigError(self.lines)


def shown(value: Any) -> str:
    """A value found in a TOML file as its reader would write it: 'a table', 'a list', true, "text"."""
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return repr(value)
