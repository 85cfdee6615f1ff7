"""Keep a DataTable equal to a keyed set of rows by touching only what changed (never a rebuild per tick)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from rich.text import Text
from textual.widgets import DataTable


def _cell(value: Any) -> Any:
    """What the table is given for a cell: a string as plain Text. Why: DataTable reads a `str` as Rich markup, at
    every repaint of every visible cell (64 GPUs and 500 jobs: most of a frame's paint), and a job named
    `[reverse]x` would restyle the dashboard; Text is drawn as it is."""
    return Text(value, no_wrap=True, end="") if isinstance(value, str) else value


class RowSync:
    """Adds, removes and updates rows of `table` in place.

    Each row comes from a hashable source object; a row whose source equals the one drawn last time is not even
    rendered again, so a frame where nothing changed costs a dictionary walk.
    """

    def __init__(self, table: DataTable[Any], columns: Sequence[str]) -> None:
        self.table = table
        self.columns = list(columns)
        self._source: dict[str, Hashable] = {}
        self._cells: dict[str, tuple[Any, ...]] = {}

    def keys(self) -> list[str]:
        return list(self._cells)

    def cells(self, key: str) -> tuple[Any, ...] | None:
        return self._cells.get(key)

    def apply(self, sources: Mapping[str, Hashable], render: Callable[[Any], tuple[Any, ...]]) -> bool:
        """Returns True when rows were added or removed (the caller may need to sort again)."""
        shape_changed = False
        for key in [k for k in self._cells if k not in sources]:
            self.table.remove_row(key)
            del self._cells[key]
            self._source.pop(key, None)
            shape_changed = True
        for key, source in sources.items():
            if key in self._cells and self._source.get(key) == source:
                continue
            self._source[key] = source
            if self.set_cells(key, render(source)):
                shape_changed = True
        return shape_changed

    def set_cells(self, key: str, cells: tuple[Any, ...]) -> bool:
        """Write one row; only the cells that differ reach the table. Returns True when a row was added."""
        old = self._cells.get(key)
        if old is None:
            self.table.add_row(*map(_cell, cells), key=key)
            self._cells[key] = cells
            return True
        for column, before, after in zip(self.columns, old, cells, strict=True):
            if before != after:
                self.table.update_cell(key, column, _cell(after))
        self._cells[key] = cells
        return False

    def update_cell(self, key: str, column: str, value: Any) -> None:
        """Change one cell if it differs (the clock uses this for elapsed times)."""
        cells = self._cells.get(key)
        if cells is None:
            return
        i = self.columns.index(column)
        if cells[i] != value:
            self.table.update_cell(key, column, _cell(value))
            self._cells[key] = (*cells[:i], value, *cells[i + 1:])

    def clear(self) -> None:
        self.table.clear()
        self._cells.clear()
        self._source.clear()
