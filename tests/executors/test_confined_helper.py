"""The node helper confined to one folder (`--confine ROOT`), as a service account's lab runs it through sudo:
whatever the account asks, the helper does nothing with root's powers that the account could not do by running
a job as a lab user. In-process (the helper's functions with CONFINE set); the sudo rule and the whole lab are
tests/e2e/ssh/test_lab_service.py."""

from __future__ import annotations

import asyncio
import io
import json
import os
import pwd
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hsched.executors import _confined

from hsched.labsetup import helper_script
from hsched.node import confine, files, launch, records, signals, status, wrap
from hsched.node.main import COMMANDS


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    r = tmp_path / "node"
    r.mkdir(mode=0o711)
    monkeypatch.setattr(confine, "CONFINE", str(r))
    monkeypatch.setattr(confine, "MIN_UID", 1000)
    yield r


def _refused(fn: Any, req: dict[str, Any], why: str) -> None:
    with pytest.raises(confine.Refused, match=why):
        fn(req)


def test_options_set_the_confinement_and_are_taken_off_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(confine, "CONFINE", None)
    monkeypatch.setattr(confine, "MIN_UID", 1000)
    rest = confine.parse_options(["helper", "--confine", "/var/lib/x/../y", "--min-uid", "2000", "status"])
    assert rest == ["helper", "status"]
    assert (confine.CONFINE, confine.MIN_UID) == ("/var/lib/y", 2000)
    assert confine.whoami({})["confine"] == "/var/lib/y"


@pytest.mark.parametrize(("argv", "why"), [
    (["--confine", "/r", "--min-uid", "1000", "--confine", "/", "read"], "--confine given twice"),
    (["--confine", "/r", "--min-uid", "1000", "--min-uid", "0", "read"], "--min-uid given twice"),
    (["--confine", "/r", "--debug", "read"], "unknown option --debug"),
    (["--confine", "/r", "read", "--confine", "/"], "read takes no arguments after it"),
    (["--confine", "r", "read"], "absolute folder"),
    (["--min-uid", "x", "read"], "--min-uid takes a number"),
    (["--confine"], "--confine needs a value"),
])
def test_the_launchers_options_are_final(monkeypatch: pytest.MonkeyPatch, argv: list[str], why: str) -> None:
    """A caller cannot add to what the launcher set (`sudo LAUNCHER --confine / --min-uid 0 ...`)."""
    monkeypatch.setattr(confine, "CONFINE", None)
    monkeypatch.setattr(confine, "MIN_UID", 1000)
    with pytest.raises(confine.BadOptions, match=why):
        confine.parse_options(["helper", *argv])
    assert confine.parse_options(["helper", "--confine", "/r", "_wrap", "/r/runs/a/1"]) == ["helper", "_wrap",
                                                                                         "/r/runs/a/1"]


def test_paths_outside_the_folder_or_through_a_link_are_refused(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "secret"
    outside.write_text("root's")
    (root / "link").symlink_to(tmp_path)
    (root / "user").mkdir()
    (root / "user" / "leaf").symlink_to(outside)
    _refused(files.read_file, {"path": str(outside)}, "outside this helper's folder")
    _refused(files.read_file, {"path": f"{root}/../secret"}, "outside this helper's folder")
    _refused(files.read_file, {"path": f"{root}/link/secret"}, "is a symbolic link")
    _refused(files.read_file, {"path": f"{root}/user/leaf"}, "is a symbolic link")
    _refused(files.newest, {"path": str(tmp_path)}, "outside")
    _refused(files.pack, {"path": f"{root}/link"}, "is a symbolic link")
    (root / "user" / "log").write_text("mine")
    # a file under ROOT that is no run's log (a user's checkpoint file, say) is not the account's to read
    _refused(files.read_file, {"path": f"{root}/user/log"}, "reads only a run's output.log")
    (root / "runs" / "a" / "1").mkdir(parents=True)
    (root / "runs" / "a" / "1" / "output.log").write_text("mine")
    assert files.read_file({"path": f"{root}/runs/a/1/output.log"})["size"] == 4


def test_a_folder_swapped_for_a_link_after_the_check_is_caught_at_open(root: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "secret").write_text("root's")
    (root / "d").symlink_to(tmp_path)
    # _inside looked before the swap: the open itself must still land under the folder
    monkeypatch.setattr(files, "inside", lambda p: os.path.normpath(str(p)))
    with pytest.raises((confine.Refused, OSError)):
        files.read_file({"path": f"{root}/d/secret"})


def test_runs_start_only_as_a_named_user_above_the_minimum_uid(root: Path) -> None:
    run = {"run_dir": f"{root}/runs/a/1", "command": ["id"]}
    _refused(launch.launch, run, "only as a named user")
    _refused(launch.launch, {**run, "user": "root"}, r"no job as root \(uid 0\)")
    _refused(launch.launch, {**run, "user": "daemon"}, "uid of at least 1000")
    _refused(launch.launch, {**run, "run_dir": "/tmp/elsewhere/1", "user": "root"}, "outside")
    # a person's account (uid >= 1000) whose checkpoint folder would be given them outside the folder
    person = next((p.pw_name for p in pwd.getpwall() if p.pw_uid >= 1000 and p.pw_name != "nobody"), None)
    if person is not None:
        _refused(launch.launch, {**run, "user": person, "env": {"HSCHED_CHECKPOINT_DIR": "/etc"}}, "outside")
    assert not (root / "runs").exists()  # a refusal made nothing


def test_the_wrapper_runs_only_a_run_folder_and_spec_the_helper_made(root: Path) -> None:
    fake = root / "runs" / "fake"
    fake.mkdir(parents=True)
    (fake / "spec.json").write_text(json.dumps({"account": None, "command": ["true"]}))
    os.chmod(fake / "spec.json", 0o600)
    if os.geteuid() == 0:
        os.chown(fake, 4242, 4242)  # the account's (or a user's) folder, not root's
        with pytest.raises(confine.Refused, match="not this helper's own"):
            wrap.wrap(str(fake))
        os.chown(fake, 0, 0)
    os.chmod(fake, 0o711)
    # root's folder and spec, but no user to run as: refused before anything starts
    with pytest.raises(confine.Refused, match="uid of at least 1000"):
        wrap.wrap(str(fake))
    assert not (fake / "handle.json").exists()
    with pytest.raises(confine.Refused, match="outside"):
        wrap.wrap("/tmp")


def test_status_and_signal_act_on_the_handle_the_helper_wrote_not_the_requests(root: Path) -> None:
    forged = {"run_dir": f"{root}/runs/none", "pid": 1, "pgid": 1, "start_ticks": 1, "boot_id": records.boot_id()}
    assert status.run_status({"run_dir": forged["run_dir"], "handle": forged}) == {"status": "not_started"}
    assert signals.send_signal({"handle": forged, "signal": "KILL"}) == {"sent": False, "detail": "no run there"}
    report = status.one_status({"run_dir": "/", "handle": forged})
    assert report["status"] == "unknown" and "outside" in report["detail"]


def _tree(base: Path) -> dict[str, tuple[str, int]]:
    out = {}
    for p in sorted(base.rglob("*")):
        rel = str(p.relative_to(base))
        if p.is_symlink():
            out[rel] = ("link", 0)
        elif p.is_dir():
            out[rel] = ("dir", stat.S_IMODE(p.stat().st_mode))
        else:
            out[rel] = (p.read_text(), stat.S_IMODE(p.stat().st_mode))
    return out


def test_pack_and_unpack_move_files_and_folders_only(root: Path, tmp_path: Path) -> None:
    src = root / "files" / "a" / "ckpt"
    (src / "sub").mkdir(parents=True)
    (src / "model.pt").write_text("weights")
    (src / "sub" / "step").write_text("1200")
    os.chmod(src / "sub" / "step", 0o4755)  # a setuid bit never survives the move
    (src / "shadow").symlink_to("/etc/shadow")
    packed = files.pack({"path": str(src)})
    assert packed["files"] == 2 and Path(packed["path"]).parent == root / "xfer"
    dest = root / "files" / "b" / "ckpt"
    dest.mkdir(parents=True)
    (dest / "stale").write_text("old")  # replaced whole
    assert files.unpack({"token": packed["token"], "dest": str(dest)})["files"] == 2
    assert _tree(dest) == {"model.pt": ("weights", 0o644), "sub": ("dir", 0o755), "sub/step": ("1200", 0o755)}
    assert not Path(packed["path"]).exists()
    assert stat.S_IMODE((root / "files" / "b").stat().st_mode) == 0o711


def test_unpack_refuses_a_member_outside_the_folder(root: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("../../escaped")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    import base64

    token = files.append({"offset": 0, "data": base64.b64encode(buf.getvalue()).decode()})["token"]
    with pytest.raises(confine.Refused, match="outside the folder"):
        files.unpack({"token": token, "dest": f"{root}/files/x/ck"})
    assert not (root / "escaped").exists() and not (root / "files" / "x" / "ck").exists()


def test_append_takes_chunks_in_order_only(root: Path) -> None:
    first = files.append({"offset": 0, "data": "aGVsbG8="})  # "hello"
    assert first["size"] == 5
    _refused(files.append, {"token": first["token"], "offset": 0, "data": "aGVsbG8="}, "has 5 bytes")
    assert files.append({"token": first["token"], "offset": 5, "data": "IQ=="})["size"] == 6
    _refused(files.append, {"token": "../../etc/passwd", "offset": 0, "data": ""}, "not a transfer")


def test_a_checkpoint_goes_from_one_confined_node_to_another_through_the_controller(root: Path,
                                                                                     tmp_path: Path) -> None:
    """The controller's side (executors/_confined.py) against the helper's own functions."""
    async def call(command: str, request: dict[str, Any]) -> dict[str, Any]:
        reply: dict[str, Any] = COMMANDS[command](json.loads(json.dumps(request)))
        if "error" in reply:
            raise AssertionError(reply["error"])
        return reply

    src = root / "files" / "a" / "7"
    (src / "deep" / "er").mkdir(parents=True)
    (src / "deep" / "er" / "w").write_bytes(os.urandom(3 * _confined.CHUNK + 17))  # several chunks
    (src / "n").write_text("2")
    local = tmp_path / "controller" / "checkpoints" / "7"
    local.mkdir(parents=True)
    (local / "old").write_text("replaced")

    async def main() -> None:
        await _confined.get_tree(call, str(src), local, node="a", timeout_s=60)
        assert sorted(p.name for p in local.rglob("*")) == ["deep", "er", "n", "w"]
        await _confined.put_tree(call, local, f"{root}/files/b/7", node="b", timeout_s=60)

    asyncio.run(main())
    there = root / "files" / "b" / "7"
    assert (there / "deep" / "er" / "w").read_bytes() == (src / "deep" / "er" / "w").read_bytes()
    assert (there / "n").read_text() == "2"
    assert list((root / "xfer").iterdir()) == []  # nothing left behind on either side
    assert sorted(p.name for p in local.parent.iterdir()) == ["7"]


@pytest.mark.slow  # sh -n, and the helper bundle looks for the system's NVML
def test_the_node_script_is_valid_sh_with_exactly_one_sudo_rule() -> None:
    import subprocess

    script = helper_script(account="svc", prefix="/opt/h", root="/srv/node", public_key="ssh-ed25519 AAAA k")
    assert subprocess.run(["sh", "-n"], input=script, text=True).returncode == 0
    assert 'printf "%s ALL=(root) NOPASSWD: %s %s\\n" "$ACCOUNT" /opt/h/hsched-node-helper "$CMD"' in script
    assert '--confine "$ROOT" --min-uid 1000 "\\$1"' in script and "ROOT=/srv/node" in script
    for bad in ({"prefix": "opt/h"}, {"root": "/srv/$(id)"}, {"account": "-x"}, {"public_key": "a\nb"}, {"min_uid": 0}):
        with pytest.raises(ValueError):
            helper_script(**bad)  # type: ignore[arg-type]


def test_a_transfer_that_is_no_tar_is_the_callers_helper_error(tmp_path: Path) -> None:
    """A broken transfer fails the copy with one ExecutorError (the checkpoint move says so), never a crash."""
    import base64

    from hsched.errors import HelperError

    async def call(command: str, request: dict[str, Any]) -> dict[str, Any]:
        if command == "pack":
            return {"token": "0" * 32, "path": "/x", "size": 9}
        if command == "read":
            return {"data": base64.b64encode(b"not a tar"[request["offset"]:]).decode()}
        return {}

    with pytest.raises(HelperError, match="n1: get /ck: the transfer does not read as a tar file"):
        asyncio.run(_confined.get_tree(call, "/ck", tmp_path / "ck", node="n1", timeout_s=60))
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing half-made left behind
