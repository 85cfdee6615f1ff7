"""sacct's and scancel's habits (issue 29, item 9): `sacct -j 12 -X -n` with `N:S` exit codes, and `scancel -u USER`,
with the controller replaced by a recorder: what the CLI asks and prints."""

from __future__ import annotations

from typing import Any

import pytest

from hsched.cli import main

JOBS = [
    {"id": 12, "display_id": "12", "name": "train", "user": "ann", "state": "COMPLETED", "reason": "", "qos": "normal",
     "exit_code": 0, "submit_time": "t", "start_time": None, "end_time": None, "gpus": 1, "nodes": 1, "restarts": 0,
     "runs": [], "array_id": None},
    {"id": 13, "display_id": "13", "name": "killed", "user": "bob", "state": "FAILED", "reason": "", "qos": "normal",
     "exit_code": 137, "submit_time": "t", "start_time": None, "end_time": None, "gpus": 1, "nodes": 1, "restarts": 0,
     "runs": [], "array_id": None},
]


class Recorder:
    calls: list[tuple[str, dict[str, Any]]] = []

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def call(self, op: str, **args: Any) -> Any:
        Recorder.calls.append((op, args))
        if op == "acct":
            return {"jobs": JOBS, "gpu_hours": {"total": 0.0, "by_user": {}, "by_model": {}}}
        if op == "queue":
            return [dict(j, state="RUNNING") for j in JOBS]
        if op == "show":
            return next(j for j in JOBS if j["id"] == args["id"])
        if op == "cancel":
            return {"id": args["id"], "display_id": str(args["id"]), "state": "CANCELLED", "reason": ""}
        raise AssertionError(op)


def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    Recorder.calls = []
    monkeypatch.setattr("hsched.cli.jobs._client", Recorder)
    monkeypatch.setattr("hsched.client.Client", Recorder)
    monkeypatch.setattr("sys.argv", ["hsched", *argv])
    with pytest.raises(SystemExit) as ex:
        main()
    return int(ex.value.code or 0), capsys.readouterr().out


def test_sacct_jobs_allocations_noheader_and_exit_codes(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(monkeypatch, capsys, "acct", "-j", "13", "-X", "-n", "-P", "-o", "jobid,state,exitcode")
    assert (code, out) == (0, "13|FAILED|0:9\n")  # killed by SIGKILL, as sacct writes it
    assert Recorder.calls[0] == ("acct", {"since": 0.0})  # -j: whenever it ran
    code, out = run(monkeypatch, capsys, "acct", "-j", "12", "-o", "jobid,exitcode")
    assert out.splitlines()[0].split() == ["Jobid", "Exitcode"] and out.splitlines()[-1].split() == ["12", "0:0"]


def test_scancel_by_user(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(monkeypatch, capsys, "cancel", "-u", "bob")
    assert code == 0 and [c for c in Recorder.calls if c[0] == "cancel"] == [("cancel", {"id": 13})]
    assert ("queue", {}) in Recorder.calls
    assert out == "job 13: CANCELLED\n"
    code, out = run(monkeypatch, capsys, "cancel", "-u", "nobody")
    assert (code, out) == (0, "") and [c[0] for c in Recorder.calls] == ["queue"]
