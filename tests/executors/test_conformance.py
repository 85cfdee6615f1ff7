"""One executor protocol, three transports: the fake, the local and the ssh executor pass the same conformance
check, the one any executor can run (hsched.testing.conformance; the Slurm executor's run is
tests/slurm/test_slurm_conformance.py).

Each check runs against every kind (the `node` fixture in conftest.py): the fake in memory, the local one with
real processes on this machine, the ssh one against a real sshd test host. Where the fake cannot run a command,
the check plays the command's part for it; everything else is asserted alike.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hsched.executors.base import LaunchRequest
from hsched.executors.fake import FakeExecutor

from hsched.model import RunHandle
from hsched.testing import CHECKS, ConformanceError, check_executor, fake_subject, run_check
from tests.executors.conftest import Node


@pytest.mark.parametrize("check", CHECKS)
async def test_conformance(node: Node, check: str, tmp_path: Path) -> None:
    """Every check applies to the fake, the local and the ssh executor: none is skipped."""
    assert await run_check(node, check, tmp_path / "scratch") is None


# ------------------------------------------------------------------------------------- the check itself


async def test_the_whole_check_in_one_call(tmp_path: Path) -> None:
    results = await check_executor(fake_subject(tmp_path / "runs"), tmp_path / "scratch")
    assert results == dict.fromkeys(CHECKS)


class _Forgetful(FakeExecutor):
    """A broken executor: a second launch of one run folder starts a second run."""

    async def launch(self, req: LaunchRequest) -> RunHandle:
        self.runs.pop(req.run_dir, None)
        return await super().launch(req)


class _Misnamed(FakeExecutor):
    kind = "local"


async def test_a_broken_executor_fails_the_check_that_names_it(tmp_path: Path) -> None:
    subject = fake_subject(tmp_path / "runs")
    forgetful = replace(subject, make=lambda: _Forgetful(remote_root="/node"))
    with pytest.raises(ConformanceError, match="fake executor, check launch_is_idempotent_per_run_dir: a second "
                                               "launch of one run folder returns the first run's handle"):
        await run_check(forgetful, "launch_is_idempotent_per_run_dir", tmp_path / "a")
    misnamed = replace(subject, make=_Misnamed)
    with pytest.raises(ConformanceError, match="check is_an_executor: kind: expected 'fake', got 'local'"):
        await check_executor(misnamed, tmp_path / "b")
    with pytest.raises(ValueError, match="no conformance check 'nope'"):
        await run_check(subject, "nope", tmp_path / "c")


async def test_a_check_the_subject_cannot_show_says_why(tmp_path: Path) -> None:
    subject = replace(fake_subject(tmp_path / "runs"), make_unreachable=None, same_machine=False)
    results = await check_executor(subject, tmp_path / "scratch")
    assert results["an_unreachable_node_raises_NodeUnreachable"] == \
        "the subject has no unreachable node (make_unreachable)"
    assert "needs the node's files on this machine" in str(results["dataset_requests_alike"])
    assert [n for n, why in results.items() if why is not None] == ["dataset_requests_alike",
                                                                     "an_unreachable_node_raises_NodeUnreachable"]
