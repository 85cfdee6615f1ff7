"""Issue 27, point 7: a 20-digit dependency id was an internal OverflowError (SQLite keeps 64-bit integers), a
20-digit array index the same, and `--array 0-99999999999999999999` walked its range. Every parser of job ids
and task indices (dependencies, arrays, the CLI's `12` and `12_3`) refuses a number beyond the store's range
in one line (exit 2), before anything is stored or asked of the controller."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from hsched.cli import main
from hsched.controller.api import Api
from hsched.errors import UserError
from hsched.spec.arrays import parse_array
from hsched.spec.dependencies import parse_dependency
from hsched.testing import Lab

HUGE = "99999999999999999999"
ID_MAX = 2**63 - 1


@pytest.mark.parametrize("text", [f"afterok:{HUGE}", f"afterany:3:{HUGE}", f"after:{ID_MAX + 1}", "afterok:0",
                                  pytest.param(f"afterok:{'9' * 5000}", id="afterok:5000-digits"),
                                  f"afterok:3?afternotok:{HUGE}"])
def test_a_dependency_beyond_the_stores_range_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=f"a job id from 1 to {ID_MAX}"):
        parse_dependency(text)


def test_the_largest_id_is_still_a_dependency() -> None:
    (dep,), _ = parse_dependency(f"afterok:{ID_MAX}")
    assert dep.job_ids == (ID_MAX,)


@pytest.mark.parametrize(("text", "expected"), [
    (HUGE, "an array task index from 0 to 4000000"),
    (f"0-{HUGE}", "an array task index from 0 to 4000000"),  # never walked: refused at once
    ("0-4000000", "at most 10000 tasks"),
    (f"1-9:{HUGE}", "a step from 0 to 4000000"),
    (f"1-9%{HUGE}", "%N with N from 1 to 10000"),
])
def test_an_array_index_beyond_the_bound_is_refused(text: str, expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        parse_array(text)


def test_arrays_within_the_bounds_are_unchanged() -> None:
    spec = parse_array("3990000-3999999:1000%2")
    assert spec.indices == tuple(range(3990000, 4000000, 1000)) and spec.max_running == 2
    assert parse_array("1,1,3-5").indices == (1, 3, 4, 5)


@pytest.mark.parametrize("field", [{"dependency": f"afterok:{HUGE}"}, {"array": HUGE}])
def test_the_controller_refuses_them_in_a_raw_request(tmp_path: Path, field: dict[str, str]) -> None:
    """A client other than the CLI sends the spec as it likes: the controller's answer is the same one line
    (a UserError naming the field), never an internal OverflowError from the store."""
    async def go() -> None:
        async with Lab.open(tmp_path) as lab:
            with pytest.raises(UserError, match=f"{next(iter(field))}: expected"):
                await Api(lab.ctl).handle("submit", {"spec": {"command": ["true"], **field}}, os.getuid())
            assert await lab.ctl.db(lab.ctl.store.jobs) == []

    asyncio.run(go())


class NoController:
    """A client that fails the test if asked anything: an id out of range is refused before any request."""

    def __enter__(self) -> NoController:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def reachable(self) -> bool:
        return False

    def call(self, op: str, **args: Any) -> Any:
        raise AssertionError(f"asked the controller {op} {args}")


def run_cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *argv: str) -> int:
    monkeypatch.setenv("HSCHED_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("hsched.cli.jobs._client", NoController)
    monkeypatch.setattr("hsched.cli.submitting._client", NoController)
    monkeypatch.setattr("hsched.client.Client", NoController)
    monkeypatch.setattr("sys.argv", ["hsched", *argv])
    with pytest.raises(SystemExit) as ex:
        main()
    return int(ex.value.code or 0)


@pytest.mark.parametrize("argv", [
    ("submit", "--dependency", f"afterok:{HUGE}", "--", "true"),
    ("submit", "--array", HUGE, "--", "true"),
    ("submit", "--array", f"0-{HUGE}", "--", "true"),
    ("show", HUGE), ("logs", HUGE), ("eff", HUGE), ("cancel", HUGE), ("cancel", f"5_{HUGE}"), ("hold", f"5_{HUGE}"),
    ("requeue", "3", HUGE), ("wait", HUGE),
])
def test_the_cli_refuses_them_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]) -> None:
    assert run_cli(monkeypatch, tmp_path, *argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "internal error" not in err, err
    assert HUGE in err or "from 1 to" in err or "from 0 to" in err, err
