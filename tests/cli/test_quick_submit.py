"""The quick `hsched submit` (issue 18): parsed without Typer when the argv is plain, with the very meaning
Typer gives it; anything else declined to Typer, which answers as it always did. Also: `--version`, a quick
submit and a quick `queue --json` never import Typer, pydantic, rich, textual or asyncssh (a fresh interpreter
says so)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from hsched.cli import main, submitting
from hsched.cli.submitting import OPTIONS, parse


def submit_command() -> Any:
    import typer.main

    from hsched.cli import app

    return typer.main.get_command(app).commands["submit"]


def typer_params(argv: list[str]) -> dict[str, Any]:
    """What Typer's parser makes of `submit ARGV`, lists for tuples (as the quick parser gives them)."""
    import typer.main

    from hsched.cli import app

    group = typer.main.get_command(app)
    ctx = submit_command().make_context("submit", list(argv), parent=group.make_context("hsched", ["submit"]))
    params = {k: list(v) if isinstance(v, tuple | list) else v for k, v in ctx.params.items()}
    params["args"] = params.get("args") or []
    return params


def test_the_quick_parser_knows_every_option_as_typer_declares_it() -> None:
    declared = {p.name: p for p in submit_command().params if p.name != "args"}
    assert set(declared) == set(OPTIONS), "an option added to jobs.py's submit belongs in submitting.OPTIONS too"
    for name, (opts, kind, low, high) in OPTIONS.items():
        p = declared[name]
        assert sorted(p.opts) == sorted(opts) and not p.secondary_opts, name
        assert bool(p.is_flag) == (kind == submitting.FLAG), name
        assert bool(p.multiple) == (kind == submitting.MANY), name
        assert (getattr(p, "min", None), getattr(p, "max", None)) == (low, high), name


PLAIN = [
    ["--", "true"],
    ["--hold", "--", "python", "train.py", "--epochs", "3"],
    ["--gpus", "4", "--interconnect", "nvlink", "--", "python", "train.py"],
    ["-G", "2", "-N", "2", "-J", "sweep", "--qos", "prod", "-c", "8", "--mem", "64G", "--", "x"],
    ["--gpus=3", "--name=a=b", "--", "a", "--", "b"],
    ["-e", "err-%j.log", "-o", "%x_%A_%a.out", "--env", "A=1", "--env", "B=2", "--gpu-type", "a100",
     "--gpu-type", "h100", "--", "x"],
    ["--time", "90", "--signal", "USR1@60", "--checkpoint-signal", "B:USR1@10", "--retries", "100", "--", "x"],
    ["--array", "0-9%2", "-d", "afterok:3:4", "--kill-on-invalid-dep", "--json", "--parsable", "--", "x"],
    ["-C", "nvme&ib", "--gpu-memory", "40G", "--tasks-per-node", "2", "--gpus-per-node", "0", "-D", "/w", "x"],
    ["--priority", "7", "-a", "1,3", "-t", "1-00", "nosuchprogram-hsched", "--qos", "x"],
    ["--name", "", "--", "x"],
    [],
    ["--hold"],
]

DECLINED = [
    # (--gpus and --nodes are text since they take MIN-MAX ranges: both paths read them with the same function,
    # hsched.spec.sizes; so the numeric options' doubts are shown on --cpus and --ntasks)
    ["--help"], ["-h", "--", "x"], ["--bogus", "--", "x"], ["-G4", "--", "x"], ["--cpus", "x", "--", "y"],
    ["--gpus", "-1", "--", "x"], ["--priority", "-5", "--", "x"], ["--retries", "101", "--", "x"],
    ["--ntasks", "0", "--", "x"], ["--cpus", "+2", "--", "x"], ["--cpus", " 2", "--", "x"], ["--gpus"],
    ["--name", "a", "--name", "b", "--", "x"], ["--hold=yes", "--", "x"], ["-Gx"], ["--name", "-x", "--", "y"],
    ["job.toml"], ["--qos", "prod", "JOB.TOML", "--qos", "x"], ["--", "spec.toml"],
]


@pytest.mark.parametrize("argv", PLAIN)
def test_a_plain_argv_means_what_typer_makes_of_it(argv: list[str]) -> None:
    parsed = parse(list(argv))
    assert parsed is not None, "the quick path should take this one"
    params, args = parsed
    assert {**params, "args": args} == typer_params(argv)


@pytest.mark.parametrize("argv", DECLINED)
def test_anything_unsure_is_typers(argv: list[str]) -> None:
    assert parse(list(argv)) is None


def test_a_file_named_as_the_command_is_typers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.sh").write_text("#!/bin/sh\n#SBATCH -G 2\necho hi\n")
    assert parse(["train.sh"]) is None and parse(["--", "train.sh"]) is None  # a batch script: its #SBATCH lines
    assert parse(["--", "python", "train.sh"]) is not None


class Recorder:
    """The controller, as seen by the CLI: records each call, answers a pending job."""

    calls: list[dict[str, Any]] = []
    reply: dict[str, Any] = {"id": 7, "state": "PENDING"}

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def reachable(self) -> bool:
        return False

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        Recorder.calls.append({"op": op, **args})
        return Recorder.reply


def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], *,
        quick: bool) -> tuple[int, str, str, list[dict[str, Any]]]:
    """`hsched submit ARGV` through main() (quick: the quick path may take it) or straight through Typer."""
    Recorder.calls = []
    monkeypatch.setattr("sys.argv", ["hsched", "submit", *argv])
    from hsched.cli._app import run as typer_run

    with pytest.raises(SystemExit) as ex:
        main() if quick else typer_run()
    out, err = capsys.readouterr()
    calls = [{k: v for k, v in c.items() if k != "environ"} for c in Recorder.calls]
    return int(ex.value.code or 0), out, err, calls


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HSCHED_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("hsched.cli.submitting._client", Recorder)
    monkeypatch.setattr("hsched.cli.jobs._client", Recorder)


@pytest.mark.parametrize("argv", [
    *PLAIN,
    ["--gpus", "3", "--nodes", "2", "--", "x"],  # not a multiple: one line, exit 2
    ["--dependency", "afterok:x", "--", "true"],  # refused by the spec check: one line, exit 2
    ["--env", "NOEQUALS", "--", "x"],
    ["--qos", "nosuch", "--", "x"],
])
def test_quick_and_typer_say_and_send_the_same(argv: list[str], monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str], recorded: None) -> None:
    assert run(monkeypatch, capsys, argv, quick=True) == run(monkeypatch, capsys, argv, quick=False)


def test_outputs_json_parsable_and_arrays(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                          recorded: None) -> None:
    code, out, _, [call] = run(monkeypatch, capsys, ["--json", "--", "x"], quick=True)
    assert code == 0 and json.loads(out) == {"id": 7, "state": "PENDING"}
    assert call["op"] == "submit" and call["source"] == "<command line>" and call["spec"] == {"command": ["x"]}
    assert run(monkeypatch, capsys, ["--parsable", "--", "x"], quick=True)[1] == "7\n"
    monkeypatch.setattr(Recorder, "reply", {"id": 9, "state": "PENDING", "array_id": 9})
    assert run(monkeypatch, capsys, ["-a", "0-3", "--", "x"], quick=True)[1] == "Submitted batch job 9\n"  # as sbatch


def test_the_submitters_environment_and_folder_go_along(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str], recorded: None,
                                                        tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HSCHED_TEST_VAR", "v")
    Recorder.calls = []
    monkeypatch.setattr("sys.argv", ["hsched", "submit", "--", "x"])
    with pytest.raises(SystemExit):
        main()
    [call] = Recorder.calls
    assert call["environ"]["HSCHED_TEST_VAR"] == "v" and call["environ"]["PWD"] == str(tmp_path)


class Up(Recorder):
    """A controller that runs: the CLI leaves the spec check to it."""

    def reachable(self) -> bool:
        return True


def test_with_a_controller_up_the_spec_is_checked_there_only(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], recorded: None) -> None:
    monkeypatch.setattr("hsched.cli.submitting._client", Up)

    def no_check(*_: object) -> None:
        raise AssertionError("the CLI checked a spec the running controller checks anyway")

    monkeypatch.setattr("hsched.cli.submitting.check", no_check)
    code, _, _, [call] = run(monkeypatch, capsys, ["--dependency", "afterok:x", "--", "true"], quick=True)
    assert code == 0 and call["spec"]["dependency"] == "afterok:x"  # the controller's to refuse (tested live)


# ------------------------------------------------------------------------------- a fresh interpreter

HEAVY = ("typer", "click", "rich", "textual", "asyncssh", "networkx", "matplotlib", "prometheus_client", "sqlite3",
         "pydantic")

CHILD = textwrap.dedent("""
    import json, os, socket, sys, threading
    home = sys.argv[1]
    os.environ["HSCHED_HOME"] = home
    if sys.argv[2] in ("submit", "queue"):
        # a stand-in controller: one reply, as a real one would give it
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(os.path.join(home, "controller.sock"))
        srv.listen(1)
        def answer():
            conn, _ = srv.accept()
            buf = b""
            while not buf.endswith(b"\\n"):
                buf += conn.recv(1 << 16)
            req = json.loads(buf)
            result = {"id": 1, "state": "PENDING", "op": req["op"]}
            reply = {"ok": True, "result": [result] if req["op"] == "queue" else result,
                     "hsched": req["hsched"], "protocol": req["protocol"]}
            conn.sendall(json.dumps(reply).encode() + b"\\n")
        threading.Thread(target=answer, daemon=True).start()
        sys.argv = (["hsched", "submit", "--json", "--gpus", "1", "--", "true"] if sys.argv[2] == "submit"
                    else ["hsched", "queue", "--json", "--all"])
    else:
        sys.argv = ["hsched", "--version"]
    before = set(sys.modules)
    from hsched.cli import main
    try:
        main()
    except SystemExit as e:
        code = e.code
    heavy = sorted(m for m in set(sys.modules) - before if m.split(".")[0] in HEAVY)
    print(json.dumps({"code": code, "heavy": heavy, "paths": "hsched.paths" in sys.modules}))
""")


@pytest.mark.slow  # a fresh interpreter: what a command imports is only seen from an empty sys.modules
@pytest.mark.parametrize("what", ["--version", "submit", "queue"])
def test_version_and_a_quick_submit_or_queue_import_nothing_heavy(what: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    code = f"HEAVY = {HEAVY!r}\n" + CHILD
    env = {k: v for k, v in os.environ.items() if k != "_HSCHED_COMPLETE"}
    out = subprocess.run([sys.executable, "-c", code, str(home), what], capture_output=True, text=True, env=env,
                         timeout=120, check=True).stdout.splitlines()
    report = json.loads(out[-1])
    assert report["code"] == 0 and report["heavy"] == []
    if what == "queue":
        # a listing whose controller answers needs only its socket's path (hsched.homes): not hsched.paths, whose
        # pathlib (with the urllib.parse and ipaddress it imports) is ~3 ms of a 30 ms `queue --json` in a wheel
        # install (an editable one imports pathlib at start-up, for its finder)
        assert report["paths"] is False
    if what == "submit":
        assert json.loads(out[0]) == {"id": 1, "state": "PENDING", "op": "submit"}
    elif what == "queue":
        assert json.loads(out[0]) == [{"id": 1, "state": "PENDING", "op": "queue"}]
    else:
        assert out[0].startswith("hsched ")
