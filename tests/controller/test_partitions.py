"""The controller's partitions (issue 16): each node label of the fleet file with its nodes, what
`submit --partition` checks a name against (tests/cli/test_partition.py has the CLI's side)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from hsched.controller.api import Api
from hsched.testing import Lab


async def test_the_controller_lists_its_partitions(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        cfg = lab.ctl.fleet_cfg
        lab.ctl.fleet_cfg = dataclasses.replace(cfg, nodes=(dataclasses.replace(cfg.nodes[0], labels=("gpu", "nvme")),
                                                            dataclasses.replace(cfg.nodes[1], labels=("gpu",))))
        reply = await Api(lab.ctl).handle("partitions", {}, os.getuid())
        assert reply == {"partitions": {"gpu": ["a", "b"], "nvme": ["a"]}, "nodes": ["a", "b"]}  # names for -w/-x
