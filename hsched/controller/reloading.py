"""`hsched daemon reload` (and SIGHUP, and `systemctl reload hsched`): the fleet file and the settings read again,
checked whole before anything changes, what can change while the controller runs applied at once, and the rest named
as needing a restart.

What applies at once: every setting the controller reads as it goes (admins, QoS classes and who may use them, caps,
fair share, retries, timeouts, the socket's quotas, moves, prefetch...), and a fleet file whose nodes are unchanged
(its datasets). What needs a restart (`hsched daemon restart`, runs going on): the metrics address and `lab_group`
(bound when the controller started), and any change to the nodes (each node's executor, probes and monitoring are
made at start). Until then those keep their old values, so what runs is always one consistent configuration.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from hsched.config import Settings, load_fleet, load_settings

if TYPE_CHECKING:
    from hsched.controller.core import Controller

log = logging.getLogger(__name__)

AT_START = ("metrics", "lab_group")
"""Settings bound when the controller started: a reload keeps their old values and says a restart applies them."""


async def reload(ctl: Controller) -> dict[str, Any]:
    """Read fleet and settings again and apply what can change live; raises UserError (nothing changed) when either
    file is wrong. Returns {"applied": [keys], "restart_needed": [what], "fleet": path}."""
    # both read and checked before anything changes: a half-applied reload is a configuration nobody wrote
    settings = await asyncio.to_thread(load_settings, ctl.home.settings)
    fleet = await asyncio.to_thread(load_fleet, ctl.home.fleet_file())
    old = ctl.settings
    changed = [f.name for f in dataclasses.fields(Settings) if getattr(old, f.name) != getattr(settings, f.name)]
    later = [k for k in changed if k in AT_START]
    applied = [k for k in changed if k not in AT_START]
    restart_needed = [f"settings {k}" for k in later]
    ctl.settings = dataclasses.replace(settings, **{k: getattr(old, k) for k in later})
    before = {n.name: n for n in ctl.fleet_cfg.nodes}
    after = {n.name: n for n in fleet.nodes}
    nodes = sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))
    if nodes:
        restart_needed.append("fleet nodes " + ", ".join(nodes))
    elif fleet != ctl.fleet_cfg:
        applied.append("fleet")
        ctl.fleet_cfg = fleet
    log.info("reload: applied %s; a restart applies %s", ", ".join(applied) or "nothing",
             ", ".join(restart_needed) or "nothing more")
    if applied:
        ctl.poke()  # a new cap or class may start or stop jobs now
    return {"applied": applied, "restart_needed": restart_needed, "fleet": fleet.source}
