"""Real sshd test hosts: each in its own network namespace with its own address, or on loopback ports.

    with TestHosts(tmp_path, count=3) as hosts:       # or the `ssh_hosts` fixture in tests/e2e/ssh/conftest.py
        h = hosts[0]
        ex = hosts.executor(h)                       # an SSHExecutor that reaches h through hosts.ssh_config
        h.cut(); ...; h.restore()                    # a network failure, and the way back

As root with `ip netns`, host i lives in namespace `hst<tag><i>` at 10.231.X.(4i+2), reached over a veth pair
whose root end is 10.231.X.(4i+1)/30; cutting it off is `ip link set <veth> down`, as a pulled cable. Without
them (not root, no iproute2), host i listens on 127.0.0.(10+i) at a free port, and a cut freezes its sshd
processes (SIGSTOP): the TCP connection stays open and goes silent, which is what a real cut looks like.

Every host has its own generated host key; one generated user key logs in to all of them. `known_hosts`
trusts them all and `ssh_config` gives each an alias (`<name>`) with its address, port, user, key and that
known_hosts file. sshd sets HSCHED_NODE_ROOT for each host's sessions, so hosts that share this machine's
filesystem still keep their helper cache and run folders apart. Everything started is stopped on `close()`:
sshd, processes left in the namespaces or carrying a run marker under the base folder, veths, namespaces.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.procs import descendants, processes

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
RUN_MARKER = "HSCHED_RUN_DIR"


def sshd_available() -> bool:
    return os.path.exists(SSHD) and shutil.which("ssh-keygen") is not None


def netns_available() -> bool:
    """Root, iproute2, and the kernel lets us make a namespace (not in every container)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    name = f"hsprobe{secrets.token_hex(3)}"
    ok = subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode == 0
    if ok:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return ok


def uts_available() -> bool:
    """Root, and the kernel lets us give a process a host name of its own (`own_hostname`)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--uts", "--", "true"], capture_output=True).returncode == 0


def _run(*cmd: str) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip() or p.stdout.strip()}")
    return p.stdout


def keygen(path: Path, comment: str) -> str:
    """An ed25519 key pair at `path`; returns the public key line."""
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path))
    return Path(f"{path}.pub").read_text().strip()


def _wait_port(addr: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((addr, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


@dataclass
class TestHost:
    name: str
    address: str
    port: int
    dir: Path
    root: Path
    """HSCHED_NODE_ROOT on this host: its helper cache and run folders."""
    host_key_line: str
    netns: str | None = None
    veth: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    frozen: list[int] = field(default_factory=list)

    __test__ = False  # not a pytest test class

    @property
    def known_hosts_name(self) -> str:
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"

    @property
    def known_hosts_line(self) -> str:
        alg, b64 = self.host_key_line.split()[:2]
        return f"{self.known_hosts_name} {alg} {b64}\n"

    def node_config(self, **overrides: Any) -> Any:
        from hsched.config import NodeConfig

        fields: dict[str, Any] = {"name": self.name, "executor": "ssh", "host": self.name}
        fields.update(overrides)
        return NodeConfig(**fields)

    def cut(self) -> None:
        """Cut the host off the network (its processes go on running)."""
        if self.veth:
            _run("ip", "link", "set", self.veth, "down")
            return
        self.frozen = [p for p in self._sshd_pids()]
        for pid in self.frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def restore(self) -> None:
        if self.veth:
            _run("ip", "link", "set", self.veth, "up")
            _wait_port(self.address, self.port)
            return
        for pid in self.frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.frozen = []

    def _sshd_pids(self) -> list[int]:
        """This host's sshd and every sshd process below it (one per connection)."""
        if self.proc is None:
            return []
        root = self.proc.pid
        procs = processes()
        return [p.pid for p in [*(q for q in procs if q.pid == root), *descendants(root, procs)]
                if p.comm.startswith("sshd")]


class TestHosts:
    """`count` sshd test hosts under `base`; a context manager (or call start() and close())."""

    __test__ = False

    def __init__(self, base: Path, count: int = 3, *, use_netns: bool | None = None, prefix: str = "host",
                 session_env: dict[str, str] | None = None, own_hostname: bool = False) -> None:
        self.base = Path(base)
        self.session_env = dict(session_env or {})
        """More variables for every session (SLURM_CONF on a login node host): values without spaces."""
        self.own_hostname = own_hostname
        """Each host's sshd in a UTS namespace of its own named as the host (root: `unshare --uts`), so its
        sessions see that host name, as two machines would; else every host has this machine's."""
        self.count = count
        self.use_netns = netns_available() if use_netns is None else use_netns
        self.prefix = prefix
        self.tag = secrets.token_hex(2)
        self.hosts: list[TestHost] = []
        self.user = getpass.getuser()
        self.user_key = self.base / "id_ed25519"
        self.known_hosts = self.base / "known_hosts"
        self.ssh_config = self.base / "ssh_config"
        self.authorized_keys = self.base / "authorized_keys"

    def __enter__(self) -> TestHosts:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getitem__(self, i: int) -> TestHost:
        return self.hosts[i]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    # ------------------------------------------------------------------------------------------ start

    def _subnet(self) -> int:
        """A 10.231.X.0/24 that no interface here uses yet (several test sessions may run at once)."""
        used = _run("ip", "-4", "-o", "addr")
        for _ in range(100):
            x = secrets.randbelow(250) + 2
            if f"10.231.{x}." not in used:
                return x
        raise RuntimeError("no free 10.231.X.0/24 for the test hosts")

    def start(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        os.chmod(self.base, 0o700)
        pub = keygen(self.user_key, "hsched-test-user")
        self.authorized_keys.write_text(pub + "\n")
        os.chmod(self.authorized_keys, 0o600)
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
        x = self._subnet() if self.use_netns else 0
        try:
            for i in range(self.count):
                self.hosts.append(self._start_host(i, x))
            for h in self.hosts:
                _wait_port(h.address, h.port)
        except BaseException:
            self.close()
            raise
        self.known_hosts.write_text("".join(h.known_hosts_line for h in self.hosts))
        self.write_ssh_config()

    def _start_host(self, i: int, x: int) -> TestHost:
        name = f"{self.prefix}{i}"
        d = self.base / name
        d.mkdir(exist_ok=True)
        root = d / "node-root"
        host_key = d / "ssh_host_ed25519_key"
        host_pub = keygen(host_key, f"{name}-hostkey")
        netns = veth = None
        if self.use_netns:
            netns, veth, peer = f"hst{self.tag}{i}", f"hsv{self.tag}{i}h", f"hsv{self.tag}{i}n"
            address, gw, port = f"10.231.{x}.{4 * i + 2}", f"10.231.{x}.{4 * i + 1}", 22
            _run("ip", "netns", "add", netns)
            host = TestHost(name=name, address=address, port=port, dir=d, root=root, host_key_line=host_pub,
                            netns=netns)
            self.hosts.append(host)  # registered at once, so close() removes a half-made host too
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
            host.veth = veth
            _run("ip", "link", "set", peer, "netns", netns)
            _run("ip", "addr", "add", f"{gw}/30", "dev", veth)
            _run("ip", "link", "set", veth, "up")
            _run("ip", "-n", netns, "addr", "add", f"{address}/30", "dev", peer)
            _run("ip", "-n", netns, "link", "set", peer, "up")
            _run("ip", "-n", netns, "link", "set", "lo", "up")
            self.hosts.pop()
        else:
            address = f"127.0.0.{10 + i}"
            port = _free_port(address)
            host = TestHost(name=name, address=address, port=port, dir=d, root=root, host_key_line=host_pub)
        (d / "home").mkdir(exist_ok=True)
        conf = d / "sshd_config"
        conf.write_text("\n".join([
            f"Port {port}",
            f"ListenAddress {'0.0.0.0' if netns else address}",
            f"HostKey {host_key}",
            f"PidFile {d / 'sshd.pid'}",
            # the test key for every account, and an account's own keys (the lab service account's)
            f"AuthorizedKeysFile {self.authorized_keys} %h/.ssh/authorized_keys",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",  # the keys live under /tmp, which sshd's ownership checks reject
            "Subsystem sftp internal-sftp",
            # a HOME of its own: no login script of this machine (pyenv's rehash, with its lock) runs in a host's
            # sessions, so killing a session at teardown cannot leave a lock that stalls every later login
            " ".join([f"SetEnv HSCHED_NODE_ROOT={root} HOME={d / 'home'}",
                      *(f"{k}={v}" for k, v in self.session_env.items())]),
            "ClientAliveInterval 5",
            "ClientAliveCountMax 3",
            "MaxStartups 100",
            "LogLevel ERROR",
            "",
        ]))
        cmd = [SSHD, "-D", "-e", "-f", str(conf)]
        if self.own_hostname:
            # (the namespace's host name set through /proc, then sshd in its place: no `hostname` tool needed)
            cmd = ["unshare", "--uts", "--", "sh", "-c", 'echo "$1" > /proc/sys/kernel/hostname && shift && exec "$@"',
                   "sh", name, *cmd]
        if netns:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        log = (d / "sshd.log").open("ab")
        host.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        log.close()
        return host

    def write_ssh_config(self, extra: str = "") -> None:
        blocks = []
        for h in self.hosts:
            blocks.append("\n".join([
                f"Host {h.name}",
                f"  HostName {h.address}",
                f"  Port {h.port}",
                f"  User {self.user}",
                f"  IdentityFile {self.user_key}",
                "  IdentitiesOnly yes",
                f"  UserKnownHostsFile {self.known_hosts}",
                "",
            ]))
        self.ssh_config.write_text("\n".join(blocks) + extra)

    # --------------------------------------------------------------------------------------- helpers

    def executor(self, host: TestHost, **kwargs: Any) -> Any:
        """An SSHExecutor for `host` through the test ssh config, with quick keepalives and backoff."""
        from hsched.executors.ssh import SSHExecutor

        cfg_overrides = kwargs.pop("cfg", {})
        opts: dict[str, Any] = {"ssh_config": self.ssh_config, "keepalive_interval_s": 1.0, "keepalive_count_max": 3,
                                "backoff_initial_s": 0.2, "backoff_max_s": 1.0, "connect_timeout_s": 5.0,
                                "command_timeout_s": 30.0}
        opts.update(kwargs)
        return SSHExecutor(host.node_config(**cfg_overrides), **opts)

    def fleet_toml(self, path: Path, *, gpus: int = 2, model: str = "NVIDIA A100-SXM4-80GB",
                   memory_mib: int = 81920) -> Path:
        """A fleet file with every host as an ssh node with `gpus` simulated devices (use with
        HSCHED_SSH_CONFIG=hosts.ssh_config)."""
        parts = []
        for h in self.hosts:
            parts.append("\n".join([
                "[[node]]", f'name = "{h.name}"', 'executor = "ssh"', f'host = "{h.name}"',
                "[node.simulate]", f'model = "{model}"', f"count = {gpus}", f"memory_mib = {memory_mib}", "",
            ]))
        path.write_text("\n".join(parts))
        return path

    def env(self) -> dict[str, str]:
        """Environment for a controller or CLI that should reach these hosts."""
        return {"HSCHED_SSH_CONFIG": str(self.ssh_config)}

    # ------------------------------------------------------------------------------------------ close

    def close(self) -> None:
        for h in self.hosts:
            if h.frozen:
                h.restore()
            if h.proc is not None and h.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(h.proc.pid, signal.SIGTERM)
                try:
                    h.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(h.proc.pid, signal.SIGKILL)
                    h.proc.wait(timeout=5)
        self._kill_leftovers()
        for h in self.hosts:
            if h.veth:
                subprocess.run(["ip", "link", "del", h.veth], capture_output=True)
            if h.netns:
                subprocess.run(["ip", "netns", "del", h.netns], capture_output=True)
        self.hosts = []

    def _kill_leftovers(self) -> None:
        """Processes the tests started on the hosts: jobs (by their run marker) and anything in a namespace."""
        pids: set[int] = set()
        for h in self.hosts:
            if h.netns:
                out = subprocess.run(["ip", "netns", "pids", h.netns], capture_output=True, text=True).stdout
                pids.update(int(p) for p in out.split() if p.isdigit())
        marker = f"{RUN_MARKER}={self.base}".encode()
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            try:
                env = Path(f"/proc/{name}/environ").read_bytes()
            except OSError:
                continue
            if any(item.startswith(marker) for item in env.split(b"\0")):
                pids.add(int(name))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
