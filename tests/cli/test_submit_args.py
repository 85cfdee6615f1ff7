"""How `hsched submit` reads its arguments (issue 16): options before or after a spec file, a command after
`--` or after the spec, sbatch's meanings. The controller is replaced by a recorder: only the parsing is tested."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from hsched.cli import main
from hsched.spec.batch import SRUN


class Recorder:
    calls: list[dict[str, Any]] = []

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def reachable(self) -> bool:
        return False  # as with no controller yet: the CLI checks the spec itself first

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        if op == "partitions":  # asked before a submit with --partition; not recorded: the submits are
            return {"partitions": {"gpu": ["a"]}}
        Recorder.calls.append({"op": op, **args})
        return {"id": 7, "state": "PENDING"}


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, Any]]:
    monkeypatch.setenv("HSCHED_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("hsched.cli.jobs._client", Recorder)
    monkeypatch.setattr("hsched.cli.submitting._client", Recorder)
    Recorder.calls = []
    return Recorder.calls


def submit(monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    monkeypatch.setattr("sys.argv", ["hsched", "submit", *argv])
    with pytest.raises(SystemExit) as ex:
        main()
    return int(ex.value.code or 0)


def spec_file(tmp_path: Path) -> Path:
    p = tmp_path / "eval.toml"
    p.write_text('command = ["python", "eval.py"]\nqos = "normal"\n[resources]\ngpus = 1\n')
    return p


def test_options_after_a_spec_file_are_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                               submitted: list[dict[str, Any]]) -> None:
    assert submit(monkeypatch, str(spec_file(tmp_path)), "--qos", "prod", "--gpus", "2", "-t", "90") == 0
    [call] = submitted
    spec = call["spec"]
    assert spec["command"] == ["python", "eval.py"] and spec["qos"] == "prod"
    assert spec["resources"]["gpus"] == 2 and spec["time"] == "90"


def test_options_after_the_spec_win_over_options_before_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                          submitted: list[dict[str, Any]]) -> None:
    assert submit(monkeypatch, "--qos", "scavenger", "--name", "x", str(spec_file(tmp_path)), "--qos", "prod") == 0
    spec = submitted[0]["spec"]
    assert (spec["qos"], spec["name"]) == ("prod", "x")


def test_a_command_after_the_spec_and_options_replaces_the_specs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                submitted: list[dict[str, Any]]) -> None:
    assert submit(monkeypatch, str(spec_file(tmp_path)), "--qos", "prod", "--", "python", "other.py", "--lr",
                  "3") == 0
    assert submitted[0]["spec"]["command"] == ["python", "other.py", "--lr", "3"]


def test_a_bare_command_keeps_its_own_options(monkeypatch: pytest.MonkeyPatch,
                                              submitted: list[dict[str, Any]]) -> None:
    assert submit(monkeypatch, "--gpus", "1", "--", "python", "train.py", "--qos", "x") == 0
    assert submit(monkeypatch, "python", "train.py", "--epochs", "3") == 0
    assert submitted[0]["spec"]["command"] == ["python", "train.py", "--qos", "x"]
    assert submitted[1]["spec"]["command"] == ["python", "train.py", "--epochs", "3"]


def test_a_bad_option_after_the_spec_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                 submitted: list[dict[str, Any]],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert submit(monkeypatch, str(spec_file(tmp_path)), "--bogus") == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "No such option: --bogus" in line and submitted == []


def test_dependency_options(monkeypatch: pytest.MonkeyPatch, submitted: list[dict[str, Any]],
                            capsys: pytest.CaptureFixture[str]) -> None:
    assert submit(monkeypatch, "-d", "afterok:3:4", "--kill-on-invalid-dep", "--", "true") == 0
    spec = submitted[0]["spec"]
    assert (spec["dependency"], spec["kill_on_invalid_dep"]) == ("afterok:3:4", True)
    assert submit(monkeypatch, "--dependency", "afterok:x", "--", "true") == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("hsched: error: <command line>: dependency: expected a dependency such as afterok:12")


def test_array_option(monkeypatch: pytest.MonkeyPatch, submitted: list[dict[str, Any]]) -> None:
    assert submit(monkeypatch, "--array", "0-9%2", "--", "true") == 0
    assert submitted[0]["spec"]["array"] == "0-9%2"


def test_the_queue_shows_an_arrays_pending_tasks_in_one_row() -> None:
    from hsched.cli.jobs import queue_rows

    def j(i: int, task: int | None, state: str) -> dict[str, Any]:
        return {"id": i, "array_id": 10 if task is not None else None, "array_task": task, "state": state,
                "display_id": f"10_{task}" if task is not None else str(i), "array_limit": 2}

    jobs = [j(10, 0, "RUNNING"), j(11, 1, "PENDING"), j(12, 2, "PENDING"), j(13, 3, "PENDING"), j(14, None, "PENDING")]
    assert [label for label, _ in queue_rows(jobs)] == ["10_0", "10_[1-3%2]", "14"]


class FakeClient:
    def __init__(self, jobs: list[dict[str, Any]]) -> None:
        self.jobs = {j["id"]: j for j in jobs}

    def call(self, op: str, **args: Any) -> Any:
        from hsched.errors import UserError

        if op == "show":
            if args["id"] not in self.jobs:
                raise UserError(f"no job {args['id']}")
            return self.jobs[args["id"]]
        assert op == "queue"
        return list(self.jobs.values())


def test_job_ids_of_arrays_and_tasks() -> None:
    from hsched.cli.control import job_ids_of
    from hsched.errors import UserError

    c = FakeClient([{"id": 10, "array_id": 10, "array_task": 0}, {"id": 11, "array_id": 10, "array_task": 5},
                    {"id": 12, "array_id": None, "array_task": None}])
    assert job_ids_of(c, ["10"]) == [10, 11]
    assert job_ids_of(c, ["10_5", "12"]) == [11, 12]
    assert job_ids_of(c, ["10"], whole_arrays=False) == [10]
    assert job_ids_of(c, ["99"]) == [99]  # the command itself reports a job that does not exist
    for bad, words in (("10_7", "has no task 7"), ("12_1", "not an array"), ("x", "expected a job id")):
        with pytest.raises(UserError, match=words):
            job_ids_of(c, [bad])


def test_a_batch_script_reads_its_sbatch_lines(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                               submitted: list[dict[str, Any]],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\n# a comment\n#SBATCH --gpus-per-node=2 -t 10 -J x\n"
                      "#SBATCH --partition=gpu  # the nodes labelled gpu\n#SBATCH --qos=scavenger\n"
                      "echo $SLURM_JOB_ID \"$@\"\n#SBATCH --gpus-per-node=7\n")
    # the command line wins over the script, as with sbatch
    assert submit(monkeypatch, "--qos", "prod", str(script), "a1", "a2") == 0
    spec = submitted[0]["spec"]
    assert (spec["name"], spec["time"], spec["resources"]["gpus"], spec["qos"]) == ("x", "10", 2, "prod")
    shell, flag, text, path, *rest = spec["command"]
    assert (shell, flag, path, rest) == ("/bin/bash", "-c", str(script.resolve()), ["a1", "a2"])
    assert text == SRUN + script.read_text()  # a snapshot (srun defined first): editing the file later changes nothing
    assert spec["resources"]["constraint"] == "gpu"  # a partition is a node label (tests/cli/test_partition.py)
    assert "ignored" not in capsys.readouterr().err


def test_sbatch_gres_ntasks_and_total_gpus(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                          submitted: list[dict[str, Any]]) -> None:
    script = tmp_path / "ddp.sh"
    script.write_text("#!/bin/sh\n#SBATCH -N 2 -n 8\n#SBATCH --gres=gpu:a100:4\ntorchrun train.py\n")
    assert submit(monkeypatch, str(script)) == 0
    res = submitted[0]["spec"]["resources"]
    assert (res["nodes"], res["tasks_per_node"], res["gpus"], res["gpu_types"]) == (2, 4, 4, ["a100"])
    # -G counts the job's GPUs, as sbatch: 4 over 2 nodes is 2 per node
    assert submit(monkeypatch, "-N", "2", "-G", "4", "--", "true") == 0
    assert submitted[1]["spec"]["resources"]["gpus"] == 2
    assert submit(monkeypatch, "-N", "2", "-G", "3", "--", "true") == 2


def test_a_python_script_with_a_shebang_runs_by_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                     submitted: list[dict[str, Any]]) -> None:
    script = tmp_path / "job.py"
    script.write_text("#!/usr/bin/env python3\n#SBATCH -J py\nprint(1)\n")
    assert submit(monkeypatch, str(script), "--lr", "3") == 0
    spec = submitted[0]["spec"]
    assert spec["command"] == ["/usr/bin/env", "python3", str(script.resolve()), "--lr", "3"]
    assert spec["name"] == "py"


def test_queue_format_and_state_filters() -> None:
    from hsched.cli.jobs import _states, format_queue
    from hsched.errors import UserError

    jobs = [{"id": 3, "name": "train", "user": "ann", "state": "RUNNING", "qos": "normal", "priority": 0, "gpus": 2,
             "nodes": 1, "time_limit_s": 5400.0, "placement": [{"node": "a", "devices": ["x", "y"]}],
             "reason": "", "start_time": None, "end_time": None, "submit_time": "t", "display_id": "3"}]
    assert format_queue(jobs, "%.5i %10j %t %l %R") == ["JOBID NAME       ST TIME_LIMIT NODELIST(REASON)",
                                                        "    3 train      R 1:30:00 a"]  # a host list (GPUs: %b)
    assert _states("PD,r") == {"PENDING", "RUNNING"} and _states("completed") == {"COMPLETED"}
    with pytest.raises(UserError, match="not a state"):
        _states("XX")
    with pytest.raises(UserError, match="unknown field %Z"):
        format_queue(jobs, "%Z")


class LogsClient:
    """A job whose run 1 writes, is preempted, and run 2 writes after: the controller's logs answers."""

    def __init__(self) -> None:
        self.logs = {1: b"one-a\n", 2: b""}
        self.ended = {1: False, 2: False}
        self.state = "RUNNING"
        self.ticks = 0

    def __enter__(self) -> LogsClient:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def tick(self, _s: float) -> None:  # what happens while the CLI sleeps
        self.ticks += 1
        if self.ticks == 1:
            self.logs[1] += b"one-b\n"
            self.ended[1] = True
            self.state = "PENDING"
        elif self.ticks == 2:
            self.logs[2] = b"two-a\n"  # run 2 wrote before the CLI looked: not one byte may be lost
            self.state = "RUNNING"
        elif self.ticks == 3:
            self.logs[2] += b"two-b\n"
            self.ended[2] = True
            self.state = "COMPLETED"

    def call(self, op: str, **args: Any) -> Any:
        import base64

        from hsched.errors import UserError

        assert op == "logs"
        started = [r for r in (1, 2) if r == 1 or self.ticks >= 2]
        run = args.get("run") or started[-1]
        if run not in started:
            raise UserError(f"no run {run}")
        data = self.logs[run][args["offset"]:args["offset"] + args.get("max_bytes", 1 << 20)]
        return {"data": base64.b64encode(data).decode(), "offset": args["offset"] + len(data), "run": run,
                "ended": self.ended[run], "state": self.state, "runs": len(started)}


def test_logs_follow_across_a_preemption_prints_both_runs_whole(monkeypatch: pytest.MonkeyPatch,
                                                                capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    fake = LogsClient()
    monkeypatch.setattr("hsched.cli.jobs._client", lambda: fake)
    monkeypatch.setattr("hsched.cli.jobs.time.sleep", fake.tick)
    monkeypatch.setattr("sys.argv", ["hsched", "logs", "-f", "7"])
    with pytest.raises(SystemExit) as ex:
        main()
    assert ex.value.code in (0, None)
    assert capsysbinary.readouterr().out == b"one-a\none-b\n==> job 7: run 2 <==\ntwo-a\ntwo-b\n"


def test_offload_and_mem_reach_the_spec(monkeypatch: pytest.MonkeyPatch, submitted: list[dict[str, Any]]) -> None:
    """`--offload` (issue 15, item 6): on the quick path and the full one alike."""
    assert submit(monkeypatch, "--gpus", "1", "--mem", "512G", "--offload", "--", "python", "zero.py") == 0
    res = submitted[0]["spec"]["resources"]
    assert res["offload"] is True and res["memory"] == "512G"


def test_a_batch_script_writes_slurm_jobid_out_by_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                          submitted: list[dict[str, Any]]) -> None:
    # issue 29: sbatch writes a script's output to slurm-%j.out in its working folder when -o is absent
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH -G 1\necho hi\n")
    monkeypatch.chdir(tmp_path)
    assert submit(monkeypatch, str(script)) == 0
    assert submitted[-1]["spec"]["output"] == "slurm-%j.out"
    assert submit(monkeypatch, "--array", "0-3", str(script)) == 0
    assert submitted[-1]["spec"]["output"] == "slurm-%A_%a.out"
    assert submit(monkeypatch, "-o", "mine-%j.log", str(script)) == 0
    assert submitted[-1]["spec"]["output"] == "mine-%j.log"
    assert submit(monkeypatch, "--", "echo", "hi") == 0  # a command, as sbatch --wrap... is hsched's own: no file
    assert "output" not in submitted[-1]["spec"]
    # a working folder the submitter cannot write (root writes anywhere: the check itself is stood in for)
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    assert submit(monkeypatch, str(script)) == 0
    assert "output" not in submitted[-1]["spec"]
