"""The Slurm test cluster (tests/slurm/cluster.py), started once per session and shared by every test here;
each test leaves no job behind. Skipped, with the reason, where it cannot run (not root, Slurm not installed:
`.ci/run` installs it)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hsched.executors.slurm.executor import SlurmExecutor

from tests.slurm.cluster import SlurmCluster, available

T = TypeVar("T")

TEST_DEADLINE_S = 120.0
"""A safety net: a hung Slurm call fails its test, not the run."""


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    why = available()
    if why is not None:
        pytest.skip(why)
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster, with every job cancelled after the test."""
    yield slurm_cluster
    slurm_cluster.cancel_all()


def executor(cluster: SlurmCluster, name: str = "grp", **kw: Any) -> SlurmExecutor:
    """A Slurm executor on the cluster's partition, its commands pointed at the cluster (SLURM_CONF)."""
    return SlurmExecutor(name=name, partition=cluster.partition, env=cluster.env, **kw)


def run(coro: Coroutine[Any, Any, T]) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(TEST_DEADLINE_S):
            return await coro

    return asyncio.run(bounded())


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """Where a test's run folders go (as the controller's runs/NODE/)."""
    p = tmp_path / "runs"
    p.mkdir()
    return p
