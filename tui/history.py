"""Utilization history per device, kept client-side: the controller only sends the current value."""

from __future__ import annotations

from collections import deque

from hsched.tui.model import Frame

SAMPLES = 60


class History:
    def __init__(self, samples: int = SAMPLES) -> None:
        self.samples = samples
        self._util: dict[str, deque[float | None]] = {}

    def add(self, frame: Frame) -> None:
        """One sample per device per frame; devices that left the fleet are forgotten."""
        seen: set[str] = set()
        for node in frame.nodes:
            for d in node.devices:
                seen.add(d.uuid)
                self._util.setdefault(d.uuid, deque(maxlen=self.samples)).append(d.utilization_gpu)
        for uuid in set(self._util) - seen:
            del self._util[uuid]

    def get(self, uuid: str) -> tuple[float | None, ...]:
        return tuple(self._util.get(uuid, ()))
