"""Issue 27, point 7: an older node helper is never used silently. A helper reports its protocol (`whoami`,
`probe`); a controller meeting an installed (root's, sudo) helper older than its own refuses the node in one line
naming `hsched node helper-script`, since the service account cannot replace it; a shipped helper that is not
this hsched's (same folder, other bytes) is shipped again. Before, a helper of protocol 2 (installed before
sbatch's -o/-e) took the launch and silently wrote no -o file.

The older helper is this one with its protocol set back to 2 and the -o/-e keys of a launch dropped, as the
helpers installed before -o/-e did (the substitutions are checked, so the stand-in cannot quietly become new)."""

from __future__ import annotations

import asyncio
import os
import pwd
import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hsched.executors.base import LaunchRequest
from hsched.executors.local import HELPER_PATH, LocalExecutor

from hsched.errors import NodeRefused
from hsched.model import RunStatus
from tests.conftest import Hs
from tests.e2e.ssh.conftest import run, ssh_hosts  # noqa: F401  (the fixture, for the shipped helper's test)
from tests.e2e.ssh.hosts import TestHosts
from tests.executors.waits import wait_exited
from tests.labusers import world_folder

pytestmark = pytest.mark.slow  # real helper processes (and, for the shipped helper, real sshd hosts)

DROPS_OUTPUT = '"output": req.get("output") or None, "error": req.get("error") or None,'


def older_helper_files() -> dict[str, str]:
    """The modules in which this node helper differs from one of protocol 2: it says 2 (version.py), and a
    launch's -o/-e are dropped (launch.py)."""
    version = (HELPER_PATH.parent / "version.py").read_text()
    version, n = re.subn(r"^HELPER_VERSION = \d+$", "HELPER_VERSION = 2", version, count=1, flags=re.M)
    assert n == 1, "the helper no longer names HELPER_VERSION in version.py: update this stand-in"
    launch = (HELPER_PATH.parent / "launch.py").read_text()
    assert launch.count(DROPS_OUTPUT) == 1, "the helper's launch no longer reads -o/-e so: update this stand-in"
    return {"version.py": version, "launch.py": launch.replace(DROPS_OUTPUT, '"output": None, "error": None,')}


def older_helper(folder: Path) -> Path:
    """A whole helper of protocol 2 in `folder` (this one's modules, older_helper_files' instead); its script."""
    folder.mkdir()
    for module in HELPER_PATH.parent.glob("*.py"):
        shutil.copyfile(module, folder / module.name)
    for name, text in older_helper_files().items():
        (folder / name).write_text(text)
    return folder / HELPER_PATH.name


def _installed(base: Path, helper: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """`helper` installed as a service account's lab installs it (a launcher that confines it), reached
    through `sudo -n LAUNCHER CMD`; a stand-in sudo on PATH runs it as this user (the rule itself is
    tests/security/test_confinement.py's). Returns (launcher, its ROOT)."""
    root = base / "node-root"
    root.mkdir(mode=0o711)
    launcher = base / "hsched-node-helper"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" -E -s "{helper}" --confine "{root}" --min-uid 1000 "$1"\n')
    launcher.chmod(0o755)
    bin_dir = base / "bin"
    bin_dir.mkdir()
    (bin_dir / "sudo").write_text('#!/bin/sh\n[ "$1" = "-n" ] && shift\nexec "$@"\n')
    (bin_dir / "sudo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return launcher, root


def _request(base: Path, out: Path) -> LaunchRequest:
    # a confined helper runs jobs only as a named user above --min-uid: nobody (65534) is on every machine
    return LaunchRequest(run_dir=str(base / "home" / "runs" / "n1" / "7-1-1700000000000"),
                         command=("sh", "-c", "echo to-the-o-file"), user="nobody", output=str(out))


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder the job's user (nobody) may write its -o file in; the helper runs as root (CI does)."""
    if os.geteuid() != 0:
        pytest.skip("an installed helper runs as root and starts jobs as another user: run as root (CI does)")
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody on this machine")
    d = world_folder("hsched-helper-version-")
    (d / "out").mkdir()
    os.chmod(d / "out", 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_an_installed_helper_of_an_older_protocol_is_refused_naming_the_fix(
        base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    launcher, root = _installed(base, older_helper(base / "old"), monkeypatch)
    out = base / "out" / "job.out"

    async def main() -> tuple[str, str]:
        ex = LocalExecutor(node="n1", helper=str(launcher))
        try:
            with pytest.raises(NodeRefused) as probed:
                await ex.probe()  # first contact: the node is refused, not probed and used
            with pytest.raises(NodeRefused) as launched:
                await ex.launch(_request(base, out))  # nothing is started on it either
            return str(probed.value), str(launched.value)
        finally:
            await ex.close()

    for why in asyncio.run(main()):
        assert "\n" not in why and "n1: node helper" in why and "speaks protocol 2" in why, why
        assert "hsched node helper-script --install" in why, why
    assert not out.exists() and not (root / "runs").exists()  # no run started that would lose its -o file


def test_an_installed_helper_of_this_protocol_writes_the_o_file(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same installation with this hsched's helper: probed, and the -o file is written."""
    launcher, _root = _installed(base, HELPER_PATH, monkeypatch)
    out = base / "out" / "job.out"

    async def main() -> RunStatus:
        ex = LocalExecutor(node="n1", helper=str(launcher))
        try:
            assert (await ex.probe())["helper_version"] >= 3
            handle = await ex.launch(_request(base, out))
            return (await wait_exited(ex, handle)).status
        finally:
            await ex.close()

    assert asyncio.run(main()) is RunStatus.EXITED
    assert out.read_text() == "to-the-o-file\n"


def test_a_shipped_helper_that_is_not_this_hscheds_is_shipped_again(ssh_hosts: TestHosts,  # noqa: F811
                                                                    tmp_path: Path) -> None:
    from hsched.executors.ssh import helper_bundle

    host = ssh_hosts[0]
    shipped = host.root / helper_bundle().dirname / "nodehelper.py"
    out = host.dir / "job.out"
    out.unlink(missing_ok=True)

    async def first() -> None:
        ex = ssh_hosts.executor(host)
        try:
            await ex.probe()
        finally:
            await ex.close()

    async def again() -> tuple[int, RunStatus]:
        ex = ssh_hosts.executor(host)
        try:
            version = (await ex.probe())["helper_version"]
            req = LaunchRequest(run_dir=str(tmp_path / "home" / "runs" / host.name / "9-1-1700000000000"),
                                command=("sh", "-c", "echo to-the-o-file"), output=str(out))
            handle = await ex.launch(req)
            return version, (await wait_exited(ex, handle)).status
        finally:
            await ex.close()

    run(first())
    assert shipped.is_file()
    for name, text in older_helper_files().items():  # an older helper left in the folder this hsched ships to
        (shipped.parent / name).write_text(text)
    version, status = run(again())
    for name, data in helper_bundle().files:  # shipped again, whole
        assert (shipped.parent / name).read_bytes() == data, name
    assert version >= 3 and status is RunStatus.EXITED
    assert out.read_text() == "to-the-o-file\n"


def test_the_controller_shows_the_node_refused_with_the_one_line(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the lab sees: the node with the older helper is DOWN with the reason, and gets no job."""
    # PATH (the stand-in sudo) before the CLI's environment
    launcher, _root = _installed(base, older_helper(base / "old"), monkeypatch)
    fleet = base / "fleet.toml"
    fleet.write_text(f'[[node]]\nname = "n1"\nexecutor = "local"\nhelper = "{launcher}"\n'
                     '[node.simulate]\nmodel = "NVIDIA A100-SXM4-80GB"\ncount = 1\n')
    hs = Hs(base / "home", fleet)
    try:
        while True:  # until the first probe has answered (the test's own timeout is the deadline)
            [node] = hs.json("nodes")
            if node["state"] != "PROBING":
                break
            time.sleep(0.1)
        assert node["state"] == "DOWN", node
        reason = str(node["message"])
        assert "\n" not in reason and "speaks protocol 2" in reason, node
        assert "hsched node helper-script --install" in reason, node
    finally:
        hs.stop()
