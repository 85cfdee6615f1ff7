"""The kill loop: 60 controller SIGKILLs (HSCHED_FAULT_KILLS) at random instants, interleaved with submits (1,000 in
tests/bench/bench_faults.py): no acknowledged submit is lost, none is stored twice, no job runs twice."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.faults.cluster import Cluster
from tests.faults.history import KILL_LOOP_FLEET, kill_loop

pytestmark = pytest.mark.slow  # 80 controllers started and killed, real runs

KILLS = int(os.environ.get("HSCHED_FAULT_KILLS", "60"))  # the suite stays under 20 min; bench_faults.py kills 1,000


def test_kill_loop_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    with Cluster(tmp_path / "lab", fleet_text=KILL_LOOP_FLEET) as lab:
        figures = kill_loop(lab, KILLS, seed=12)
    print(figures.line())
    assert figures.kills == KILLS and figures.acknowledged > 0
    assert figures.lost == 0 and figures.duplicates == 0 and figures.ran_twice == 0, figures.line()
    assert figures.never_ran == 0, figures.line()
    assert not figures.violations, "\n".join(figures.violations)
