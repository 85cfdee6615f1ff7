"""The randomized fault history: 6 seeded histories (HSCHED_FAULT_SEEDS) of submits, cancels, preemptions,
controller kills, partitions and host reboots against 3 sshd hosts (200 in tests/bench/bench_faults.py), each
brought to rest and checked against every invariant. A failing seed writes a replayable report:
`python -m tests.faults.history --replay REPORT`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.cluster import Cluster, FaultHosts
from tests.faults.history import HISTORY_SETTINGS, run_history

pytestmark = pytest.mark.slow  # sshd hosts, a controller killed again and again, real runs

SEEDS = int(os.environ.get("HSCHED_FAULT_SEEDS", "6"))  # the suite stays under 20 min; bench_faults.py runs 200


@pytest.fixture(scope="module")
def lab(fault_hosts: FaultHosts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("history"), hosts=fault_hosts, gpus=2, settings=HISTORY_SETTINGS)
    try:
        c.start()
        yield c
    finally:
        for h in fault_hosts:
            if fault_hosts.is_cut(h):
                h.restore()
        c.close()


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = os.environ.get("HSCHED_FAULT_REPORTS")
    return Path(where) if where else tmp_path_factory.getbasetemp() / "fault-reports"


@pytest.mark.parametrize("seed", range(SEEDS))
def test_a_random_fault_history_keeps_every_invariant(lab: Cluster, fault_hosts: FaultHosts, reports: Path,
                                                      seed: int) -> None:
    res = run_history(lab, fault_hosts, seed, report_dir=reports)
    print(f"seed {seed}: {len(res.actions)} actions, {res.jobs} jobs {res.states}, {res.happened}, {res.seconds:.1f} s")
    assert not res.violations, (f"seed {seed}: {len(res.violations)} violations; replay with `python -m "
                                f"tests.faults.history --replay {res.report}`:\n  " + "\n  ".join(res.violations))
