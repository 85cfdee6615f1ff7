"""The live controller learns a kind's speed from real progress reports and places on it (issue 14, items 1-2).

Two simulated nodes, an H100 and a V100; the example trainer is told it runs 1.6x faster on a V100 (a model
that suits it better, against the accelerator table, which calls the H100 several times faster). Its runs
report progress into $HSCHED_PROGRESS; the node helper's monitoring stream carries the reports; the
controller learns steps/s per GPU type; the kind's next job goes to the V100 while a job of an unknown kind
still goes to the H100.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.conftest import Hs

REPO = Path(__file__).resolve().parents[2]
FLEET = """
[[node]]
name = "fast"
[node.simulate]
model = "NVIDIA H100 80GB HBM3"
count = 1

[[node]]
name = "slow"
[node.simulate]
model = "Tesla V100-SXM2-16GB"
count = 1
"""
TRAIN = [sys.executable, str(REPO / "examples" / "trainer.py"), "--steps", "60", "--step-seconds", "0.2",
         "--speed", "V100=1.6", "--model", "odd"]


def test_a_kinds_learned_speed_places_its_next_job(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.toml").write_text('poll_interval_s = 0.1\nmonitor_interval_s = 0.2\npolicy = "hsched"\n')
    h = Hs(home, fleet=fleet)
    try:
        # one of the kind on each type (the first to the H100, by the prior)
        first = h.run("submit", "--parsable", "--gpus", "1", "--", *TRAIN, check=True).stdout.strip()
        second = h.run("submit", "--parsable", "--gpus", "1", "--", *TRAIN, check=True).stdout.strip()
        assert h.run("wait", first, second, "--timeout", "120").returncode == 0
        nodes = {j: h.json("show", j)["placement"][0]["node"] for j in (first, second)}  # type: ignore[index]
        assert sorted(nodes.values()) == ["fast", "slow"]
        kinds = {k["kind"]: k for k in h.json("kinds")}  # type: ignore[union-attr]
        rates = {r["gpu_type"].lower(): r["steps_per_s"] for r in kinds["trainer.py model=odd"]["rates"]}
        v100 = next(v for t, v in rates.items() if "v100" in t)
        h100 = next(v for t, v in rates.items() if "h100" in t)
        # 5 and 8 steps a second, give or take a loaded machine's delays
        assert v100 > 1.2 * h100, rates
        kept = h.json("show", first)["progress"]  # type: ignore[index]
        assert kept["total"] == 60 and kept["steps_per_s"] > 0
        # the kind's next job goes where it ran fastest; an unknown kind still goes by the prior
        third = h.run("submit", "--parsable", "--hold", "--gpus", "1", "--", *TRAIN, check=True).stdout.strip()
        other = h.run("submit", "--parsable", "--hold", "--gpus", "1", "--", "sleep", "1", check=True).stdout.strip()
        h.run("release", third, other, check=True)
        assert h.run("wait", third, other, "--timeout", "120").returncode == 0
        assert h.json("show", third)["placement"][0]["node"] == "slow"  # type: ignore[index]
        assert h.json("show", other)["placement"][0]["node"] == "fast"  # type: ignore[index]
        text = h.run("kinds", check=True).stdout
        assert "trainer.py model=odd" in text and "V100" in text
    finally:
        h.stop()
