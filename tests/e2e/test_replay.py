"""`hsched replay` (issue 14, item 8): a slice of a Gavel trace through a live controller of its own on
simulated nodes, next to the simulator's figures for the same jobs, cluster and policy."""

from __future__ import annotations

import json
import sqlite3
import tomllib
from pathlib import Path

import pytest

from tests.conftest import Hs

TRACE = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "gavel-msr" / "seed=0" / "ed69ec.trace"


def _replay(tmp_path: Path, *extra: str, wall: float = 15) -> dict:
    h = Hs(tmp_path / "mine")  # the user's own home: a replay must not touch it
    p = h.run("replay", str(TRACE), "--max-jobs", "12", "--cluster", "v100:2,p100:2,k80:2", "--gpus-per-node", "2",
              "--wall", str(wall), "--keep", str(tmp_path / "replay"), "--json", *extra, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout)
    assert out["jobs"] == 12 and out["live"]["jobs"] == 12
    assert not (tmp_path / "mine").exists()
    return out


def _exit_85_runs(home: Path) -> dict[str, int]:
    db = sqlite3.connect(f"file:{home / 'hsched.db'}?mode=ro", uri=True)
    try:
        return dict(db.execute("SELECT state, COUNT(*) FROM runs WHERE exit_code = 85 GROUP BY state").fetchall())
    finally:
        db.close()


def test_replay_of_a_trace_slice_comes_close_to_the_simulator(tmp_path: Path) -> None:
    out = _replay(tmp_path, "--no-time-sharing")
    # the acceptance figure (60 jobs on 12 GPUs within 10%) is measured in the closing note; a loaded CI
    # machine's delays are in the trace's seconds times the speedup, so this slice gets more room
    assert 0.75 < out["avg_jct_live_over_sim"] < 1.3, out
    assert out["time_sharing"] is False and _exit_85_runs(tmp_path / "replay") == {}  # nobody stopped
    # the controller it ran is stopped, and what it learnt is there to see
    kept = Hs(tmp_path / "replay")
    assert kept.controller_pid() is None
    kinds = kept.json("kinds")
    assert kinds and all(k["rates"] for k in kinds)  # type: ignore[union-attr]
    kept.stop()


def test_replay_time_shares_jobs_that_proved_they_checkpoint(tmp_path: Path) -> None:
    # The live quantum is 12 restarts' cost, ~4.2 wall seconds whatever the speedup, so --wall sets how many quanta
    # a job lives. At --wall 15 the jobs' second attempts were mostly shorter than one: 0-2 time-sharing stops
    # (the simulator: 6), and a CI run with none failed here. At 30, 6-8 stops against the simulator's 7.
    out = _replay(tmp_path, "--time-sharing", wall=30)  # against the simulator's default
    assert out["time_sharing"] is True
    # each job that outlived its first quantum checkpointed once on its own, which proved it checkpoints, and the
    # controller then time-shared the jobs that had: preempted runs that exited 85 and resumed
    runs = _exit_85_runs(tmp_path / "replay")
    assert runs.get("CHECKPOINTED", 0) >= 1 and runs.get("PREEMPTED", 0) >= 1, runs
    # every such exit is one more attempt of its job, and the JSON counts them beside the simulator's stops
    assert out["live"]["restarts"] == sum(runs.values()), (out["live"], runs)
    assert out["sim"]["preemptions"] >= 0 and out["sim"]["migrations"] >= 0
    # against the simulator told what a stand-in's restart costs at this speedup (0.35 s of wall time), its default
    # (free restarts) beside it; on the 60-job slice avg JCT 1.086 of the default at --wall 600, 1.128 at --wall 300
    # (docs/performance.md). A loaded CI machine's delays are trace seconds times the speedup: a bound here
    assert out["restart_cost_s"] == pytest.approx(0.35 * out["speedup"]) and out["sim_default"]["avg_jct_s"] > 0
    assert 0.75 < out["avg_jct_live_over_sim"] < 2.0, out
    settings = tomllib.loads((tmp_path / "replay" / "settings.toml").read_text())
    # the policy's least run under that cost (12 x 0.35 s) and the simulator's round, over the speedup
    assert settings["move_min_run_s"] == pytest.approx(12 * 0.35)
    assert settings["policy_round_s"] == pytest.approx(360.0 / out["speedup"])
    Hs(tmp_path / "replay").stop()


def test_replay_refuses_bad_options_in_one_line(tmp_path: Path) -> None:
    h = Hs(tmp_path / "mine")
    p = h.run("replay", str(TRACE), "--knowledge", "psychic")
    assert p.returncode == 2 and p.stderr.strip() == "hsched: error: --knowledge 'psychic': expected table or learn"
    p = h.run("replay", str(TRACE), "--time-sharing", "--restart-cost", "nan")
    assert p.returncode == 2 and p.stderr.strip() == ("hsched: error: --restart-cost must be a number of wall seconds "
                                                      "from 0 to 3600 (0: the default, 0.35)")
