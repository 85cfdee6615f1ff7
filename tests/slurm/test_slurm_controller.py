"""hsched over a real Slurm partition, end to end: the CLI, a controller whose fleet file has one slurm node
group, and the two-node test cluster. A job submitted with `hsched submit` runs as a Slurm batch job, its
exit code and log come back, `hsched cancel` ends it in Slurm, and a controller killed while Slurm runs its
job tracks it to the end after a restart without submitting it again."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, Hs, process_gone, wait_until
from tests.slurm.cluster import URGENT, SlurmCluster

pytestmark = pytest.mark.slow  # a Slurm cluster, the CLI and a controller as real processes

FLEET = """
[[node]]
name = "cluster"
executor = "slurm"
partition = "{partition}"

[[node]]
name = "ws1"
[node.simulate]
model = "RTX 4090"
count = 2
"""


@pytest.fixture
def hs_slurm(slurm: SlurmCluster, tmp_path: Path) -> Iterator[Hs]:
    """A controller whose fleet is the test cluster's partition, as one node group, and a workstation (this
    machine, with two simulated RTX 4090): one queue over both."""
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET.format(partition=slurm.partition))
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.toml").write_text("poll_interval_s = 0.2\nkill_after_s = 2\n")
    h = Hs(home, fleet)
    h.env["SLURM_CONF"] = str(slurm.conf)
    yield h
    h.stop()


def slurm_jobs(slurm: SlurmCluster, h: Hs, hsched_job: str) -> list[dict[str, str]]:
    """Slurm's jobs for one hsched job of this controller (their comment names the job; they run in its run
    folders, under its home)."""
    out = slurm.run("squeue", "-h", "-t", "all", "-o", "%i\t%T\t%k\t%Z").stdout
    return [{"id": i, "state": s, "comment": c} for i, s, c, wd in (ln.split("\t", 3) for ln in out.splitlines())
            if c.startswith(f"hsched:{hsched_job}:") and wd.startswith(str(h.home) + "/")]


def job(h: Hs, jid: str) -> dict:  # type: ignore[type-arg]
    shown = h.json("show", jid)
    assert isinstance(shown, dict)
    return shown


def test_a_job_goes_through_slurm_its_exit_code_and_log_come_back_and_cancel_ends_one(slurm: SlurmCluster,
                                                                                    hs_slurm: Hs) -> None:
    h = hs_slurm
    nodes = wait_until(lambda: [n for n in h.json("nodes") if n["state"] == "UP"  # type: ignore[union-attr]
                                and n["executor"] == "slurm"], "the slurm group UP")
    [group] = nodes
    assert group["executor"] == "slurm" and len(group["devices"]) == 4 and group["cpus"] == 4
    assert {d["model"] for d in group["devices"]} == {"a100"}
    show_env = 'echo "cvd=$CUDA_VISIBLE_DEVICES job=$HSCHED_JOB_ID node=$HSCHED_NODE"; exit 3'
    # one queue: the a100 job goes to the Slurm group, the 4090 job to the workstation
    local = h.run("submit", "--parsable", "--gpus", "1", "--gpu-type", "4090", "--", "sleep", "2",
                  check=True).stdout.strip()
    jid = h.run("submit", "--parsable", "--gpus", "1", "--gpu-type", "a100", "--", "sh", "-c", show_env,
                check=True).stdout.strip()
    queue = {str(j["id"]): j for j in h.json("queue", "--all")}  # type: ignore[union-attr]
    assert {local, jid} <= set(queue)
    assert h.run("wait", local, "--timeout", "120").returncode == 0
    assert job(h, local)["runs"][0]["node"] == "ws1" and not slurm_jobs(slurm, h, local)
    assert h.run("wait", jid, "--timeout", "120").returncode != 0
    shown = job(h, jid)
    assert shown["state"] == "FAILED" and shown["exit_code"] == 3
    [sj] = slurm_jobs(slurm, h, jid)
    assert sj["state"] == "FAILED"
    detail = slurm.job(sj["id"])
    assert detail["TresPerNode"] == "gres:gpu:a100:1" and detail["Requeue"] == "0"
    assert h.run("logs", jid, check=True).stdout == f"cvd=0 job={jid} node=cluster\n"
    assert shown["runs"][0]["pid"] == int(sj["id"])  # the run's handle holds Slurm's job id

    # hsched cancel of a running job: gone from Slurm within 5 s
    jid = h.run("submit", "--parsable", "--gpus", "2", "--gpu-type", "a100", "--", "sleep", "300",
                check=True).stdout.strip()
    wait_until(lambda: [j for j in slurm_jobs(slurm, h, jid) if j["state"] == "RUNNING"], "the Slurm job running")
    wait_until(lambda: job(h, jid)["state"] == "RUNNING", "hsched's job running")
    t0 = time.monotonic()
    h.run("cancel", jid, check=True)
    wait_until(lambda: all(j["state"] not in ("RUNNING", "COMPLETING") for j in slurm_jobs(slurm, h, jid)),
               "the Slurm job gone", every_s=0.05)
    assert time.monotonic() - t0 < 5.0
    assert h.run("wait", jid, "--timeout", "60").returncode != 0
    assert job(h, jid)["state"] == "CANCELLED"


def test_a_controller_killed_while_slurm_runs_its_job_follows_it_to_the_end(slurm: SlurmCluster, hs_slurm: Hs,
                                                                           tmp_path: Path) -> None:
    h = hs_slurm
    go = tmp_path / "go"
    jid = h.run("submit", "--parsable", "--gpus", "1", "--gpu-type", "a100", "--", "sh", "-c",
                f'while [ ! -e "{go}" ]; do sleep 0.1; done; echo finished', check=True).stdout.strip()
    wait_until(lambda: [j for j in slurm_jobs(slurm, h, jid) if j["state"] == "RUNNING"], "the Slurm job running")
    wait_until(lambda: job(h, jid)["state"] == "RUNNING", "hsched's job running")
    pid = h.controller_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: process_gone(pid), "the controller gone")
    go.touch()  # the job ends while no controller watches
    wait_until(lambda: [j for j in slurm_jobs(slurm, h, jid) if j["state"] == "COMPLETED"], "the Slurm job done")
    assert h.run("wait", jid, "--timeout", "120").returncode == 0  # a new controller, started on demand
    shown = job(h, jid)
    assert shown["state"] == "COMPLETED" and shown["restarts"] == 0 and len(shown["runs"]) == 1
    assert len(slurm_jobs(slurm, h, jid)) == 1  # never submitted again
    assert h.run("logs", jid, check=True).stdout == "finished\n"
    assert json.loads(Path(shown["runs"][0]["run_dir"], "slurm.json").read_text())["final"]["state"] == "COMPLETED"


def test_preempting_the_example_trainer_checkpoints_requeues_and_resumes_under_slurm(slurm: SlurmCluster,
                                                                                      hs_slurm: Hs) -> None:
    """`hsched preempt`: the trainer gets its checkpoint signal through scancel, saves and exits 85; hsched
    requeues it and a second Slurm job resumes it from its checkpoint folder (HSCHED_RESUME=1)."""
    h = hs_slurm
    trainer = str(REPO / "examples" / "trainer.py")
    jid = h.run("submit", "--parsable", "--gpus", "1", "--gpu-type", "a100", "--", "python3", trainer, "--steps", "30",
                "--step-seconds", "0.1", check=True).stdout.strip()
    wait_until(lambda: "step 3\n" in h.run("logs", jid).stdout, "the trainer at step 3")
    h.run("preempt", jid, check=True)
    assert h.run("wait", jid, "--timeout", "120").returncode == 0
    shown = job(h, jid)
    assert shown["state"] == "COMPLETED" and shown["restarts"] == 1
    preempted = next(e for e in shown["events"] if e["kind"] == "preempted")
    assert "exit code 85" in preempted["message"]
    runs_log = (Path(h.home) / "checkpoints" / jid / "runs.log").read_text().splitlines()
    assert runs_log[0].endswith("resume 0 from step 0")
    assert " resume 1 from step " in runs_log[1] and not runs_log[1].endswith("from step 0")
    assert sorted(j["state"] for j in slurm_jobs(slurm, h, jid)) == ["COMPLETED", "FAILED"]  # exit 85, then done


SECOND_RUN_SUCCEEDS = 'echo "run $HSCHED_RUN"; [ "$HSCHED_RESTART_COUNT" -gt 0 ] && exit 0; exec sleep 300'
"""A job whose first run waits to be taken away, and whose run after a requeue succeeds."""


def taken_away_and_requeued(slurm: SlurmCluster, h: Hs, take: Callable[[str], None], event: str) -> dict:  # type: ignore[type-arg]
    """Submit a job with no retries, let `take(slurm node)` end its Slurm job, and check that hsched requeued it
    without using a retry (event `event`) and that its second run completed."""
    jid = h.run("submit", "--parsable", "--retries", "0", "--gpus", "1", "--gpu-type", "a100", "--", "sh", "-c",
                SECOND_RUN_SUCCEEDS, check=True).stdout.strip()
    [sj] = wait_until(lambda: [j for j in slurm_jobs(slurm, h, jid) if j["state"] == "RUNNING"],
                      "the Slurm job running")
    wait_until(lambda: job(h, jid)["state"] == "RUNNING", "hsched's job running")
    take(slurm.job(sj["id"])["NodeList"])
    assert h.run("wait", jid, "--timeout", "120").returncode == 0, job(h, jid)
    shown = job(h, jid)
    assert shown["state"] == "COMPLETED" and shown["restarts"] == 1 and shown["retries_used"] == 0
    assert [e["kind"] for e in shown["events"] if e["kind"] in ("preempted", "node_lost", "retry", "lost")] == [event]
    assert len(slurm_jobs(slurm, h, jid)) == 2  # a new sbatch for the new attempt
    return shown


def test_a_job_slurm_preempts_is_requeued_without_using_a_retry(slurm: SlurmCluster, hs_slurm: Hs) -> None:
    def preempt(node: str) -> None:
        # a job of the higher partition that needs the whole node: Slurm cancels ours for it (PREEMPTED)
        slurm.run("sbatch", "--parsable", "-o", "/dev/null", "-p", URGENT, "-w", node,
                  f"--gres=gpu:{slurm.gpu_type}:{slurm.gpus}", "--wrap", "sleep 120")

    shown = taken_away_and_requeued(slurm, hs_slurm, preempt, "preempted")
    assert shown["runs"][0]["state"] == "PREEMPTED" and shown["runs"][0]["reason"] == "preempted"


def test_a_job_whose_slurm_node_fails_is_requeued_without_using_a_retry(slurm: SlurmCluster, hs_slurm: Hs) -> None:
    shown = taken_away_and_requeued(slurm, hs_slurm, lambda node: slurm.node_down(node, "hsched test"), "node_lost")
    assert shown["runs"][0]["state"] == "LOST" and shown["runs"][0]["reason"] == "node_lost"
    slurm.wait_nodes_up()


def test_the_time_limit_counts_from_slurms_start_not_from_sbatch(slurm: SlurmCluster, hs_slurm: Hs) -> None:
    """A 4 s job waits in Slurm's queue longer than its limit (every CPU taken by other jobs, its GPUs free, so
    hsched hands it over), is not stopped there, then runs its 4 s from Slurm's start and times out."""
    h = hs_slurm
    limit = 4.0
    blockers = [slurm.run("sbatch", "--parsable", "-o", "/dev/null", "-w", n, f"--cpus-per-task={slurm.cpus}",
                          "--wrap", "sleep 120").stdout.strip() for n in slurm.nodes]
    wait_until(lambda: all(slurm.job(b)["JobState"] == "RUNNING" for b in blockers), "the other jobs running")
    jid = h.run("submit", "--parsable", "--time", "0:04", "--gpus", "1", "--gpu-type", "a100", "--", "sleep", "60",
                check=True).stdout.strip()
    [sj] = wait_until(lambda: slurm_jobs(slurm, h, jid), "hsched's job handed to Slurm")
    handed = time.monotonic()
    # past its limit in Slurm's queue, and hsched still lets it wait there
    wait_until(lambda: time.monotonic() - handed > limit + 2.0, "a wait longer than the limit", every_s=0.5)
    assert slurm.job(sj["id"])["JobState"] == "PENDING"
    assert job(h, jid)["state"] == "RUNNING"
    slurm.run("scancel", *blockers)
    assert h.run("wait", jid, "--timeout", "120").returncode != 0
    shown = job(h, jid)
    assert shown["state"] == "TIMEOUT"
    detail = slurm.job(sj["id"], epochs=True)
    ran = float(detail["EndTime"]) - float(detail["StartTime"])
    assert detail["NodeList"] and limit - 1 <= ran < 30, detail  # it ran about its limit, from Slurm's start


def test_a_job_of_two_tasks_is_one_slurm_job_whose_ranks_report_on_their_own(slurm: SlurmCluster,
                                                                             hs_slurm: Hs) -> None:
    """`hsched submit --tasks-per-node 2` on the Slurm group: the controller's two runs (ranks) are one sbatch
    with --ntasks-per-node=2, srun starts each rank with its RANK; each rank's log and exit code come back."""
    h = hs_slurm
    show = 'echo "rank=$RANK procid=$SLURM_PROCID world=$WORLD_SIZE"; exit $((RANK * 3))'
    jid = h.run("submit", "--parsable", "--tasks-per-node", "2", "--gpus", "2", "--gpu-type", "a100", "--", "sh",
                "-c", show, check=True).stdout.strip()
    assert h.run("wait", jid, "--timeout", "120").returncode != 0
    shown = job(h, jid)
    [sj] = slurm_jobs(slurm, h, jid)  # one Slurm job for both ranks
    detail = slurm.job(sj["id"])
    assert (detail["NumTasks"], detail["TresPerNode"]) == ("2", "gres:gpu:a100:2")
    assert shown["state"] == "FAILED" and shown["exit_code"] == 3
    assert sorted((r["rank"], r["exit_code"], r["pid"]) for r in shown["runs"]) == [(0, 0, int(sj["id"])),
                                                                                    (1, 3, int(sj["id"]))]
    assert h.run("logs", jid, check=True).stdout == "rank=0 procid=0 world=2\n"
    assert h.run("logs", jid, "--rank", "1", check=True).stdout == "rank=1 procid=1 world=2\n"


def test_a_gang_of_two_nodes_is_one_slurm_job_over_both_slurm_nodes(slurm: SlurmCluster, hs_slurm: Hs) -> None:
    """`hsched submit --nodes 2 --gpus-per-node 1` with the Slurm group the only node of that GPU model: the round
    places both ranks on the group, one per Slurm node, and the executor submits them as ONE `sbatch --nodes=2`;
    each rank runs on its own Slurm node and its log and exit code come back."""
    h = hs_slurm
    show = 'echo "rank=$RANK world=$WORLD_SIZE node=$SLURMD_NODENAME"; exit $((RANK * 3))'
    jid = h.run("submit", "--parsable", "--nodes", "2", "--gpus-per-node", "1", "--gpu-type", "a100", "--", "sh",
                "-c", show, check=True).stdout.strip()
    assert h.run("wait", jid, "--timeout", "120").returncode != 0
    shown = job(h, jid)
    [sj] = slurm_jobs(slurm, h, jid)  # one Slurm job for both ranks
    detail = slurm.job(sj["id"])
    assert (detail["NumNodes"], detail["NumTasks"], detail["TresPerNode"]) == ("2", "2", "gres:gpu:a100:1")
    assert sorted(slurm.run("scontrol", "show", "hostnames", detail["NodeList"]).stdout.split()) == ["n1", "n2"]
    assert shown["state"] == "FAILED" and shown["exit_code"] == 3
    assert sorted((r["rank"], r["node"], r["exit_code"], r["pid"]) for r in shown["runs"]) == [
        (0, "cluster", 0, int(sj["id"])), (1, "cluster", 3, int(sj["id"]))]
    # each rank's devices are on another Slurm node of the group (hsched's count; Slurm chose the real ones)
    devices = [d for r in sorted(shown["runs"], key=lambda r: r["rank"]) for d in r["devices"]]
    assert len(devices) == 2 and len({d.split("-")[2] for d in devices}) == 2, devices
    logs = [h.run("logs", jid, "--rank", str(r), check=True).stdout for r in (0, 1)]
    nodes = []
    for r, text in enumerate(logs):
        fields = dict(x.split("=", 1) for x in text.split())
        assert (fields["rank"], fields["world"]) == (str(r), "2"), text
        nodes.append(fields["node"])
    assert sorted(nodes) == ["n1", "n2"]  # one rank on each Slurm node


def test_output_and_error_files_go_to_sbatch_and_hsched_logs_reads_the_output(slurm: SlurmCluster, hs_slurm: Hs,
                                                                              tmp_path: Path) -> None:
    """`hsched submit -o DIR/slurm-%j.out -e DIR/slurm-%j.err` on the Slurm group: sbatch writes the files, named
    with hsched's job id; `hsched logs` shows the output file."""
    h = hs_slurm
    out_dir = tmp_path / "outputs"
    out_dir.mkdir()
    jid = h.run("submit", "--parsable", "-o", f"{out_dir}/slurm-%j.out", "-e", f"{out_dir}/slurm-%j.err", "--gpus",
                "1", "--gpu-type", "a100", "--", "sh", "-c", "echo to-out; echo to-err >&2", check=True).stdout.strip()
    assert h.run("wait", jid, "--timeout", "120").returncode == 0
    assert (out_dir / f"slurm-{jid}.out").read_text() == "to-out\n"
    assert (out_dir / f"slurm-{jid}.err").read_text() == "to-err\n"
    [sj] = slurm_jobs(slurm, h, jid)
    detail = slurm.job(sj["id"])
    assert (detail["StdOut"], detail["StdErr"]) == (f"{out_dir}/slurm-{jid}.out", f"{out_dir}/slurm-{jid}.err")
    assert h.run("logs", jid, check=True).stdout == "to-out\n"
