"""The red line on top while the controller is unreachable; hidden while the stream flows."""

from __future__ import annotations

from textual.widgets import Static


class Banner(Static):
    DEFAULT_CSS = """
    Banner { dock: top; height: 1; background: $error; color: $text; text-style: bold; display: none;
             padding: 0 1; }
    Banner.shown { display: block; }
    """

    def lost(self, error: str, attempt: int) -> None:
        first = error.splitlines()[0] if error else "no answer"
        self.update(f"controller lost: {first[:160]}; reconnecting (try {attempt})")
        self.add_class("shown")

    def restored(self) -> None:
        self.remove_class("shown")
        self.update("")
