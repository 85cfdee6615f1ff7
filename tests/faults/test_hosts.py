"""Hosts that go away: a partition within the lease (reattach, real exit code), beyond it (requeue elsewhere, the
stale copy fenced when the host returns), a dropped SSH connection, and a reboot (a new boot id: the runs there
are lost, never given an exit code they did not leave)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import process_gone
from tests.faults.cluster import Cluster, FaultHosts, wait_for
from tests.faults.conftest import job_script, starts
from tests.procs import descendants, processes

pytestmark = pytest.mark.slow  # real sshd hosts, partitions, controllers and runs

LEASE_S = 10


@pytest.fixture(scope="module")
def lab(fault_hosts: FaultHosts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("hostloss"), hosts=fault_hosts, gpus=2,
                settings={"lease_s": LEASE_S, "heartbeat_timeout_s": 2, "retry_backoff_s": 0.5})
    try:
        c.start()
        yield c
    finally:
        for h in fault_hosts:
            if fault_hosts.is_cut(h):
                h.restore()
        c.close()


def test_a_partition_within_the_lease_reattaches_with_the_real_exit_code(lab: Cluster, fault_hosts: FaultHosts) -> None:
    gate = lab.root / "gate-within"
    jid = lab.submit(job_script(lab.marks, f"while [ ! -e {gate} ]; do sleep 0.1; done; exit 7"))
    node = lab.wait_state(jid, "RUNNING")["placement"][0]["node"]
    host = fault_hosts.host(node)
    host.cut()
    lab.record.add("cut", host=node)
    try:
        lab.wait_node(node, "UNREACHABLE")
        gate.touch()  # the job ends while its host is cut off
        wait_for(lambda: any(host.root.glob("runs/*/*/exit.json")) and
                 any(p.name == "exit.json" for p in host.root.glob(f"runs/*/{jid}-1-*/exit.json")),
                 "the job's exit record on its host")
        assert lab.job(jid)["state"] == "RUNNING"  # within the lease: not requeued
    finally:
        host.restore()
        lab.record.add("restore", host=node)
    lab.wait_node(node, "UP")
    job = lab.wait_state(jid, "FAILED", "COMPLETED", "LOST")
    st = lab.read()
    assert job["state"] == "FAILED" and job["exit_code"] == 7 and len(st.runs_of(jid)) == 1
    assert not st.events_of(jid, "node_lost") and len(starts(lab.marks, jid)) == 1
    lab.quiesce()
    lab.check()


def test_a_partition_beyond_the_lease_requeues_and_fences_the_stale_copy(
        lab: Cluster, fault_hosts: FaultHosts) -> None:
    jid = lab.submit(job_script(lab.marks, 'if [ "$HSCHED_RUN" = 1 ]; then sleep 600; else sleep 1; fi; '
                                           f'echo done >> {lab.marks}/$HSCHED_JOB_ID.done.$HSCHED_RUN'))
    node = lab.wait_state(jid, "RUNNING")["placement"][0]["node"]
    wait_for(lambda: starts(lab.marks, jid), "the first run to start")
    host = fault_hosts.host(node)
    [run1] = lab.read().runs_of(jid)
    stale = [p.pid for p in lab.processes() if p.run_name == run1["run_dir"].rsplit("/", 1)[-1]]
    assert stale
    host.cut()
    lab.record.add("cut", host=node)
    try:
        lab.wait_event(jid, "node_lost")
        wait_for(lambda: len(starts(lab.marks, jid)) == 2, "the requeued job to start again")
        assert starts(lab.marks, jid)[1][0] != node  # elsewhere
        assert not all(process_gone(p) for p in stale)  # the stale copy still runs on the cut-off host
    finally:
        host.restore()
        lab.record.add("restore", host=node)
    lab.wait_event(jid, "fenced")
    wait_for(lambda: all(process_gone(p) for p in stale), "the stale copy to die")
    job = lab.wait_state(jid, "COMPLETED", "FAILED", "LOST", "CANCELLED")
    assert job["state"] == "COMPLETED" and len(lab.read().runs_of(jid)) == 2
    assert not (lab.marks / f"{jid}.done.1").exists() and (lab.marks / f"{jid}.done.2").exists()
    lab.quiesce()
    lab.check()


def test_a_dropped_ssh_connection_reconnects_and_the_run_goes_on(lab: Cluster, fault_hosts: FaultHosts) -> None:
    gate = lab.root / "gate-drop"
    jid = lab.submit(job_script(lab.marks, f"while [ ! -e {gate} ]; do sleep 0.1; done; exit 4"))
    node = lab.wait_state(jid, "RUNNING")["placement"][0]["node"]
    host = fault_hosts.host(node)
    assert host.proc is not None

    def sessions() -> list[int]:
        assert host.proc is not None
        return [p.pid for p in descendants(host.proc.pid) if p.comm.startswith("sshd")]

    dropped = wait_for(sessions, "the controller's ssh sessions on the host")
    for pid in dropped:  # as a reset connection: sshd's side of every session dies at once
        os.kill(pid, signal.SIGKILL)
    lab.record.add("ssh-drop", host=node, sessions=dropped)
    wait_for(lambda: [p for p in sessions() if p not in dropped], "the controller to reconnect")
    wait_for(lambda: any(b"serve" in p.argv and any(b"nodehelper" in a for a in p.argv) for p in processes()
                         if p.pid in {d.pid for d in descendants(host.proc.pid)}),  # type: ignore[union-attr]
             "a new helper server on the host")
    lab.wait_node(node, "UP")
    gate.touch()
    job = lab.wait_state(jid, "FAILED", "COMPLETED", "LOST")
    assert job["state"] == "FAILED" and job["exit_code"] == 4 and len(lab.read().runs_of(jid)) == 1
    lab.quiesce()
    lab.check()


def test_a_rebooted_host_loses_its_runs_without_inventing_exit_codes(lab: Cluster, fault_hosts: FaultHosts) -> None:
    if not fault_hosts.can_reboot:
        pytest.skip("reboots need root: each host's boot id is a file bind-mounted in its own mount namespace")
    jid = lab.submit(job_script(lab.marks, 'if [ "$HSCHED_RUN" = 1 ]; then exec sleep 600; fi; exit 0'), retries=1)
    node = lab.wait_state(jid, "RUNNING")["placement"][0]["node"]
    wait_for(lambda: starts(lab.marks, jid), "the first run to start")
    host = fault_hosts.host(node)
    old_boot = fault_hosts.boot_id(host)
    [run1] = lab.read().runs_of(jid)
    assert run1["handle"]["boot_id"] == old_boot  # the run's handle carries the host's (overridden) boot id
    fault_hosts.reboot(host)  # back at once: within the lease, with a new boot id and none of its processes
    lab.record.add("reboot", host=node)
    assert fault_hosts.boot_id(host) != old_boot
    job = lab.wait_state(jid, "COMPLETED", "FAILED", "LOST", "CANCELLED")
    runs = lab.read().runs_of(jid)
    assert runs[0]["state"] == "LOST" and runs[0]["exit_code"] is None, [(r["state"], r["exit_code"]) for r in runs]
    assert job["state"] == "COMPLETED" and len(runs) == 2, (job["state"], job["reason"])
    lab.quiesce()
    lab.check()


def test_a_status_reply_that_arrives_after_the_lease_is_not_taken(fault_hosts: FaultHosts,
                                                                   tmp_path: Path) -> None:
    """A status request in flight when the host is cut off is answered only when the host is back, after its
    lease ran out: the run was given up meanwhile (FENCING) and its job requeued, so that late answer (the run
    exited 0 while cut off) must not settle the job, nor give the given-up run an exit code."""
    with Cluster(tmp_path / "late", hosts=fault_hosts, gpus=2,
                 settings={"lease_s": 4, "heartbeat_timeout_s": 2}) as lab:
        lab.start()
        gate = lab.root / "gate"
        jid = lab.submit(job_script(lab.marks, f'if [ "$HSCHED_RUN" = 1 ]; then while [ ! -e {gate} ]; do '
                                               'sleep 0.05; done; fi; exit 0'))
        node = lab.wait_state(jid, "RUNNING")["placement"][0]["node"]
        host = fault_hosts.host(node)
        host.cut()
        lab.record.add("cut", host=node)
        try:
            gate.touch()  # run 1 ends while its host is cut off: its exit record waits there
            wait_for(lambda: any(host.root.glob(f"runs/*/{jid}-1-*/exit.json")), "run 1's exit record")
            lab.wait_event(jid, "node_lost")  # the lease ran out: run 1 given up, the job requeued
        finally:
            host.restore()
            lab.record.add("restore", host=node)
        lab.wait_node(node, "UP")
        job = lab.wait_state(jid, "COMPLETED", "FAILED", "LOST", "CANCELLED")
        st = lab.read()
        runs = st.runs_of(jid)
        assert runs[0]["state"] in ("FENCING", "FENCED") and runs[0]["exit_code"] is None, \
            (runs[0]["state"], runs[0]["exit_code"], [e["message"] for e in st.events_of(jid)])
        assert job["state"] == "COMPLETED" and len(runs) == 2, \
            (job["state"], [(r["attempt"], r["state"]) for r in runs], [e["message"] for e in st.events_of(jid)])
        lab.quiesce()
        lab.check()
