"""The Slurm executor's parsers and argv building, on outputs captured from a real Slurm 22.05 cluster
(tests/fixtures/slurm/, made by tests/slurm/capture.py). Pure: no process, the fast lane."""

from __future__ import annotations

import shlex

import pytest
from hsched.executors.slurm import text

from tests.conftest import FIXTURES


def capture(name: str) -> str:
    """A captured output without its `# command:` / `# slurm:` header lines."""
    lines = (FIXTURES / "slurm" / name).read_text().splitlines()
    return "\n".join(ln for ln in lines if not ln.startswith("# ")) + "\n"


def test_oneliner_keeps_values_with_spaces_and_repeated_keys() -> None:
    job = capture("job_two_nodes.txt").strip()
    d = text.oneliner(job)
    assert d["JobId"] == "2" and d["JobState"] == "RUNNING" and d["NodeList"] == "n[1-2]"
    pairs = text.oneliner_pairs(job)
    assert [v for k, v in pairs if k == "Nodes"] == ["n1", "n2"]  # one -d block per node
    node = text.oneliner(capture("nodes_idle.txt").splitlines()[0])
    assert node["OS"] == "Linux 6.18.44-fc-v1045 #1 SMP PREEMPT_DYNAMIC @0"  # spaces and '#' kept
    assert text.oneliner(capture("job_running.txt"))["JobName"] == "train a b"


def test_partition_and_nodes() -> None:
    part = text.oneliner(capture("partition.txt").strip())
    assert part["Nodes"] == "n[1-2]" and part["State"] == "UP"
    idle = [text.parse_node(ln) for ln in capture("nodes_idle.txt").splitlines() if ln]
    assert [n.name for n in idle] == ["n1", "n2"]
    n1 = idle[0]
    assert (n1.cpus, n1.memory_mib, n1.state, n1.usable) == (2, 2000, "IDLE", True)
    assert n1.gres == (text.Gres("gpu", "a100", 2),) and n1.gpus() == [(0, "a100"), (1, "a100")]
    assert n1.features == ("nvme",) and n1.gpus_used == ()
    busy = {n.name: n for n in (text.parse_node(ln) for ln in capture("nodes_busy.txt").splitlines() if ln)}
    assert busy["n1"].gpus_used == (0, 1) and busy["n2"].gpus_used == (0,)
    assert busy["n1"].cpus_allocated == 2 and busy["n2"].memory_allocated_mib == 500
    drained = {n.name: n for n in (text.parse_node(ln) for ln in capture("nodes_drained.txt").splitlines() if ln)}
    assert drained["n2"].state == "IDLE+DRAIN" and not drained["n2"].usable and drained["n1"].usable
    assert drained["n2"].reason == "fan broken: replace [root@1796178097]"


@pytest.mark.parametrize(("state", "usable"), [
    ("IDLE", True), ("MIXED", True), ("ALLOCATED", True), ("COMPLETING", True), ("IDLE+POWERED_DOWN", True),
    ("IDLE+DRAIN", False), ("MIXED+DRAIN", False), ("DRAINED", False), ("DOWN", False), ("DOWN*", False),
    ("IDLE*", False), ("IDLE+NOT_RESPONDING", False), ("ALLOCATED+MAINT", False), ("FUTURE", False),
    ("DOWN+FAIL", False), ("", False),
])
def test_node_states(state: str, usable: bool) -> None:
    assert text.node_usable(state) is usable


def test_jobs_detail() -> None:
    run = text.parse_job(capture("job_running.txt"))
    assert (run.job_id, run.state, run.nodes, run.gpus) == (1, "RUNNING", "n1", {"n1": (0,)})
    assert run.comment == "hsched:7:0123456789abcdef" and run.start_time == 1796178095 and run.end_time is None
    two = text.parse_job(capture("job_two_nodes.txt"))
    assert two.gpus == {"n1": (1,), "n2": (0,)}
    failed = text.parse_job(capture("job_failed.txt"))
    assert (failed.state, failed.exit_status, failed.exit_signal) == ("FAILED", 3, 0)
    assert text.exit_code(failed.exit_status, failed.exit_signal) == (3, None)
    killed = text.parse_job(capture("job_signaled.txt"))
    assert text.exit_code(killed.exit_status, killed.exit_signal) == (138, 10)  # SIGUSR1
    cancelled = text.parse_job(capture("job_cancelled_running.txt"))
    assert (cancelled.state, cancelled.exit_signal, cancelled.nodes) == ("CANCELLED", 15, "n1")
    never = text.parse_job(capture("job_cancelled_pending.txt"))
    assert (never.state, never.exit_status, never.exit_signal, never.nodes) == ("CANCELLED", 0, 0, None)
    pending = text.parse_job(capture("job_pending.txt"))
    assert (pending.state, pending.reason, pending.start_time) == ("PENDING", "Resources", None)


def test_squeue_lines() -> None:
    q = text.parse_squeue(capture("squeue.txt"))
    assert sorted(q) == [1, 2, 3, 4, 5]
    assert q[1].comment == "hsched:7:0123456789abcdef" and q[2].comment is None and q[3].nodes is None
    assert q[4].state == "FAILED" and not q[4].live and q[4].end_time == 1796178097
    assert text.QueueEntry(9, "PENDING", "Priority", None, None, None, None).live
    assert not text.QueueEntry(9, "PENDING", None, None, None, None, None).started
    assert text.QueueEntry(9, "COMPLETING", None, "n1", None, 1.0, None).live  # processes may still run


@pytest.mark.parametrize(("expr", "names"), [
    ("n[1-2]", ["n1", "n2"]), ("n1,n3", ["n1", "n3"]), ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]), ("a[8-10]-x,b", ["a8-x", "a9-x", "a10-x", "b"]), ("", []),
])
def test_hostlists(expr: str, names: list[str]) -> None:
    assert text.expand_hostlist(expr) == names


def test_gres_strings() -> None:
    assert text.parse_gres("gpu:a100:2(S:0-1),gpu:v100:1,shard:8") == [
        text.Gres("gpu", "a100", 2), text.Gres("gpu", "v100", 1), text.Gres("shard", None, 8)]
    assert text.parse_gres("gpu:4") == [text.Gres("gpu", None, 4)] and text.parse_gres("(null)") == []
    assert text.gres_indices("gpu:a100:2(IDX:0-1),gpu:v100:1(IDX:3),shard:0(0/8,0/8)") == [0, 1, 3]
    assert text.gres_indices("gpu:a100:0(IDX:N/A)") == []
    node = text.SlurmNode("x", "IDLE", 8, 1000, tuple(text.parse_gres("gpu:a100:2,gpu:v100:1")), (), (), ())
    assert node.gpus() == [(0, "a100"), (1, "a100"), (2, "v100")]


def _request(**kw: object) -> text.SbatchRequest:
    base: dict[str, object] = dict(script="/r/slurm.sh", output="/r/output.log", workdir="/w", job_name="train",
                                   comment="hsched:1:abc", partition="gpu")
    base.update(kw)
    return text.SbatchRequest(**base)  # type: ignore[arg-type]


def test_sbatch_argv_maps_the_request() -> None:
    argv = text.sbatch_argv(_request(account="lab", qos="high", cluster="dept", gpus_per_node=2, gpu_type="a100",
                                     cpus_per_task=4, memory_mib=8192, time_limit_s=5400, signal="B:USR1@60",
                                     constraint="nvme&ib", nodes=1, ntasks_per_node=1))
    assert argv[:2] == ["sbatch", "--parsable"] and argv[-1] == "/r/slurm.sh"
    for opt in ("--partition=gpu", "--account=lab", "--qos=high", "--clusters=dept", "--gres=gpu:a100:2",
                "--cpus-per-task=4", "--mem=8192M", "--time=90", "--signal=B:USR1@60", "--constraint=nvme&ib",
                "--nodes=1", "--ntasks-per-node=1", "--no-requeue", "--export=NONE", "--job-name=train",
                "--comment=hsched:1:abc", "--output=/r/output.log", "--error=/r/output.log", "--chdir=/w"):
        assert opt in argv, opt
    plain = text.sbatch_argv(_request(gpus_per_node=1, requeue=True))
    assert "--gpus-per-node=1" in plain and "--requeue" in plain
    assert not any(a.startswith(("--gres", "--account", "--qos", "--time", "--mem", "--clusters")) for a in plain)
    assert text.sbatch_argv(_request(output="/runs/50%/output.log"))[5] == "--output=/runs/50%%/output.log"
    assert [text.slurm_minutes(s) for s in (1, 60, 61, 3600)] == ["1", "1", "2", "60"]
    assert text.job_name("a\nb\tc") == "a_b_c" and text.job_name("") == "hsched"


def test_batch_script_quotes_every_word() -> None:
    argv = ["python", "train.py", "it's", "$HOME", "a b", "`x`", "new\nline", "-n"]
    script, skipped = text.batch_script(argv, {"A": "$(touch x)", "B-C": "1"}, "/w d", "/r/1 2")
    assert skipped == ["B-C"]
    lines = script.splitlines()
    assert lines[0] == "#!/bin/sh" and lines[2] == ":"  # the first command: sbatch reads no #SBATCH after it
    assert "export A='$(touch x)'" in lines
    assert "cd -- '/w d' || exit 1" in lines
    assert script.endswith("exec " + " ".join(shlex.quote(a) for a in argv) + "\n")
    assert shlex.split(script.rsplit("exec ", 1)[1]) == argv
    dash = text.batch_script(["-n", "x"], {}, "/", "/r")[0]
    assert dash.rstrip().endswith("exec env -- -n x")


def test_other_jobs_gpus_are_spread_over_devices_none_of_ours_is_counted_on() -> None:
    from hsched.executors.slurm.executor import _spread

    def dev(node: str, i: int, t: str = "a100") -> dict[str, object]:
        return {"uuid": f"{node}-{i}", "slurm_node": node, "name": t}

    free = [dev("n1", 1), dev("n2", 0), dev("n2", 1), dev("n3", 0, "v100")]  # n1-0 is counted as ours
    # that very GPU when it is free; else one of its node; else one of its type; never one of another type
    assert _spread([("n2", "n2-1", "a100")], free) == ["n2-1"]
    assert _spread([("n1", "n1-0", "a100")], free) == ["n1-1"]
    assert _spread([("n1", "n1-0", "a100"), ("n1", "n1-1", "a100")], free) == ["n1-1", "n2-0"]
    assert _spread([("n9", "n9-0", "v100"), ("n9", "n9-1", "v100")], free) == ["n3-0"]
    assert _spread([], free) == []


def test_jobs_slurm_took_away_are_lost_with_their_cause_and_a_start() -> None:
    """A job Slurm preempted, or whose node failed, is LOST with the cause the controller requeues it by (no
    retry used); every ended job's report says when Slurm really started it, a never-started one none."""
    from hsched.executors.slurm.executor import SlurmRunReport, _final_of, _final_report

    from hsched.model import EndReason, RunHandle, RunStatus

    h = RunHandle("/r", 6, 0, 0, "slurm::debug")
    preempted = text.parse_job(capture("job_preempted.txt"))
    assert (preempted.state, preempted.exit_signal, preempted.nodes) == ("PREEMPTED", 15, "n1")
    rep = _final_report(_final_of(preempted), h)
    assert isinstance(rep, SlurmRunReport)
    assert (rep.status, rep.cause, rep.exit_code) == (RunStatus.LOST, EndReason.PREEMPTED, None)
    assert (rep.started_at, rep.end_time) == (1796196941, 1796196943)
    failed = _final_report(_final_of(text.parse_job(capture("job_node_fail.txt"))), h)
    assert (failed.status, failed.cause, failed.started_at) == (RunStatus.LOST, EndReason.NODE_LOST, 1796196942)
    exited = _final_report(_final_of(text.parse_job(capture("job_failed.txt"))), h)
    assert (exited.status, exited.exit_code, exited.cause) == (RunStatus.EXITED, 3, None)
    assert exited.started_at == text.parse_job(capture("job_failed.txt")).start_time is not None
    never = _final_report(_final_of(text.parse_job(capture("job_cancelled_pending.txt"))), h)
    assert (never.status, never.exit_code, never.started_at) == (RunStatus.EXITED, 143, None)  # StartTime: a guess
    # a job nobody can say anything of is lost without a cause: it costs a retry, as on any node
    assert _final_report({"state": "REVOKED"}, h).cause is None


def test_srun_says_how_each_task_of_a_gang_ended() -> None:
    # captured: rank 1 exited 3 by itself, srun then ended rank 0 (SIGTERM)
    assert text.srun_task_ends(capture("srun_gang_failed.log")) == {1: (3, None), 0: (143, 15)}
    more = ("srun: error: n2: tasks 2-3,5: Killed\nsrun: error: n1: task 4: Segmentation fault\n"
            "srun: error: n1: task 2: Exited with exit code 1\nsrun: error: n1: task 7: something new\n")
    assert text.srun_task_ends(more) == {2: (137, 9), 3: (137, 9), 5: (137, 9), 4: (139, 11)}  # the first line counts
    assert text.srun_task_ends("") == {}


def test_a_gangs_scripts_start_each_rank_by_its_task_number() -> None:
    dispatch = text.rank_dispatch([("/r/0 a/slurm.sh", "/r/0 a/output.log"), ("/r/1/slurm.sh", "/r/1/output.log")])
    assert "0) exec /bin/sh '/r/0 a/slurm.sh' >> '/r/0 a/output.log' 2>&1 ;;" in dispatch.splitlines()
    assert dispatch.splitlines()[-1] == "exit 1"  # a task number with no rank never runs anything
    batch = text.gang_script("/r/0/slurm-ranks.sh", "/w", "/r/0", 2, 4).splitlines()
    assert batch[2] == ":" and batch[-1] == ("exec srun --kill-on-bad-exit=1 --nodes=2 --ntasks=8 --ntasks-per-node=4 "
                                             "/bin/sh /r/0/slurm-ranks.sh")


def test_a_gang_whose_srun_failed_before_any_task_ended_fails_every_rank() -> None:
    from hsched.executors.slurm.executor import _rank_end

    failed = {"state": "FAILED", "exit_status": 1, "exit_signal": 0}
    log = ("srun: error: Munge encode failed: Permission denied\n"
           "srun: error: Unable to confirm allocation for job 1: Protocol authentication error\n")
    assert _rank_end(log, 0, failed) == failed and _rank_end(log, 1, failed) == failed
    # a task that failed by itself: the others that srun says nothing of exited 0
    one = "srun: error: n1: task 1: Exited with exit code 3\n"
    assert (_rank_end(one, 0, failed)["exit_status"], _rank_end(one, 1, failed)["exit_status"]) == (0, 3)
