"""GPU memory requests read as vendors write them (issue 15): `80G` is 80 GB, what an "80GB" card holds, so
it fits an H100 80GB (81,559 MiB); `80GiB` is 80 * 2^30 bytes and does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from hsched.config import job_spec_from_table, parse_gpu_memory_mib
from hsched.controller import commands
from hsched.errors import UserError
from hsched.testing import CannedNode, Lab


@pytest.mark.parametrize(("text", "mib"), [
    ("80G", 76293), ("80GB", 76293), ("80gb", 76293), ("80GiB", 81920), ("80Gi", 81920), ("40G", 38146),
    ("1.5T", 1430511), ("24000M", 22888), ("24000MiB", 24000), ("81559", 81559), (81559, 81559)])
def test_sizes_in_gb_and_gib(text: str | int, mib: int) -> None:
    assert parse_gpu_memory_mib(text) == mib


@pytest.mark.parametrize("bad", ["80X", "", "G80", "-1G", True])
def test_a_bad_size_is_refused(bad: str | bool) -> None:
    with pytest.raises(ValueError, match="GPU memory size such as 40G"):
        parse_gpu_memory_mib(bad)  # type: ignore[arg-type]


async def test_80g_fits_an_80gb_card_and_80gib_is_refused_naming_the_largest(tmp_path: Path) -> None:
    nodes = (CannedNode("h", "NVIDIA H100 80GB HBM3", 2),)
    async with Lab.open(tmp_path, nodes=nodes) as lab:
        assert lab.ctl.nodes["h"].node.devices[0].memory_total_mib == 81559
        spec = job_spec_from_table({"command": ["true"], "resources": {"gpus": 1, "gpu_memory": "80G"}}, "t")
        job = await commands.submit(lab.ctl, spec, "alice", None)
        await lab.round()
        assert len(await lab.runs(job.id)) == 1
        too_big = job_spec_from_table({"command": ["true"], "resources": {"gpus": 1, "gpu_memory": "80GiB"}}, "t")
        with pytest.raises(UserError, match=r"no GPU has .* of memory .*--gpu-memory"):
            await commands.submit(lab.ctl, too_big, "alice", None)
