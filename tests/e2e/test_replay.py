"""`hsched replay` (issue 14, item 8): a slice of a Gavel trace through a live controller of its own on
simulated nodes, next to the simulator's figures for the same jobs, cluster and policy."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tests.conftest import Hs

TRACE = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "gavel-msr" / "seed=0" / "ed69ec.trace"


def test_replay_of_a_trace_slice_comes_close_to_the_simulator(tmp_path: Path) -> None:
    h = Hs(tmp_path / "mine")  # the user's own home: a replay must not touch it
    p = h.run("replay", str(TRACE), "--max-jobs", "12", "--cluster", "v100:2,p100:2,k80:2", "--gpus-per-node", "2",
              "--wall", "15", "--keep", str(tmp_path / "replay"), "--json", timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout)
    assert out["jobs"] == 12 and out["live"]["jobs"] == 12
    # the acceptance figure (60 jobs on 12 GPUs within 10%) is measured in the closing note; a loaded CI
    # machine's delays are in the trace's seconds times the speedup, so this slice gets more room
    assert 0.75 < out["avg_jct_live_over_sim"] < 1.3, out
    assert not (tmp_path / "mine").exists()
    # time-sharing (the default): each job that outlived its first quantum checkpointed once on its own, which
    # proved it checkpoints, and the controller time-shared the jobs that had (a preempted run exiting 85)
    assert out["time_sharing"] is True
    db = sqlite3.connect(f"file:{tmp_path / 'replay' / 'hsched.db'}?mode=ro", uri=True)
    try:
        runs = dict(db.execute("SELECT state, COUNT(*) FROM runs WHERE exit_code = 85 GROUP BY state").fetchall())
    finally:
        db.close()
    assert runs.get("CHECKPOINTED", 0) >= 1, runs
    assert runs.get("PREEMPTED", 0) >= 1, runs
    # the controller it ran is stopped, and what it learnt is there to see
    kept = Hs(tmp_path / "replay")
    assert kept.controller_pid() is None
    kinds = kept.json("kinds")
    assert kinds and all(k["rates"] for k in kinds)  # type: ignore[union-attr]
    kept.stop()


def test_replay_refuses_bad_options_in_one_line(tmp_path: Path) -> None:
    h = Hs(tmp_path / "mine")
    p = h.run("replay", str(TRACE), "--knowledge", "psychic")
    assert p.returncode == 2 and p.stderr.strip() == "hsched: error: --knowledge 'psychic': expected table or learn"
