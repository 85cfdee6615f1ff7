"""Host keys are always verified: unknown and changed keys are refused with their fingerprint, and
`hsched node trust NAME` is the way in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import asyncssh
import pytest
from hsched.executors.ssh import SSHExecutor

from hsched.errors import NodeRefused, Refusal
from tests.e2e.ssh.conftest import run
from tests.e2e.ssh.hosts import TestHost, TestHosts, keygen

pytestmark = pytest.mark.slow  # real sshd hosts and processes


def fingerprint(h: TestHost) -> str:
    return str(asyncssh.import_public_key(h.host_key_line).get_fingerprint("sha256"))


def probe_error(ex: SSHExecutor, reason: Refusal) -> str:
    """The message of the NodeRefused a probe meets (with the reason asked), also kept as last_error."""
    async def main() -> str:
        try:
            await ex.probe()
        except NodeRefused as e:
            assert e.reason is reason and ex.last_error is e
            return str(e)
        finally:
            await ex.close()
        raise AssertionError("connected to a host whose key is not trusted")

    return run(main())


def test_unknown_host_key_is_refused_with_its_fingerprint(ssh_hosts: TestHosts, tmp_path: Path) -> None:
    h = ssh_hosts[0]
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    msg = probe_error(ssh_hosts.executor(h, cfg={"known_hosts": str(empty)}), Refusal.HOST_KEY_UNKNOWN)
    assert msg.startswith(f"{h.name}: unknown host key for {h.known_hosts_name}: ssh-ed25519 {fingerprint(h)}")
    assert f"hsched node trust {h.name}" in msg and "\n" not in msg


def test_changed_host_key_is_refused(ssh_hosts: TestHosts, tmp_path: Path) -> None:
    h = ssh_hosts[1]
    other = keygen(tmp_path / "other_key", "impostor")
    kh = tmp_path / "known_hosts"
    kh.write_text(f"{h.known_hosts_name} {' '.join(other.split()[:2])}\n")
    msg = probe_error(ssh_hosts.executor(h, cfg={"known_hosts": str(kh)}), Refusal.HOST_KEY_CHANGED)
    assert "HOST KEY CHANGED" in msg and fingerprint(h) in msg and "ssh-keygen -R" in msg


def test_known_hosts_none_in_ssh_config_does_not_switch_checking_off(
        ssh_hosts: TestHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h = ssh_hosts[2]
    monkeypatch.setenv("HOME", str(tmp_path))  # the fallback ~/.ssh/known_hosts is then empty
    config = tmp_path / "ssh_config"
    config.write_text(ssh_hosts.ssh_config.read_text().replace(f"UserKnownHostsFile {ssh_hosts.known_hosts}",
                                                               "UserKnownHostsFile none"))
    msg = probe_error(ssh_hosts.executor(h, ssh_config=config), Refusal.HOST_KEY_UNKNOWN)
    assert "unknown host key" in msg and fingerprint(h) in msg


def hsched(tmp_path: Path, hosts: TestHosts, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HSCHED_HOME=str(tmp_path / "home"), HSCHED_FLEET=str(tmp_path / "fleet.toml"),
               **hosts.env())
    return subprocess.run([sys.executable, "-m", "hsched", *args], env=env, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


def test_trust_command_adds_the_key_after_confirmation(ssh_hosts: TestHosts, tmp_path: Path) -> None:
    h = ssh_hosts[0]
    kh = tmp_path / "fleet_known_hosts"
    (tmp_path / "fleet.toml").write_text(
        f'[[node]]\nname = "{h.name}"\nexecutor = "ssh"\nhost = "{h.name}"\nknown_hosts = "{kh}"\n')

    refused = hsched(tmp_path, ssh_hosts, "node", "trust", h.name)  # no terminal to answer, no --yes
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert fingerprint(h) in refused.stdout and not kh.exists()

    added = hsched(tmp_path, ssh_hosts, "node", "trust", h.name, "--yes", "--json")
    assert added.returncode == 0, added.stderr
    info = json.loads(added.stdout)
    assert info["added"] and info["fingerprint"] == f"ssh-ed25519 {fingerprint(h)}" and info["file"] == str(kh)
    assert kh.read_text() == h.known_hosts_line

    async def probe() -> str:
        ex = ssh_hosts.executor(h, cfg={"known_hosts": str(kh)})
        try:
            return str((await ex.probe())["boot_id"])
        finally:
            await ex.close()

    assert run(probe())
    again = hsched(tmp_path, ssh_hosts, "node", "trust", h.name, "--yes", "--json")
    assert json.loads(again.stdout)["already_trusted"] and kh.read_text() == h.known_hosts_line


def test_trust_command_never_replaces_a_changed_key(ssh_hosts: TestHosts, tmp_path: Path) -> None:
    h = ssh_hosts[1]
    kh = tmp_path / "fleet_known_hosts"
    other = keygen(tmp_path / "other_key", "impostor")
    kh.write_text(f"{h.known_hosts_name} {' '.join(other.split()[:2])}\n")
    before = kh.read_text()
    (tmp_path / "fleet.toml").write_text(
        f'[[node]]\nname = "{h.name}"\nexecutor = "ssh"\nhost = "{h.name}"\nknown_hosts = "{kh}"\n')
    out = hsched(tmp_path, ssh_hosts, "node", "trust", h.name, "--yes")
    assert out.returncode == 1 and "HOST KEY CHANGED" in out.stderr and "ssh-keygen -R" in out.stderr
    assert kh.read_text() == before
