"""Elastic jobs end to end (issue 31's live acceptance): real processes, the local executor, one simulated node of
8 GPUs, and the example trainer (examples/elastic/trainer.py). An elastic job `--gpus 2-8` that proved it resumes
grows to 8 when a 6-GPU job ends, shrinks when four one-GPU jobs arrive (they start once it has checkpointed),
grows back when they end; the trainer's own record shows every step exactly once, at the world sizes it ran at,
and each run resumed from the checkpoint with its new size. The same on a fake clock: test_elastic.py."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Hs

pytestmark = pytest.mark.slow  # the controller, its node helper and the trainer are real processes

REPO = Path(__file__).resolve().parents[2]
FLEET = '[[node]]\nname = "n"\n[node.simulate]\nmodel = "NVIDIA H100 80GB HBM3"\ncount = 8\n'
SETTINGS = ('poll_interval_s = 0.1\nmonitor_interval_s = 0.2\npolicy = "hsched"\nmove_min_run_s = 6.0\n'
            'move_cost_s = 2.0\n')
STEPS = 100_000


def at(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def until(what: str, check: Callable[[], Any], timeout: float = 240.0) -> Any:
    """Poll `check` until it returns something true (an event to wait for, not a deadline: the timeout is only
    a bound on a hung test)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"waited {timeout:.0f} s for {what}")


def _lab(tmp_path: Path) -> tuple[Hs, Callable[[int, str], str], Callable[[str], dict[str, Any]],
                                  Callable[[str, int], bool]]:
    """A controller on the 8-GPU fleet, and what the tests ask it: submit a job that sleeps until its flag file
    exists (`sleeper`), `show` a job, whether a job runs at a size (`running_at`)."""
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.toml").write_text(SETTINGS)
    h = Hs(home, fleet=fleet)

    def sleeper(gpus: int, name: str) -> str:
        flag = tmp_path / name
        return h.run("submit", "--parsable", "--gpus", str(gpus), "--name", name, "--",
                     "sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.1; done", check=True).stdout.strip()

    def show(jid: str) -> dict[str, Any]:
        got = h.json("show", jid)
        assert isinstance(got, dict)
        return got

    def running_at(jid: str, size: int) -> bool:
        j = show(jid)
        return j["state"] == "RUNNING" and j.get("gpus_now") == size

    return h, sleeper, show, running_at


def test_elastic_trainer_grows_shrinks_and_grows_back_without_losing_a_step(tmp_path: Path) -> None:
    h, sleeper, show, running_at = _lab(tmp_path)

    def measured(*sizes: int) -> bool:
        """The kind's steps/s at these GPU counts are learnt (from the runs' progress reports, running ones too)."""
        kinds = {k["kind"]: k for k in h.json("kinds")}  # type: ignore[union-attr]
        return {r["gpus"] for r in kinds.get("elastic", {}).get("rates", [])} >= set(sizes)

    try:
        blocker = sleeper(6, "blocker")
        until("the blocker to run", lambda: show(blocker)["state"] == "RUNNING")
        job = h.run("submit", "--parsable", "--gpus", "2-8", "--checkpoint-signal", "USR1@60", "--kind", "elastic",
                    "--", sys.executable, str(REPO / "examples" / "elastic" / "trainer.py"), "--steps", str(STEPS),
                    "--step-seconds", "0.2", "--base-gpus", "2", "--requeue-after-steps", "10",
                    check=True).stdout.strip()
        # MIN fits beside the blocker: it starts at 2, requeues itself once (its proof) and runs at 2 again
        until("the proof and the restart at 2", lambda: running_at(job, 2) and show(job)["restarts"] == 1)
        time.sleep(7.0)  # (past its move_min_run_s at 2: a grow waits that out after a start)
        (tmp_path / "blocker").touch()
        until("the grow to 8", lambda: running_at(job, 8))
        # four one-GPU jobs arrive: it shrinks, and they start once it has checkpointed
        until("its speed at 8 GPUs to be measured", lambda: measured(2, 8))
        small = [sleeper(1, f"small{i}") for i in range(4)]
        until("the four small jobs to run", lambda: all(show(s)["state"] == "RUNNING" for s in small))
        until("the restart at 4", lambda: running_at(job, 4))
        until("its speed at 4 GPUs to be measured", lambda: measured(2, 4, 8))
        for i in range(4):
            (tmp_path / f"small{i}").touch()
        until("the grow back to 8", lambda: running_at(job, 8))

        def stepped_at_8() -> bool:
            # a progress report of the attempt now running, at 8 GPUs: a step ran there (the trainer reports after
            # each step), whatever the machine's load
            j = show(job)
            p = j.get("progress") or {}
            return p.get("attempt") == j["restarts"] + 1 and p.get("gpus") == 8

        until("a step at 8 after the grow back", stepped_at_8)
        h.run("cancel", job, check=True)
        until("the job to end", lambda: show(job)["state"] in ("CANCELLED", "CA", "COMPLETED", "CD"))
        shown = show(job)
        kinds = [(r["kind"], r["from"], r["to"]) for r in shown["resizes"]]
        assert kinds == [("grow", 2, 8), ("shrink", 8, 4), ("grow", 4, 8)], kinds
        ckdir = Path(shown["checkpoint_dir"])
        steps = [tuple(map(int, line.split())) for line in (ckdir / "steps.log").read_text().splitlines()]
        numbers = [s for s, _w in steps]
        assert numbers == list(range(1, len(numbers) + 1)), "a step lost or repeated"
        worlds = [w for _s, w in steps]
        runs = [w for i, w in enumerate(worlds) if i == 0 or worlds[i - 1] != w]
        assert runs == [2, 8, 4, 8], runs
        starts = (ckdir / "runs.log").read_text().splitlines()
        assert [line.split()[3] for line in starts] == ["2", "2", "8", "4", "8"], starts
        assert all("resume 1" in line for line in starts[1:])
        # the measured scaling: the last grow read 4 and 8 GPUs' steps/s from the runs' reports
        assert shown["resizes"][2]["scaling"] == "measured" and shown["resizes"][2]["speedup"] > 1.3
        # the controller's own times: the grow decided right after the blocker ended (a round is 0.1 s here),
        # the small jobs started right after its checkpoint (the shrink's stop)
        grow_s = at(shown["resizes"][0]["time"]) - at(show(blocker)["end_time"])
        started = max(at(show(s)["start_time"]) for s in small)
        shrink_s = started - at(shown["resizes"][1]["time"])
        stopped = [e for e in shown["events"] if e["kind"] == "preempted"]
        ckpt_s = stopped[1].get("data", {}).get("time_to_free_s") if len(stopped) > 1 else None
        # (the order only: how soon is the fake clock's to pin, tests/controller/test_elastic.py; here it is printed)
        assert grow_s >= 0.0 and shrink_s >= 0.0, (grow_s, shrink_s)
        print(f"\ngrow decided {grow_s:.2f} s after the GPUs freed; the four jobs started {shrink_s:.2f} s after the "
              f"shrink (its checkpoint freed the GPUs in {ckpt_s} s); {len(numbers)} steps, worlds {runs}; "
              f"speedup 4->8 measured {shown['resizes'][2]['speedup']:.2f}x")
    finally:
        for name in ["blocker", *(f"small{i}" for i in range(4))]:
            (tmp_path / name).touch()
        h.stop()


def test_elastic_trainer_resizes_in_place_without_a_restart(tmp_path: Path) -> None:
    h, sleeper, show, running_at = _lab(tmp_path)

    try:
        blocker = sleeper(6, "blocker")
        until("the blocker to run", lambda: show(blocker)["state"] == "RUNNING")
        # it never checkpointed: it says it resizes in place instead
        job = h.run("submit", "--parsable", "--gpus", "2-8", "--resize-signal", "USR2", "--kind", "inplace", "--",
                    sys.executable, str(REPO / "examples" / "elastic" / "trainer.py"), "--steps", str(STEPS),
                    "--step-seconds", "0.2", "--base-gpus", "2", "--in-place", check=True).stdout.strip()
        until("the start at 2", lambda: running_at(job, 2))
        time.sleep(7.0)  # (past move_min_run_s)
        (tmp_path / "blocker").touch()
        until("the grow to 8", lambda: running_at(job, 8))
        runs_log = Path(show(job)["checkpoint_dir"]) / "runs.log"

        def last_world() -> int | None:
            # the size the trainer took last, by its own record ("run R world N ...", "resize R world N in place
            # ..."): once it took a size, its next step runs at it whatever signal comes meanwhile. Waiting for this
            # event, not for the machine's speed: under load a shrink's signal came before the trainer had taken the
            # grow, and it went 2 -> 4 directly
            lines = runs_log.read_text().splitlines() if runs_log.exists() else []
            return int(lines[-1].split()[3]) if lines else None

        until("a step at world 8", lambda: last_world() == 8)
        small = [sleeper(1, f"small{i}") for i in range(4)]
        until("the four small jobs to run", lambda: all(show(s)["state"] == "RUNNING" for s in small))
        assert running_at(job, 4)
        until("a step at world 4", lambda: last_world() == 4)
        for i in range(4):
            (tmp_path / f"small{i}").touch()
        until("the grow back to 8", lambda: running_at(job, 8))
        until("a step at world 8 again", lambda: last_world() == 8)
        h.run("cancel", job, check=True)
        until("the job to end", lambda: show(job)["state"] in ("CANCELLED", "CA", "COMPLETED", "CD"))
        shown = show(job)
        assert shown["restarts"] == 0
        assert [(r["kind"], r["to"], r["in_place"]) for r in shown["resizes"]] == [
            ("grow", 8, True), ("shrink", 4, True), ("grow", 8, True)]
        started = max(at(show(s)["start_time"]) for s in small)
        shrink_s = started - at(shown["resizes"][1]["time"])
        ckdir = Path(shown["checkpoint_dir"])
        steps = [tuple(map(int, line.split())) for line in (ckdir / "steps.log").read_text().splitlines()]
        numbers = [s for s, _w in steps]
        assert numbers == list(range(1, len(numbers) + 1)), "a step lost or repeated"
        worlds = [w for _s, w in steps]
        assert [w for i, w in enumerate(worlds) if i == 0 or worlds[i - 1] != w] == [2, 8, 4, 8]
        lines = (ckdir / "runs.log").read_text().splitlines()
        assert [line.split()[0] for line in lines] == ["run", "resize", "resize", "resize"], lines
        print(f"\nin place: the four jobs started {shrink_s:.2f} s after the shrink; {len(numbers)} steps in one run, "
              "worlds 2, 8, 4, 8")
    finally:
        for name in ["blocker", *(f"small{i}" for i in range(4))]:
            (tmp_path / name).touch()
        h.stop()
