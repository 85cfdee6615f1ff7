"""The quick `hsched queue` (issue 18): a plain argv is read without Typer, with the meaning Typer gives it,
and lists the same lines; anything else (an argument, --help, an option given twice) is Typer's."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hsched.cli import listing, main, quick
from hsched.cli.listing import OPTIONS
from hsched.serialize import pick_jobs


def queue_command() -> Any:
    import typer.main

    from hsched.cli import app

    return typer.main.get_command(app).commands["queue"]


def typer_params(argv: list[str]) -> dict[str, Any]:
    import typer.main

    from hsched.cli import app

    group = typer.main.get_command(app)
    ctx = queue_command().make_context("queue", list(argv), parent=group.make_context("hsched", ["queue"]))
    return dict(ctx.params)


def test_the_quick_parser_knows_every_option_as_typer_declares_it() -> None:
    declared = {p.name: p for p in queue_command().params}
    assert set(declared) == set(OPTIONS)
    for name, (opts, kind, _low, _high) in OPTIONS.items():
        p = declared[name]
        assert sorted(p.opts) == sorted(opts) and not p.secondary_opts and not p.multiple, name
        assert bool(p.is_flag) == (kind == quick.FLAG), name


PLAIN = [[], ["--json"], ["-a", "--json"], ["--all", "--me"], ["-u", "ann,bob", "-t", "PD,R"],
         ["--states=pending", "--format", "%.6i %t"], ["-o", "%i %j %R", "--user", "ann"]]


@pytest.mark.parametrize("argv", PLAIN)
def test_a_plain_argv_means_what_typer_makes_of_it(argv: list[str]) -> None:
    parsed = quick.parse(list(argv), OPTIONS)
    assert parsed is not None and parsed[1] == []
    assert parsed[0] == typer_params(argv)


@pytest.mark.parametrize("argv", [["extra"], ["--help"], ["--json", "--json"], ["-at", "PD"],
                                  ["--user"], ["-t", "-x"], ["--json=1"], ["--nosuch"]])
def test_anything_else_is_typers(argv: list[str]) -> None:
    assert listing.quick_queue(list(argv)) is None


JOBS = [
    {"id": 3, "name": "train", "user": "ann", "state": "RUNNING", "reason": "", "qos": "normal", "priority": 0,
     "gpus": 2, "nodes": 1, "placement": [{"node": "gpu-a", "devices": ["u0", "u1"]}], "submit_time": None,
     "start_time": None, "end_time": None, "time_limit_s": 5400, "array_id": None},
    {"id": 4, "name": "[bold]x", "user": "bob", "state": "PENDING", "reason": "Resources", "qos": "prod",
     "priority": 5, "gpus": 1, "nodes": 1, "placement": [], "submit_time": None, "start_time": None,
     "end_time": None, "time_limit_s": None, "array_id": None},
    {"id": 5, "name": "old", "user": "ann", "state": "COMPLETED", "reason": "completed", "qos": "normal",
     "priority": 0, "gpus": 1, "nodes": 1, "placement": [], "submit_time": None, "start_time": None,
     "end_time": None, "time_limit_s": None, "array_id": None},
]


class Controller:
    asked: list[dict[str, Any]] = []

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def call(self, op: str, **args: Any) -> Any:
        assert op == "queue"
        Controller.asked.append(args)
        return [j for j in JOBS if args.get("all") or j["state"] != "COMPLETED"]

    def call_text(self, op: str, **args: Any) -> Any:
        """As the controller answers `queue` with `text`: the jobs it picks, as JSON text."""
        assert op == "queue" and args.pop("text", True)
        Controller.asked.append(args)
        jobs = pick_jobs([j for j in JOBS if args.get("all") or j["state"] != "COMPLETED"],
                         **{k: (None if args.get(k) is None else set(args[k])) for k in ("users", "states", "ids")})
        if args.get("fields") is not None:  # (the table's: only those, as the controller cuts them)
            jobs = [{k: j[k] for k in args["fields"] if k in j} for j in jobs]
        return memoryview(("[" + ", ".join(json.dumps(j, default=str) for j in jobs) + "]").encode())

    def write_text(self, op: str, out: Any, **args: Any) -> Any:
        """As `Client.write_text`: the text written to `out`, None."""
        out.write(self.call_text(op, **args))


class OldController(Controller):
    """A controller from before `text`: it sends the objects and picks nothing."""

    def call_text(self, op: str, **args: Any) -> Any:
        return self.call(op, all=args.get("all"))

    def write_text(self, op: str, out: Any, **args: Any) -> Any:
        return self.call(op, all=args.get("all"))


@pytest.mark.parametrize(("argv", "ids"), [
    (["--json"], [3, 4]), (["-a", "--json"], [3, 4, 5]), (["--json", "--me"], [3]),
    (["--json", "-u", "bob,ann"], [3, 4]),
    (["--json", "-t", "PD"], [4]), (["--json", "-a", "-t", "CD,R"], [3, 5]), (["--json", "-j", "4,5"], [4]),
    (["--json", "-u", "bob", "--me"], [])])
def test_a_listing_written_through_is_the_one_decoded(argv: list[str], ids: list[int], monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # issue 33: to a pipe, `queue --json` writes the controller's text through; it must be what the CLI printed
    # when it decoded the objects and picked them itself (an older controller's way, still served)
    monkeypatch.setenv("USER", "ann")
    said = []
    for fake in (Controller, OldController):
        monkeypatch.setattr("hsched.cli.listing._client", fake)
        monkeypatch.setattr("sys.argv", ["hsched", "queue", *argv])
        with pytest.raises(SystemExit) as ex:
            main()
        out, err = capsys.readouterr()
        said.append((int(ex.value.code or 0), out, err))
    assert said[0] == said[1] and said[0][0] == 0
    assert [j["id"] for j in json.loads(said[0][1])] == ids


@pytest.mark.parametrize("argv", [*PLAIN, ["-t", "nosuch"], ["-o", "%i %Q"], ["--all", "-t", "CD"]])
def test_quick_and_typer_list_the_same(argv: list[str], monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("USER", "ann")
    monkeypatch.setattr("hsched.cli.listing._client", Controller)
    from hsched.cli._app import run as typer_run

    said = []
    for entry in (main, typer_run):
        Controller.asked = []
        monkeypatch.setattr("sys.argv", ["hsched", "queue", *argv])
        with pytest.raises(SystemExit) as ex:
            entry()
        out, err = capsys.readouterr()
        said.append((int(ex.value.code or 0), out, err, Controller.asked))
    assert said[0] == said[1]
    if argv == ["-t", "nosuch"]:
        assert said[0][0] == 2 and said[0][2].startswith("hsched: error: --states 'nosuch': not a state")


@pytest.mark.parametrize("quick_path", [True, False])
def test_squeue_habits_jobs_noheader_and_squeue_format(quick_path: bool, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # issue 29: `squeue -h -j 3 -o ...` and SQUEUE_FORMAT, as scripts written for Slurm use them
    monkeypatch.setattr("hsched.cli.listing._client", Controller)
    from hsched.cli._app import run as typer_run

    def listed(*argv: str) -> tuple[int, str, str]:
        monkeypatch.setattr("sys.argv", ["hsched", "queue", *argv])
        with pytest.raises(SystemExit) as ex:
            (main if quick_path else typer_run)()
        out, err = capsys.readouterr()
        return int(ex.value.code or 0), out, err

    assert listed("-h", "-j", "3", "-o", "%i %u %R") == (0, "3 ann gpu-a\n", "")
    assert listed("--noheader", "--jobs", "4,5")[1].split() == ["4", "[bold]x", "bob", "PD", "prod", "5", "1", "0:00",
                                                                 "(Resources)"]
    monkeypatch.setenv("SQUEUE_FORMAT", "%i|%t")
    assert listed()[1] == "JOBID|ST\n3|R\n4|PD\n"
    assert listed("-o", "%u")[1] == "USER\nann\nbob\n"  # -o wins
    code, _, err = listed("-j", "99999999999999999999")
    assert code == 2 and "--jobs: expected a job id from 1 to" in err
