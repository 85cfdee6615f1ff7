"""MIG on a live node (issue 15, item 5): seven 1g.10gb slices of a GPU in MIG mode run seven slice jobs at
once, the GPU is never handed out whole, a whole-GPU job gets whole GPUs only. The devices are made as the
controller makes them from NVML's MIG listing (hsched.controller.fleet.mig_devices); tests/topo/test_mig.py
covers NVML itself."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from hsched.controller.api import Api
from hsched.controller.fleet import mig_devices
from hsched.errors import UserError
from hsched.testing import CannedNode, Lab
from hsched.topo.place import topology_of_node

SLICES = 7


async def test_seven_slices_run_seven_jobs_and_never_a_whole_gpu_job(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=(CannedNode("h", "NVIDIA H100 80GB HBM3", 8),)) as lab:
        rt = lab.ctl.nodes["h"]
        parent, *rest = rt.node.devices
        parent = dataclasses.replace(parent, simulated=False)
        instances = [{"uuid": f"MIG-{k}", "name": "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "memory_total": 9984 << 20}
                     for k in range(SLICES)]
        rt.node = dataclasses.replace(rt.node, devices=(*mig_devices(parent, instances), *rest), links=())
        names = [d.name for d in topology_of_node(rt.node).devices]
        assert names[0] == "GPU1" and "GPU0.6" in names
        api = Api(lab.ctl)
        slice_spec = {"command": ["python3", "infer.py"], "resources": {"gpus": 1, "gpu_types": ["1g.10gb"]}}
        slices = [await api.handle("submit", {"spec": slice_spec}, os.getuid()) for _ in range(SLICES + 1)]
        big = await api.handle("submit", {"spec": {"command": ["python3", "train.py"], "resources": {"gpus": 7}}},
                               os.getuid())
        await lab.round()
        await lab.round()
        migs = {d.uuid for d in rt.node.devices if d.mig_parent}
        placed = [await lab.job(s["id"]) for s in slices]
        running = [j for j in placed if j.placement]
        assert len(running) == SLICES and {j.placement[0].devices[0] for j in running} == migs
        assert not placed[-1].placement  # the eighth waits for a slice
        whole = await lab.job(big["id"])
        assert whole.placement and not set(whole.placement[0].devices) & migs  # the 7 whole GPUs, no slice
        shown = await api.handle("show", {"id": slices[0]["id"]}, os.getuid())
        assert shown["placement"][0]["devices"][0].startswith("MIG-")
        # 7 whole GPUs here: a slice is no GPU, and an 8-GPU job is refused at once, saying so
        with pytest.raises(UserError, match="the most any node offers is 7"):
            await api.handle("submit", {"spec": {"command": ["true"], "resources": {"gpus": 8}}}, os.getuid())
