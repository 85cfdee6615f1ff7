"""Messages the feed worker and the action workers post to the app (small dataclasses, STYLE.md)."""

from __future__ import annotations

from dataclasses import dataclass

from hsched.tui.model import Frame
from textual.message import Message


@dataclass
class FrameArrived(Message):
    """A new immutable frame from the controller's stream."""

    frame: Frame


@dataclass
class FeedLost(Message):
    """The stream broke; the feed retries and says how often it has tried."""

    error: str
    attempt: int


@dataclass
class FeedRestored(Message):
    """The stream is back after a loss."""
