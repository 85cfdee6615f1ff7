"""Per-job commands (cancel, preempt, requeue...) report each job and exit as scancel does."""

from __future__ import annotations

from typing import Any

import pytest
import typer

from hsched.cli import control
from hsched.errors import ControllerError, UserError


class _Client:
    """Answers like the controller: job 1 is cancelled, job 2 had already ended, job 3 does not exist."""

    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def call(self, op: str, **args: Any) -> Any:
        if op == "show":  # the CLI looks a job up first (is it an array?)
            if args["id"] == 3:
                raise UserError("no job 3; `hsched queue --all` lists the jobs")
            return {"id": args["id"], "array_id": None}
        if args["id"] == 2:
            raise ControllerError("job 2 has already ended (COMPLETED); nothing to cancel")
        if args["id"] == 3:
            raise UserError("no job 3; `hsched queue --all` lists the jobs")
        return {"id": args["id"], "state": "CANCELLED", "reason": "cancelled"}


@pytest.fixture(autouse=True)
def client(monkeypatch: pytest.MonkeyPatch) -> None:
    import hsched.client

    monkeypatch.setattr(hsched.client, "Client", _Client)


def test_all_done_is_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    control.each("cancel", [1], False)
    assert capsys.readouterr().out == "job 1: CANCELLED (cancelled)\n"


def test_an_ended_job_is_a_failure_and_the_others_are_still_done(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as ex:
        control.each("cancel", [2, 1], False)
    assert ex.value.exit_code == 1
    out = capsys.readouterr()
    assert out.out == "job 1: CANCELLED (cancelled)\n"
    assert out.err == "hsched: error: job 2 has already ended (COMPLETED); nothing to cancel\n"


def test_a_job_that_does_not_exist_is_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as ex:
        control.each("cancel", [2, 3], False)
    assert ex.value.exit_code == 2
