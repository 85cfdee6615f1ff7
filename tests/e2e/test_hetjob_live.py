"""A heterogeneous pipeline live (issue 31): the CLI and the controller as real processes, the local executor's real
subprocesses and signals, on a simulated fleet of an L40S node and a node of two H100s. Three components (one on the
L40S, one on both H100s, one CPU-only) start together, each reads where the others run from its environment, and
the failure of one ends all three with the component named."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import pytest

from tests.conftest import SAFETY_S, Hs

pytestmark = pytest.mark.slow

FLEET = """
[[node]]
name = "l"
[node.simulate]
model = "NVIDIA L40S"
count = 1

[[node]]
name = "h"
[node.simulate]
model = "NVIDIA H100 80GB HBM3"
count = 2
topology = "nvswitch"
"""


@pytest.fixture
def lab(tmp_path: Path) -> Hs:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    h = Hs(tmp_path / "home", fleet=fleet)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "settings.toml").write_text("poll_interval_s = 0.2\nkill_after_s = 2\n")
    yield h
    h.stop()


def test_a_pipeline_starts_together_sees_the_others_and_ends_as_one(lab: Hs, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    d = shlex.quote(str(out))
    # each component records its environment, then: 0 and 2 wait (to be stopped), 1 waits until both others have
    # recorded theirs (they run at the same time as it) and fails
    record = f"env > {d}/c$HSCHED_COMPONENT.tmp && mv {d}/c$HSCHED_COMPONENT.tmp {d}/c$HSCHED_COMPONENT.env"
    wait = f"{record}; exec sleep 300"
    fail = f"{record}; while [ ! -e {d}/c0.env ] || [ ! -e {d}/c2.env ]; do sleep 0.05; done; exit 3"
    started = time.monotonic()
    sub = lab.run("submit", "--parsable", "-J", "pipe", "--gpus", "1", "--gpu-type", "l40s", "--", "sh", "-c", wait,
                  ":", "--gpus", "2", "--gpu-type", "h100", "--", "sh", "-c", fail,
                  ":", "--cpus", "1", "--", "sh", "-c", wait, check=True)
    job_id = sub.stdout.strip()
    lab.run("wait", job_id, "--timeout", str(int(SAFETY_S)), timeout=SAFETY_S + 30)
    shown = json.loads(lab.run("show", job_id, "--json", check=True).stdout)
    assert shown["state"] == "FAILED" and shown["exit_code"] == 3
    # the sleeps were stopped, not waited out
    assert time.monotonic() - started < 250
    assert [c["state"] for c in shown["components"]] == ["CANCELLED", "FAILED", "CANCELLED"]
    assert any(e["message"].startswith("component 1 (sh) exited with code 3") for e in shown["events"]), \
        shown["events"]
    envs = []
    for i in range(3):
        lines = (out / f"c{i}.env").read_text().splitlines()
        envs.append(dict(line.split("=", 1) for line in lines if "=" in line))
    for i, e in enumerate(envs):
        assert (e["HSCHED_COMPONENT"], e["HSCHED_COMPONENTS"], e["SLURM_HET_SIZE"]) == (str(i), "3", "3")
        assert (e["HSCHED_JOB_ID"], e["SLURM_HET_JOB_ID"]) == (job_id, job_id)
        assert e["SLURM_JOB_NODELIST_HET_GROUP_0"] == "l" and e["SLURM_JOB_NODELIST_HET_GROUP_1"] == "h"
        assert e["HSCHED_COMPONENT_0_HOSTS"] and e["HSCHED_COMPONENT_2_HOSTS"]
        assert [e[f"HSCHED_COMPONENT_{k}_PORT"] for k in range(3)] == [envs[0][f"HSCHED_COMPONENT_{k}_PORT"]
                                                                      for k in range(3)]
    queue = lab.run("queue", "--all", "-o", "%i %T", "-h", check=True).stdout.split("\n")
    assert [f"{job_id}+{i}" for i in range(3)] == [line.split()[0] for line in queue if line.startswith(job_id)]
    acct = lab.run("acct", "-j", job_id, "-o", "jobid,state,exitcode", "-P", "-n", check=True).stdout.split()
    assert acct == [f"{job_id}+0|CANCELLED|0:15", f"{job_id}+1|FAILED|3:0", f"{job_id}+2|CANCELLED|0:15"]
