"""`hsched serve ...` on the command line (issue 30), in-process with the controller recorded: what a start sends
(options, or a spec file's [service] table with options over it), and bad input as one line naming the option or
key with the fix, exit 2, before anything is sent (and before a controller is started)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

REPLY = {"name": "llm", "address": "http://127.0.0.1:8123", "slo_p99_ms": 300.0, "user": "alice", "state": "active",
         "replicas": {"min": 1, "max": 4, "wanted": 1, "ready": 0, "starting": 1, "draining": 0}}


class Recorder:
    calls: list[dict[str, Any]] = []

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def reachable(self) -> bool:
        return False

    def call(self, op: str, **args: Any) -> Any:
        Recorder.calls.append({"op": op, **{k: v for k, v in args.items() if k != "environ"}})
        return REPLY


def hsched(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from hsched.cli._app import run

    Recorder.calls = []
    monkeypatch.setattr("sys.argv", ["hsched", *argv])
    with pytest.raises(SystemExit) as ex:
        run()
    out, err = capsys.readouterr()
    return int(ex.value.code or 0), out, err


@pytest.fixture(autouse=True)
def recorded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HSCHED_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("hsched.cli.serve._client", Recorder)
    monkeypatch.chdir(tmp_path)


def test_start_sends_the_service_table(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path) -> None:
    code, out, err = hsched(monkeypatch, capsys, "serve", "start", "llm", "--replicas", "1-4", "--gpus-per-replica",
                            "1", "--gpu-type", "L4", "--gpu-memory", "20G", "--qos", "prod", "--slo", "p99=300ms",
                            "--target-concurrency", "4", "--ready-path", "/health", "--port", "8123", "--",
                            "python", "server.py", "--model", "m")
    assert (code, err) == (0, "")
    assert out == "Service llm on http://127.0.0.1:8123: 1-4 replicas, p99 target 300 ms\n"
    (call,) = Recorder.calls
    assert call["op"] == "serve" and call["action"] == "start" and call["source"] == "<command line>"
    assert call["service"] == {"name": "llm", "replicas": "1-4", "slo": "p99=300ms", "target_concurrency": 4.0,
                               "ready_path": "/health", "port": 8123, "gpus_per_replica": 1,
                               "command": ["python", "server.py", "--model", "m"],
                               "resources": {"gpu_memory": "20G", "gpu_types": ["L4"]}, "qos": "prod",
                               "workdir": str(tmp_path)}


def test_stable_window_goes_with_the_service_and_round_trips(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from hsched.model import JobSpec
    from hsched.spec.service import service_from_dict, service_from_table, service_to_dict

    code, _, err = hsched(monkeypatch, capsys, "serve", "start", "llm", "--slo", "p99=1s", "--stable-window", "6s",
                          "--", "x")
    assert (code, err) == (0, "")
    assert Recorder.calls[0]["service"]["stable_window"] == "6s"
    spec = service_from_table({"name": "llm", "slo": "p99=1s", "stable_window": "6s"}, JobSpec(command=("x",)), "f")
    assert spec.stable_window_s == 6.0
    assert service_from_dict(service_to_dict(spec)) == spec
    old = service_to_dict(spec)
    del old["stable_window_s"]  # a row stored before the field: Knative's 60 s
    assert service_from_dict(old).stable_window_s == 60.0


def test_start_from_a_spec_file(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                tmp_path: Path) -> None:
    (tmp_path / "llm.toml").write_text('[service]\nname = "llm"\nreplicas = "2-8"\nslo = "p99=1s"\n'
                                       'command = ["python", "server.py"]\nworkdir = "models"\n'
                                       '[service.resources]\ngpus = 1\n')
    code, out, _ = hsched(monkeypatch, capsys, "serve", "start", "llm.toml", "--replicas", "1-3", "--json")
    assert code == 0 and '"address"' in out
    (call,) = Recorder.calls
    assert call["source"] == str(tmp_path / "llm.toml")
    assert call["service"] == {"name": "llm", "replicas": "1-3", "slo": "p99=1s", "command": ["python", "server.py"],
                               "workdir": str(tmp_path / "models"), "resources": {"gpus": 1}}


@pytest.mark.parametrize(("argv", "line"), [
    (["llm", "--replicas", "4-1", "--slo", "p99=1s", "--", "x"],
     "--replicas '4-1': expected 0 <= MIN <= MAX, 1 <= MAX <= 1024 (e.g. 1-4)"),
    (["llm", "--replicas", "lots", "--slo", "p99=1s", "--", "x"],
     "--replicas 'lots': expected MIN-MAX (e.g. 1-4) or a count"),
    (["llm", "--", "x"], "--slo: required, the latency objective (e.g. --slo p99=300ms)"),
    (["llm", "--slo", "300ms", "--", "x"], "--slo '300ms': expected p99=DURATION, e.g. p99=300ms"),
    (["llm", "--slo", "p99=1s", "--ready-path", "health", "--", "x"],
     "--ready-path 'health': expected an HTTP path starting with / (e.g. /health)"),
    (["llm", "--slo", "p99=1s"], "nothing to run: give the replica's command after -- (hsched serve start NAME "
                                 "--slo p99=300ms -- python server.py)"),
    (["a/b", "--slo", "p99=1s", "--", "x"], "<command line>: name: 'a/b' is not a service name: use letters, digits, "
                                            "'.', '_' and '-' (at most 63, starting with a letter or digit)"),
    (["llm", "--slo", "p99=1s", "--gpu-memory", "lots", "--", "x"],
     "<command line>: resources.gpu_memory: expected a GPU memory size such as 40G (GB, as vendors count) or 40GiB, "
     "found 'lots'"),
    (["llm", "--slo", "p99=1s", "--shared", "--", "x"],
     "<command line>: resources.shared: a shared job takes a fraction of one GPU: gpus = 1 and nodes = 1"),
    (["nosuch.toml"], "nosuch.toml: no such file; check the path"),
    (["llm", "--slo", "p99=1s", "--stable-window", "soon", "--", "x"],
     "--stable-window 'soon': expected a duration such as 60s, 6s or 2m"),
    (["llm", "--slo", "p99=1s", "--stable-window", "200ms", "--", "x"],
     "--stable-window '200ms': the stable window must be from 1 s to an hour"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], line: str, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = hsched(monkeypatch, capsys, "serve", "start", *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("hsched: error: ") and err.rstrip("\n").endswith(line)
    assert Recorder.calls == []  # nothing sent


def test_a_spec_file_without_a_service_table(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    (tmp_path / "job.toml").write_text('command = ["x"]\n')
    code, _, err = hsched(monkeypatch, capsys, "serve", "start", "job.toml")
    assert code == 2 and "job.toml: expected a [service] table" in err and err.count("\n") == 1


def test_scale_checks_its_range_and_the_others_send_their_request(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = hsched(monkeypatch, capsys, "serve", "scale", "llm", "3-1")
    assert code == 2 and "MIN-MAX '3-1'" in err and Recorder.calls == []
    code, out, _ = hsched(monkeypatch, capsys, "serve", "scale", "llm", "1-2")
    assert code == 0 and Recorder.calls == [{"op": "serve", "action": "scale", "name": "llm", "replicas": "1-2"}]
    code, out, _ = hsched(monkeypatch, capsys, "serve", "stop", "llm", "--json")
    assert code == 0 and Recorder.calls == [{"op": "serve", "action": "stop", "name": "llm"}]
    code, out, _ = hsched(monkeypatch, capsys, "serve", "show", "llm", "--json")
    assert code == 0 and "http://127.0.0.1:8123" in out


def test_submit_of_a_service_file_says_how_to_start_it(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "llm.toml").write_text('[service]\nname = "llm"\nslo = "p99=1s"\ncommand = ["x"]\n')
    code, _, err = hsched(monkeypatch, capsys, "submit", "llm.toml")
    assert code == 2 and err == (f"hsched: error: {tmp_path / 'llm.toml'}: a [service] table is a service, not a job: "
                                 f"start it with `hsched serve start {tmp_path / 'llm.toml'}`\n")


@pytest.mark.parametrize("key,value,says", [("stable_window", "abc", "stable_window 'abc': expected a duration"),
                                            ("slo", "p99=x", "slo 'p99=x': expected p99=DURATION"),
                                            ("replicas", "3-1", "replicas '3-1'")])
def test_a_spec_files_bad_service_key_names_the_file_and_key(key: str, value: str, says: str) -> None:
    from hsched.errors import UserError
    from hsched.model import JobSpec
    from hsched.spec.service import service_from_table

    own = {"name": "llm", "slo": "p99=1s", key: value}
    with pytest.raises(UserError) as e:
        service_from_table(own, JobSpec(command=("x",)), "/lab/llm.toml")
    assert str(e.value).startswith(f"/lab/llm.toml: {says}")
