"""The watch asks every node about its runs at once, under one deadline (issue 33): a node that does not answer by
then is logged and left to the next poll, and the other nodes' answers are acted on."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

import pytest
from hsched.executors.base import StatusQuery

from hsched.controller import watching
from hsched.model import JobState, RunReport
from hsched.testing import CannedNode, Lab

WAIT_S = 30.0
"""Only a bound on a hang: the waits below end on the watch's own deadline and on events."""


async def test_a_node_that_does_not_answer_holds_up_no_other(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    async with Lab.open(tmp_path, nodes=[CannedNode("n0", "NVIDIA H100 80GB HBM3", 8),
                                         CannedNode("n1", "NVIDIA H100 80GB HBM3", 8)]) as lab:
        a = await lab.submit("train", gpus=8)
        b = await lab.submit("train", gpus=8)
        await lab.round()
        jobs = {j.id: j for j in await lab.ctl.db(lab.ctl.store.jobs, states=[JobState.RUNNING])}
        assert set(jobs) == {a.id, b.id}
        silent = jobs[b.id].placement[0].node
        if jobs[a.id].placement[0].node == silent:
            pytest.fail("both jobs on one node")
        asked = asyncio.Event()
        cancelled = asyncio.Event()

        async def never(queries: Sequence[StatusQuery]) -> list[RunReport]:
            asked.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
            raise AssertionError("unreachable")

        monkeypatch.setattr(lab.executors[silent], "status", never)
        monkeypatch.setattr(watching, "STATUS_TIMEOUT_S", 0.05)
        await lab.finish(a.id)
        await lab.beat()
        with caplog.at_level(logging.WARNING, logger="hsched.watch"):
            async with asyncio.timeout(WAIT_S):
                assert await watching.watch_runs(lab.ctl)
        assert asked.is_set()
        async with asyncio.timeout(WAIT_S):
            await cancelled.wait()  # (the silent node's call is not left running)
        assert f"status from {silent} failed: no answer in 0.05 s" in caplog.text
        assert (await lab.ctl.db(lab.ctl.store.get_job, a.id)).state is JobState.COMPLETED  # type: ignore[union-attr]
        assert (await lab.ctl.db(lab.ctl.store.get_job, b.id)).state is JobState.RUNNING  # type: ignore[union-attr]
