"""Gavel's seeds 1 and 2 of 0e4a51 in the fixtures keep seed 0's structure.

They were transcribed (tests/fixtures/README.md), so these are the checks that would catch a dropped,
doubled or shifted row, or a job type or step count copied wrongly: Gavel's seeds share every row's
arrival, GPU count and duration and re-draw only the job type, the step count following the type.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hsched.sim.trace import load_trace

GAVEL = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "gavel-msr"


def _rows(seed: int) -> list[list[str]]:
    return [line.split("\t") for line in (GAVEL / f"seed={seed}" / "0e4a51.trace").read_text().splitlines()]


@pytest.mark.parametrize("seed", [1, 2])
def test_rows_keep_seed0_arrivals_and_gpus(seed: int) -> None:
    base, other = _rows(0), _rows(seed)
    assert len(other) == len(base) == 1181
    assert [(r[5], r[6]) for r in other] == [(r[5], r[6]) for r in base]
    # the columns that follow from the job type are seed 0's for the same type
    by_type = {r[0]: r[1:4] for r in base}
    assert all(r[1:4] == by_type[r[0]] for r in other)
    # a row whose type the seed did not change keeps its step count
    same = [(a[4], b[4]) for a, b in zip(base, other, strict=True) if a[0] == b[0]]
    assert len(same) > 20 and all(x == y for x, y in same)


def test_steps_follow_one_rate_per_type_across_seeds() -> None:
    """steps = row duration x rate(type, GPUs): the ratio of two seeds' steps on a row is the ratio of the
    two types' rates, so every row with the same (type in seed 0, type in seed N, GPUs) gives one ratio."""
    base = _rows(0)
    for seed in (1, 2):
        ratios: dict[tuple[str, str, str], list[float]] = {}
        for a, b in zip(base, _rows(seed), strict=True):
            if int(a[4]) >= 10_000 and int(b[4]) >= 10_000:  # below that integer rounding dominates
                ratios.setdefault((a[0], b[0], a[6]), []).append(int(b[4]) / int(a[4]))
        spread = max(abs(math.log(max(v) / min(v))) for v in ratios.values())
        assert spread < 1e-3, (seed, spread)


@pytest.mark.parametrize("seed", [1, 2])
def test_seed_loads_with_the_shared_throughput_table(seed: int) -> None:
    tr = load_trace(GAVEL / f"seed={seed}" / "0e4a51.trace")
    assert len(tr.jobs) == 1181
    assert sum(j.gpus > 1 for j in tr.jobs) == sum(int(r[6]) > 1 for r in _rows(0))
