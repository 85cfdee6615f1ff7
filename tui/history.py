"""Utilization and memory history per device, and CPU and memory per host, for the sparklines and the history
panel.

Seeded from the controller's own history (its `history` op: the last HISTORY samples it kept of every device,
one per monitoring sample, from before the dashboard opened) and merged with what each frame brings since.
Against a controller without that op the dashboard samples what it sees, one point per frame, as it always did.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from hsched.tui.model import Frame, HistoryDelta, Point, ts

SAMPLES = 60
"""Samples in a Fleet row's sparkline."""
KEEP = 300
"""Samples kept per series: as many as the controller keeps (hsched.controller.fleet.HISTORY)."""


class History:
    def __init__(self, samples: int = SAMPLES, keep: int = KEEP) -> None:
        self.samples = samples
        self.keep = keep
        self.served = False
        """True once the controller sent its history: from then on frames add no points of their own."""
        self.interval_s: float | None = None
        self._dev: dict[str, deque[Point]] = {}
        self._host: dict[str, deque[Point]] = {}

    def add(self, frame: Frame, deltas: Iterable[HistoryDelta] = ()) -> None:
        """Merge the controller's samples (`deltas`, else the frame's own), or sample the frame itself if the
        controller serves none; devices and hosts that left the fleet are forgotten."""
        given = list(deltas) or ([frame.history] if frame.history is not None else [])
        for delta in given:
            self.served = True
            if delta.interval_s:
                self.interval_s = delta.interval_s
            for uuid, points in delta.devices:
                self._merge(self._dev, uuid, points)
            for name, points in delta.hosts:
                self._merge(self._host, name, points)
        if not self.served:
            # one point per frame, whatever its time says (frames come once per stream interval)
            now = ts(frame.time) or 0.0
            for node in frame.nodes:
                for d in node.devices:
                    self._series(self._dev, d.uuid).append((now, d.utilization_gpu, d.memory_used_mib))
                if node.load is not None:
                    self._series(self._host, node.name).append((now, node.load.cpu_percent,
                                                                node.load.memory_used_mib))
        devices = {d.uuid for n in frame.nodes for d in n.devices}
        for uuid in set(self._dev) - devices:
            del self._dev[uuid]
        nodes = {n.name for n in frame.nodes}
        for name in set(self._host) - nodes:
            del self._host[name]

    def _series(self, table: dict[str, deque[Point]], key: str) -> deque[Point]:
        return table.setdefault(key, deque(maxlen=self.keep))

    def _merge(self, table: dict[str, deque[Point]], key: str, points: Iterable[Point]) -> None:
        # the controller sends each sample at most a few times (a catch-up starts at the last answer's time);
        # only points newer than the newest kept are taken, so a series never holds one twice
        series = self._series(table, key)
        last = series[-1][0] if series else float("-inf")
        for p in points:
            if p[0] > last:
                series.append(p)
                last = p[0]

    def get(self, uuid: str) -> tuple[float | None, ...]:
        """The device's last `samples` utilization readings (percent), oldest first: a Fleet sparkline."""
        series = self._dev.get(uuid, ())
        return tuple(p[1] for p in list(series)[-self.samples:])

    def device(self, uuid: str) -> tuple[Point, ...]:
        """Every kept sample of the device, oldest first."""
        return tuple(self._dev.get(uuid, ()))

    def host(self, node: str) -> tuple[Point, ...]:
        """Every kept sample of the node's host CPU and memory, oldest first."""
        return tuple(self._host.get(node, ()))
