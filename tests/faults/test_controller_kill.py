"""The controller dies (SIGKILL) while jobs run on two SSH hosts, while a job ends or vanishes, inside the launch
window, and between retries: on restart it reattaches, takes end times and exit codes from the nodes' exit
records, neither loses nor duplicates a job, and keeps the retry count."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import process_gone
from tests.faults.cluster import Cluster, FaultHosts, wait_for
from tests.faults.conftest import job_script, starts
from tests.procs import processes

pytestmark = pytest.mark.slow  # real sshd hosts, controllers and runs


@pytest.fixture(scope="module")
def lab(fault_hosts: FaultHosts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("ctlkill"), hosts=fault_hosts, gpus=2,
                settings={"lease_s": 120, "retry_backoff_s": 1.0, "retry_backoff_max_s": 8.0})
    try:
        c.start()
        yield c
    finally:
        c.close()


def run_dir_on_host(hosts: FaultHosts, run: dict[str, Any]) -> Path:
    h = hosts.host(run["node"])
    name = run["run_dir"].rstrip("/").rsplit("/", 1)[-1]
    return wait_for(lambda: next(iter(h.root.glob(f"runs/*/{name}")), None), f"the run folder {name} on {h.name}")


def test_sigkill_with_jobs_on_two_hosts_reattaches(lab: Cluster) -> None:
    gate = lab.root / "gate-reattach"
    ids = [lab.submit(job_script(lab.marks, f"while [ ! -e {gate} ]; do sleep 0.1; done; exit 3"), gpus=2)
           for _ in range(2)]
    running = [lab.wait_state(j, "RUNNING") for j in ids]
    nodes = {j["placement"][0]["node"] for j in running}
    assert len(nodes) == 2, nodes  # a whole host each: two hosts
    wait_for(lambda: all(starts(lab.marks, j) for j in ids), "both jobs to start")
    before = {(p.pid, p.run_name) for p in lab.processes() if p.comm == "sh"}
    assert len(before) == 2
    lab.kill()
    assert before <= {(p.pid, p.run_name) for p in lab.processes()}  # the runs outlive their controller
    lab.start()
    st = lab.read()
    for j in ids:
        assert st.job(j)["state"] == "RUNNING" and len(st.runs_of(j)) == 1  # reattached, not relaunched
    gate.touch()
    for j in ids:
        job = lab.wait_state(j, "FAILED")
        assert job["exit_code"] == 3 and len(lab.read().runs_of(j)) == 1
        assert len(starts(lab.marks, j)) == 1
    lab.quiesce()
    lab.check()


def test_a_job_ending_while_the_controller_is_down_keeps_its_end_time_and_exit_code(
        lab: Cluster, fault_hosts: FaultHosts) -> None:
    gate = lab.root / "gate-down"
    ended = lab.root / "ended-at"
    jid = lab.submit(job_script(lab.marks, f"while [ ! -e {gate} ]; do sleep 0.05; done; "
                                           f"date +%s.%N > {ended}; exit 5"))
    lab.wait_state(jid, "RUNNING")
    [run] = lab.read().runs_of(jid)
    folder = run_dir_on_host(fault_hosts, run)
    lab.kill()
    gate.touch()
    record = wait_for(lambda: (folder / "exit.json").exists() and json.loads((folder / "exit.json").read_text()),
                      "the node's exit record")
    real_end = float(ended.read_text())
    # downtime: the controller comes back well after the job ended (3 s: more than the 1 s allowed)
    wait_for(lambda: time.time() > real_end + 3.0, "3 s of downtime")
    lab.start()
    job = lab.wait_state(jid, "FAILED")
    [run] = lab.read().runs_of(jid)
    assert job["exit_code"] == 5 and run["exit_code"] == 5
    assert abs(run["end_time"] - real_end) <= 1.0, (run["end_time"], real_end, record)
    assert abs(job["end_time"] - real_end) <= 1.0, (job["end_time"], real_end, record)
    lab.quiesce()
    lab.check()


def test_a_job_vanishing_while_the_controller_is_down_is_lost_then_retried(
        lab: Cluster, fault_hosts: FaultHosts) -> None:
    # run 1 waits forever (it is killed while no controller runs); run 2 ends at once
    jid = lab.submit(job_script(lab.marks, 'if [ "$HSCHED_RUN" = 1 ]; then exec sleep 600; fi; exit 0'), retries=1)
    lab.wait_state(jid, "RUNNING")
    wait_for(lambda: starts(lab.marks, jid), "the job to start")
    [run] = lab.read().runs_of(jid)
    folder = run_dir_on_host(fault_hosts, run)
    lab.kill()
    # the wrapper first (it would record the job's death), then the job; then no exit record at all
    wrappers = [p.pid for p in processes() if b"_wrap" in p.argv and any(a.endswith(folder.name.encode())
                                                                          for a in p.argv)]
    assert wrappers, "the run's wrapper on its node"
    mine = [p.pid for p in lab.processes() if p.run_name == folder.name]
    for pid in wrappers + mine:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: all(process_gone(p) for p in wrappers + mine), "the run's processes to die")
    (folder / "exit.json").unlink(missing_ok=True)
    lab.start()
    job = lab.wait_state(jid, "COMPLETED", "FAILED", "LOST", "CANCELLED")
    runs = lab.read().runs_of(jid)
    assert runs[0]["state"] == "LOST" and runs[0]["exit_code"] is None
    assert job["state"] == "COMPLETED" and len(runs) == 2, (job["state"], job["reason"], [r["state"] for r in runs])
    assert lab.read().events_of(jid, "retry"), [e["kind"] for e in lab.read().events_of(jid)]
    lab.quiesce()
    lab.check()


def test_a_crash_in_the_launch_window_neither_duplicates_nor_loses(lab: Cluster, fault_hosts: FaultHosts) -> None:
    """Kill the controller as soon as a job's run is recorded (LAUNCHING), before its launch is recorded: on
    restart the run is launched once (never reached the node) or adopted (reached it; the reply was lost)."""
    outcomes = []
    for i in range(4):
        jid = lab.submit(job_script(lab.marks, "sleep 0.5; exit 0"), name=f"window-{i}")

        def recorded(jid: int = jid) -> dict[str, Any] | None:
            runs = lab.read().runs_of(jid)
            return runs[0] if runs else None

        run = wait_for(recorded, "the run's record", every_s=0.002)
        was = run["state"]
        lab.kill()
        h = fault_hosts.host(run["node"])
        name = run["run_dir"].rstrip("/").rsplit("/", 1)[-1]
        outcomes.append((was, "reached the node" if any(h.root.glob(f"runs/*/{name}")) else "not launched"))
        lab.start()
        job = lab.wait_state(jid, "COMPLETED", "FAILED", "LOST", "CANCELLED")
        assert job["state"] == "COMPLETED", (job["state"], job["reason"])
        assert len(lab.read().runs_of(jid)) == 1 and len(starts(lab.marks, jid)) == 1, outcomes
    print("launch window kills:", outcomes)
    lab.quiesce()
    lab.check()


def test_retries_count_across_a_controller_restart(lab: Cluster) -> None:
    """`hsched submit --retries 2 -- sh -c 'exit 1'`: exactly 3 runs, backoff visible in events, though the
    controller is killed between the retries."""
    proc = lab.hs.run("submit", "--parsable", "--retries", "2", "--", "sh", "-c", "exit 1")
    assert proc.returncode == 0, proc.stderr
    jid = int(proc.stdout.strip())
    lab.record.add("submit", jid, True)
    lab.wait_event(jid, "retry", 1)
    lab.kill()
    lab.start()
    job = lab.wait_state(jid, "FAILED", "COMPLETED", "LOST", "CANCELLED")
    st = lab.read()
    runs = st.runs_of(jid)
    retries = st.events_of(jid, "retry")
    assert job["state"] == "FAILED" and job["exit_code"] == 1, (job["state"], job["reason"])
    assert len(runs) == 3 and [r["attempt"] for r in runs] == [1, 2, 3], [(r["attempt"], r["state"]) for r in runs]
    assert len(retries) == 2, [e["message"] for e in retries]
    # the backoff is visible: each retry started no sooner than its backoff after the previous run's end,
    # the second twice as long as the first
    gaps = [runs[i + 1]["start_time"] - runs[i]["end_time"] for i in range(2)]
    assert gaps[0] >= 1.0 and gaps[1] >= 2.0, (gaps, [e["message"] for e in retries])
    lab.quiesce()
    lab.check()
