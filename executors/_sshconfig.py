"""How to reach a node over SSH: the user's ~/.ssh/config, identity files, and the known_hosts that verify it.

Host keys are always verified. OpenSSH lets a config say `UserKnownHostsFile none` (asyncssh then skips
verification); hsched ignores that and falls back to ~/.ssh/known_hosts, so no setting can turn checking off.
The known_hosts text is read here, off the event loop, and handed to asyncssh as an object; a missing file
then means "nothing trusted yet" rather than asyncssh silently falling back to another file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

from hsched.config import NodeConfig

SSH_CONFIG_ENV = "HSCHED_SSH_CONFIG"
"""An ssh config file to use instead of ~/.ssh/config (tests, or a fleet kept apart from personal aliases)."""

DEFAULT_PORT = 22


def config_paths(explicit: str | os.PathLike[str] | None = None) -> tuple[str, ...]:
    """The ssh config files to read: `explicit`, else $HSCHED_SSH_CONFIG, else () (asyncssh's ~/.ssh/config)."""
    chosen = explicit if explicit is not None else os.environ.get(SSH_CONFIG_ENV)
    return (str(Path(chosen).expanduser()),) if chosen else ()


@dataclass(frozen=True, slots=True)
class Target:
    """Where a node really is once ~/.ssh/config has been applied."""

    node: str
    alias: str
    """The host as the fleet file writes it (a name, an address or a config alias)."""
    host: str
    port: int
    username: str
    known_hosts_files: tuple[Path, ...]
    host_key_alias: str | None = None

    @property
    def destination(self) -> str:
        return f"{self.username}@{self.host}:{self.port}"

    @property
    def known_hosts_name(self) -> str:
        """The host field of this node's known_hosts line, as ssh and asyncssh look it up."""
        name = self.host_key_alias or self.host
        return name if self.port == DEFAULT_PORT else f"[{name}]:{self.port}"

    @property
    def trust_file(self) -> Path:
        """The known_hosts file a newly trusted key is written to (the first one configured)."""
        return self.known_hosts_files[0]


def resolve(cfg: NodeConfig, ssh_config: str | os.PathLike[str] | None = None) -> Target:
    """Apply the ssh config to a node's settings (blocking: reads files; call it in a thread)."""
    if not cfg.host:
        raise ValueError(f"node {cfg.name}: an ssh node needs a host")
    paths = config_paths(ssh_config)
    for path in paths:
        if not os.path.isfile(path):
            raise ValueError(f"{path}: no such ssh config file (from {SSH_CONFIG_ENV} or the executor's ssh_config)")
    opts = asyncssh.SSHClientConnectionOptions(
        config=paths or (), host=cfg.host, port=cfg.port or (), username=cfg.user or (),
    )
    if cfg.known_hosts:
        files = [Path(cfg.known_hosts).expanduser()]
    else:
        configured: Any = opts.known_hosts  # read from a config file: None, one path or a list of paths
        # None means the config said `UserKnownHostsFile none`: hsched verifies anyway, with the default file
        if isinstance(configured, str | Path):
            configured = [configured]
        files = [Path(str(f)).expanduser() for f in configured or ()] or [Path("~/.ssh/known_hosts").expanduser()]
    return Target(node=cfg.name, alias=cfg.host, host=str(opts.host), port=int(opts.port or DEFAULT_PORT),
                  username=str(opts.username), known_hosts_files=tuple(files),
                  host_key_alias=opts.host_key_alias)


def load_known_hosts(target: Target) -> asyncssh.SSHKnownHosts:
    """Every configured known_hosts file as one object (blocking: call it in a thread)."""
    texts = []
    for path in target.known_hosts_files:
        try:
            texts.append(path.read_text(errors="replace"))
        except FileNotFoundError:
            continue
        except OSError as e:
            raise ValueError(f"cannot read known_hosts file {path}: {e.strerror}") from None
    return asyncssh.import_known_hosts("\n".join(texts))


def known_keys(known: asyncssh.SSHKnownHosts, target: Target, addr: str | None) -> list[asyncssh.SSHKey]:
    """The keys known_hosts already trusts for this host (empty: unknown host; else a key has changed)."""
    port = None if target.port == DEFAULT_PORT else target.port
    name = target.host_key_alias or target.host
    matched: Any = known.match(name, addr or "", port)
    return list(matched[0])


def fingerprint(key: asyncssh.SSHKey) -> str:
    return f"{key.get_algorithm()} {key.get_fingerprint('sha256')}"


def known_hosts_line(target: Target, key: asyncssh.SSHKey) -> str:
    """`[host]:port ssh-ed25519 AAAA...` (no comment: the line names the host already)."""
    alg, b64 = key.export_public_key("openssh").decode().split()[:2]
    return f"{target.known_hosts_name} {alg} {b64}\n"


def append_known_host(target: Target, key: asyncssh.SSHKey) -> Path:
    """Append the key to the node's known_hosts file, creating it (0600, folder 0700) if needed."""
    path = target.trust_file
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    line = known_hosts_line(target, key)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as f:
        # a file whose last line lacks its newline would glue our entry onto it
        if f.tell() > 0:
            with path.open("rb") as r:
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":
                    f.write("\n")
        f.write(line)
        f.flush()
        os.fsync(f.fileno())
    return path
