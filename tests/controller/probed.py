"""A controller in-process over executors whose probe answers are canned (the node helper's own probe output),
started and probed: what the AMD and discovery-plugin tests share."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from hsched.executors.base import Executor

from hsched.config import FleetConfig, Settings
from hsched.controller.core import Controller
from hsched.controller.fleet import build_fleet
from hsched.controller.loops import start
from hsched.controller.store import Store
from hsched.paths import Home
from hsched.testing import FakeClock


@asynccontextmanager
async def probed_controller(tmp_path: Path, cfg: FleetConfig, executors: Mapping[str, Executor],
                            clock: FakeClock) -> AsyncIterator[Controller]:
    """The controller once every node's first probe has ended; stopped and closed on the way out."""
    home = Home(tmp_path / "home")
    home.ensure()
    store = Store(home.db)
    ctl = Controller(home, cfg, Settings(), store, nodes=build_fleet(cfg, transports=dict(executors)), clock=clock)
    try:
        await start(ctl)
        await asyncio.gather(*(rt.probe_task for rt in ctl.nodes.values()))  # type: ignore[misc]
        yield ctl
    finally:
        ctl.stopping.set()
        ctl.cancel_probes()
        await asyncio.gather(*ctl.probes, *ctl._tasks, return_exceptions=True)
        ctl.close()
        store.close()
