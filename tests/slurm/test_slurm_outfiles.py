"""sbatch's own -o/-e/--open-mode on a Slurm node group, against the real two-node cluster (tests/slurm/cluster.py):
the job's expanded file names (relative to its working folder, a literal % kept) go to sbatch's --output/--error,
emptied at the job's first start and appended to by a requeued run; `hsched logs` (read_log) reads the -o file;
a gang's ranks write their -o/-e files through the rank dispatch."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest

from hsched.model import RunStatus
from tests.slurm.cluster import SlurmCluster
from tests.slurm.conftest import executor, run
from tests.slurm.test_slurm_executor import request, until
from tests.slurm.test_slurm_gang import launch_all, ranks

pytestmark = pytest.mark.slow  # a real Slurm cluster and its jobs

SAY = ("sh", "-c", 'echo "out $HSCHED_RUN"; echo "err $HSCHED_RUN" >&2')


async def text(path: Path | str) -> str:
    return await asyncio.to_thread(Path(path).read_text)


async def argv(run_dir: str) -> list[str]:
    """The sbatch argv slurm.json recorded for a run."""
    return list(json.loads(await text(Path(run_dir, "slurm.json")))["argv"])


def test_output_and_error_files_are_sbatchs_own_truncated_first_then_appended(slurm: SlurmCluster, runs: Path,
                                                                               tmp_path: Path) -> None:
    work = tmp_path / "work dir"
    work.mkdir()
    out, err = work / "50%-out.txt", work / "err.txt"
    out.write_text("an older job's output\n")  # (before the event loop)

    async def main() -> None:
        ex = executor(slurm)
        await ex.probe()
        first = request(runs / "61-1", SAY, job="61", env={"HSCHED_RUN": "1"}, workdir=str(work),
                        output="50%-out.txt", error="err.txt", truncate_output=True)
        h1 = await ex.launch(first)
        rep = await until(ex, first.run_dir, h1, RunStatus.EXITED)
        assert rep.exit_code == 0
        assert (await text(out), await text(err)) == ("out 1\n", "err 1\n")  # emptied first, as sbatch does
        words = await argv(first.run_dir)
        assert f"--output={work}/50%%-out.txt" in words and f"--error={work}/err.txt" in words
        assert "--open-mode=truncate" in words
        assert await ex.read_log(first.run_dir, 0) == b"out 1\n"  # hsched logs: the -o file
        assert await text(Path(first.run_dir, "output.log")) == ""
        # the requeued run appends (a run after the first never wipes the first's output)
        again = request(runs / "61-2", SAY, job="61", env={"HSCHED_RUN": "2"}, workdir=str(work),
                        output="50%-out.txt", error="err.txt", truncate_output=False)
        h2 = await ex.launch(again)
        await until(ex, again.run_dir, h2, RunStatus.EXITED)
        assert (await text(out), await text(err)) == ("out 1\nout 2\n", "err 1\nerr 2\n")
        assert "--open-mode=append" in await argv(again.run_dir)
        assert await ex.read_log(again.run_dir, 6) == b"out 2\n"
        # -o alone: stderr goes with it; no -o/-e: the run folder's log as ever, no --open-mode
        both = request(runs / "62-1", SAY, job="62", env={"HSCHED_RUN": "1"}, workdir=str(work),
                       output="both.txt", truncate_output=True)
        plain = request(runs / "63-1", SAY, job="63", env={"HSCHED_RUN": "1"})
        hb, hp = await ex.launch(both), await ex.launch(plain)
        await until(ex, both.run_dir, hb, RunStatus.EXITED)
        await until(ex, plain.run_dir, hp, RunStatus.EXITED)
        assert sorted((await text(work / "both.txt")).splitlines()) == ["err 1", "out 1"]
        assert sorted((await ex.read_log(plain.run_dir, 0)).decode().splitlines()) == ["err 1", "out 1"]
        assert not any(a.startswith("--open-mode") for a in await argv(plain.run_dir))

    run(main())


def test_a_gangs_ranks_write_their_output_and_error_files(slurm: SlurmCluster, runs: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()

    async def main() -> None:
        ex = executor(slurm)
        await ex.probe()
        cmd = ("sh", "-c", 'echo "rank $RANK out"; echo "rank $RANK err" >&2')
        reqs = [replace(r, workdir=str(work), output="ranks.out", error=f"rank{k}.err")
                for k, r in enumerate(ranks(runs, "64", 2, 1, cmd))]
        handles = await launch_all(ex, reqs)
        reps = [await until(ex, r.run_dir, h, RunStatus.EXITED) for r, h in zip(reqs, handles, strict=True)]
        assert [rep.exit_code for rep in reps] == [0, 0]
        # both ranks append to the one -o file; each its own -e file
        assert sorted((await text(work / "ranks.out")).splitlines()) == ["rank 0 out", "rank 1 out"]
        assert [await text(work / f"rank{k}.err") for k in (0, 1)] == ["rank 0 err\n", "rank 1 err\n"]
        for r in reqs:
            assert sorted((await ex.read_log(r.run_dir, 0)).decode().splitlines()) == ["rank 0 out", "rank 1 out"]

    run(main())
