"""`hsched logs --rank N` (issue 16): each rank of a gang keeps its own log; rank 0's is the default (it was the
last rank's), another is asked for by number, and a rank the run lacks is one clear error."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from hsched.controller.api import Api
from hsched.errors import UserError
from hsched.testing import Lab


async def test_each_rank_has_its_log(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        gang = await lab.submit("python3", "ddp.py", gpus=4, nodes=2)
        await lab.round()
        runs = await lab.runs(gang.id)
        assert sorted(r.rank for r in runs) == [0, 1]
        for r in runs:
            lab.executors[r.node].write_log(r.run_dir, f"rank {r.rank} says hi\n".encode())
        api = Api(lab.ctl)

        async def text(**args: object) -> str:
            reply = await api.handle("logs", {"id": gang.id, "offset": 0, **args}, os.getuid())
            return base64.b64decode(reply["data"]).decode()

        assert await text() == "rank 0 says hi\n"
        assert await text(rank=1) == "rank 1 says hi\n"
        reply = await api.handle("logs", {"id": gang.id, "offset": 0, "rank": 1}, os.getuid())
        assert (reply["rank"], reply["ranks"], reply["runs"]) == (1, 2, 1)
        with pytest.raises(UserError, match=r"--rank: run 1 of job \d+ has no rank 5 \(its ranks: 0, 1\)"):
            await text(rank=5)
