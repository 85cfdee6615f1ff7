"""Profiles on a real controller (issue 14, item 3): two simulated nodes, jobs declaring their nature in
their environment (`--env HSCHED_SIM_NATURE=...`); the health loop's simulated readings feed their profiles,
and an idle job is flagged (event `idle`) once its GPUs have been idle past settings `idle_after_s`."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import Hs

FLEET = """
[[node]]
name = "nv"
[node.simulate]
model = "NVIDIA A100-SXM4-80GB"
count = 4
topology = "nvswitch"

[[node]]
name = "pcie"
[node.simulate]
model = "NVIDIA L4"
count = 2
topology = "pcie"
"""


def _until(what: str, cond: object, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:g} s"
        time.sleep(0.2)


@pytest.mark.slow  # runs a controller
def test_declared_natures_are_profiled_and_an_idle_job_flagged(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.toml").write_text("poll_interval_s = 0.1\nmonitor_interval_s = 0.2\nidle_after_s = 3\n")
    h = Hs(home, fleet=fleet)
    try:
        ids = {}
        for nature, gpus, gpu_type in (("communication-bound", 2, "A100"), ("idle", 1, "A100"),
                                       ("input-bound", 1, "L4"), ("memory-bound", 1, "L4")):
            ids[nature] = h.run("submit", "--parsable", "--gpus", str(gpus), "--gpu-type", gpu_type, "--env",
                                f"HSCHED_SIM_NATURE={nature}", "--", "sleep", "300", check=True).stdout.strip()

        def profiles() -> dict[str, str]:
            return {n: ((h.json("show", j)["profile"] or {}).get("profile") or "")  # type: ignore[index]
                    for n, j in ids.items()}

        _until("profile of each declared nature", lambda: all(n == p for n, p in profiles().items()))
        _until("idle event", lambda: "idle" in [e["kind"] for e in h.json("show", ids["idle"])["events"]])  # type: ignore
        shown = h.run("show", ids["idle"], check=True).stdout
        assert "profile: idle (flagged)" in shown and "(simulated readings)" in shown
        assert "profile: communication-bound" in h.run("show", ids["communication-bound"], check=True).stdout
    finally:
        h.stop()
