"""Setting up a lab: an hsched the lab's users could not run is refused with one line naming the closed folder;
the systemd unit's content."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from hsched.labsetup import install_problem, systemd_unit
from hsched.paths import Home


def test_an_interpreter_behind_a_closed_folder_is_named() -> None:
    base = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's own folders are closed to others already
    closed = base / "root-only"
    (closed / "bin").mkdir(parents=True)
    exe = closed / "bin" / "python"
    exe.write_text("")
    os.chmod(exe, 0o755)
    os.chmod(base, 0o755)
    os.chmod(closed, 0o700)
    problem = install_problem(str(exe))
    assert problem is not None and "\n" not in problem
    assert problem.startswith(f"the lab's users cannot run this hsched ({exe}): folder {closed} is closed to "
                              "other users (mode 700)")
    assert "docs/lab.md" in problem
    os.chmod(closed, 0o755)
    os.chmod(exe, 0o700)
    assert f"{exe} is not executable by other users (mode 700)" in (install_problem(str(exe)) or "")
    shutil.rmtree(base)


def test_the_unit_keeps_jobs_across_restarts_and_names_a_lab_socket_elsewhere(tmp_path: Path) -> None:
    unit = systemd_unit(Home(tmp_path / "lab", lab=True, lab_socket=tmp_path / "s.sock"), user="hsched",
                        executable="/opt/hsched/bin/python")
    lines = unit.splitlines()
    assert f"ExecStart=/opt/hsched/bin/python -m hsched.controller.server {tmp_path / 'lab'}" in lines
    assert {"KillMode=process", "Restart=on-failure", "RuntimeDirectory=hsched", "User=hsched",
            f"Environment=HSCHED_LAB_SOCKET={tmp_path / 's.sock'}", "WantedBy=multi-user.target"} <= set(lines)
    default = systemd_unit(Home(Path("/var/lib/hsched"), lab=True), user="root").splitlines()
    assert not any(x.startswith(("User=", "Environment=")) for x in default)


def test_the_readmes_lab_fleet_parses() -> None:
    from hsched.config import load_fleet

    fleet = load_fleet(Path(__file__).resolve().parents[2] / "examples" / "lab" / "workstations.toml")
    assert [(n.name, n.executor) for n in fleet.nodes] == [("ws1", "local"), ("ws2", "ssh"), ("ws3", "ssh"),
                                                           ("ws4", "ssh")]


def test_install_print_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    # issue 29: `daemon install --print` wrote lab.json (marking the folder a lab's) as a side effect
    from hsched.cli import main

    home = tmp_path / "lab"
    monkeypatch.setenv("HSCHED_HOME", str(home))
    monkeypatch.setattr("hsched.labsetup.install_problem", lambda *a: None)
    monkeypatch.setattr("sys.argv", ["hsched", "daemon", "install", "--print"])
    with pytest.raises(SystemExit) as ex:
        main()
    assert ex.value.code in (0, None)
    out = capsys.readouterr().out.splitlines()
    assert "ExecReload=/bin/kill -HUP $MAINPID" in out  # `systemctl reload hsched` is `hsched daemon reload`
    assert not (home / "lab.json").exists()
