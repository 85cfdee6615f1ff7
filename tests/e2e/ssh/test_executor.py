"""The SSH executor against real sshd test hosts: probe, launch, status, logs, helper shipping, channels."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from hsched.executors.base import LaunchRequest, StatusQuery
from hsched.executors.ssh import SSHExecutor, helper_bundle

from hsched.errors import NodeUnreachable
from hsched.model import RunHandle, RunReport, RunStatus
from tests.e2e.ssh.conftest import run
from tests.e2e.ssh.hosts import TestHosts
from tests.executors.waits import wait_exited, wait_log

pytestmark = pytest.mark.slow  # real sshd hosts and processes


def test_probe_three_hosts_in_parallel(ssh_hosts: TestHosts) -> None:
    spans: list[tuple[float, float]] = []

    async def timed(ex: object) -> dict:  # type: ignore[type-arg]
        t0 = time.monotonic()
        try:
            return await ex.probe()  # type: ignore[attr-defined,no-any-return]
        finally:
            spans.append((t0, time.monotonic()))

    async def main() -> list[dict]:  # type: ignore[type-arg]
        exs = [ssh_hosts.executor(h) for h in ssh_hosts]
        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(timed(ex)) for ex in exs]
            return [t.result() for t in tasks]
        finally:
            for ex in exs:
                await ex.close()

    probes = run(main())
    # in parallel: every probe had started before any one finished (whatever the machine's load)
    assert max(start for start, _ in spans) < min(end for _, end in spans)
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    for h, p in zip(ssh_hosts, probes, strict=True):
        assert p["boot_id"] == boot and p["cpus"] > 0 and p["memory_total_mib"] > 0
        assert p["remote_root"] == str(h.root)  # each host keeps its files apart (HSCHED_NODE_ROOT)
        shipped = h.root / helper_bundle().dirname / "nodehelper.py"
        assert shipped.read_bytes() == dict(helper_bundle().files)["nodehelper.py"]


def test_launch_on_each_host_reports_exit_code_and_log(ssh_hosts: TestHosts, local_runs: Path) -> None:
    async def one(i: int) -> tuple[RunHandle, RunReport, bytes, RunHandle]:
        ex = ssh_hosts.executor(ssh_hosts[i])
        try:
            run_dir = str(local_runs / ssh_hosts[i].name / f"{i + 1}-1-1700000000000")
            req = LaunchRequest(run_dir=run_dir, command=("sh", "-c", f'echo "out $N"; echo err >&2; exit {10 + i}'),
                                env={"N": str(i)})
            handle = await ex.launch(req)
            again = await ex.launch(req)  # idempotent per run folder: the same run, not a second one
            rep = await wait_exited(ex, handle)
            return handle, rep, await ex.read_log(run_dir, 0), again
        finally:
            await ex.close()

    async def main() -> list[tuple[RunHandle, RunReport, bytes, RunHandle]]:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(one(i)) for i in range(len(ssh_hosts))]
        return [t.result() for t in tasks]

    for i, (handle, rep, log, again) in enumerate(run(main())):
        assert handle.run_dir.startswith(str(local_runs))  # handles carry the controller's (local) path
        assert again == handle
        assert rep.status is RunStatus.EXITED and rep.exit_code == 10 + i
        assert rep.handle == handle
        assert sorted(log.decode().splitlines()) == ["err", f"out {i}"]
        remote_dirs = list((ssh_hosts[i].root / "runs").glob(f"*/{i + 1}-1-1700000000000"))
        assert len(remote_dirs) == 1 and json.loads((remote_dirs[0] / "exit.json").read_text())["exit_code"] == 10 + i
        assert not Path(handle.run_dir).exists()  # nothing was written at the local path


def test_signal_and_read_log_offsets(ssh_hosts: TestHosts, local_runs: Path) -> None:
    async def main() -> tuple[bool, RunReport, bytes, bytes, bool]:
        ex = ssh_hosts.executor(ssh_hosts[1])
        try:
            run_dir = str(local_runs / "sig")
            script = "trap 'echo got-term; exit 42' TERM; echo ready; while :; do sleep 0.05; done"
            h = await ex.launch(LaunchRequest(run_dir=run_dir, command=("sh", "-c", script)))
            await wait_log(ex, run_dir, b"ready")
            sent = await ex.signal(h, "TERM")
            rep = await wait_exited(ex, h)
            full = await ex.read_log(run_dir, 0)
            tail = await ex.read_log(run_dir, full.index(b"got-term"), max_bytes=3)
            beyond = await ex.read_log(run_dir, 10_000)
            again = await ex.signal(h, "TERM")  # the run has ended: nothing is signalled
            return sent, rep, tail, beyond, again
        finally:
            await ex.close()

    sent, rep, tail, beyond, again = run(main())
    assert sent and rep.exit_code == 42 and tail == b"got" and beyond == b"" and again is False


def test_status_of_unknown_run_and_many_concurrent_calls(ssh_hosts: TestHosts, local_runs: Path) -> None:
    """16 calls at once on one connection: the channel semaphore keeps them under sshd's MaxSessions."""

    async def main() -> list[list[RunReport]]:
        ex = ssh_hosts.executor(ssh_hosts[0])
        try:
            return list(await asyncio.gather(*(ex.status([StatusQuery(str(local_runs / f"none-{i}"))])
                                               for i in range(16))))
        finally:
            await ex.close()

    reports = run(main())
    assert [r[0].status for r in reports] == [RunStatus.NOT_STARTED] * 16


def test_connect_failures_back_off_with_one_clear_line(tmp_path: Path) -> None:
    from hsched.config import NodeConfig
    from tests.e2e.ssh.hosts import _free_port

    port = _free_port("127.0.0.1")  # nothing listens there
    cfg = NodeConfig(name="nowhere", executor="ssh", host="127.0.0.1", port=port, known_hosts=str(tmp_path / "kh"))

    (tmp_path / "ssh_config").write_text("")

    async def main() -> tuple[str, str, float]:
        ex = SSHExecutor(cfg, ssh_config=tmp_path / "ssh_config", backoff_initial_s=5, backoff_max_s=5)
        with pytest.raises(NodeUnreachable) as first:  # connection refused: it may come back
            await ex.probe()
        t0 = time.monotonic()
        with pytest.raises(NodeUnreachable) as second:  # the same error, typed the same
            await ex.probe()
        return str(first.value), str(second.value), time.monotonic() - t0

    first, second, _ = run(main())
    assert first.startswith("nowhere: cannot connect to") and f":{port}" in first and "\n" not in first
    assert "next try in" in second  # inside the backoff window: no new attempt, the last error again


def test_ssh_config_alias_with_proxyjump(ssh_hosts: TestHosts, tmp_path: Path) -> None:
    """A fleet host that is an ~/.ssh/config alias reached through a jump host (ProxyJump)."""
    from hsched.config import NodeConfig

    jump, far = ssh_hosts[0], ssh_hosts[1]
    if jump.netns:
        # namespaces do not route to each other: jump into host0 and on to its own loopback address
        target, expect = ["  HostName 127.0.0.1", "  Port 22", f"  HostKeyAlias {jump.address}"], jump.root
    else:
        target, expect = [f"  HostName {far.address}", f"  Port {far.port}"], far.root
    config = tmp_path / "ssh_config"
    config.write_text(ssh_hosts.ssh_config.read_text() + "\n".join([
        "Host far-away", *target, f"  ProxyJump {jump.name}", f"  User {ssh_hosts.user}",
        f"  IdentityFile {ssh_hosts.user_key}", f"  UserKnownHostsFile {ssh_hosts.known_hosts}", ""]))

    async def main() -> dict:
        ex = SSHExecutor(NodeConfig(name="far", executor="ssh", host="far-away"), ssh_config=config)
        try:
            return await ex.probe()
        finally:
            await ex.close()

    assert run(main())["remote_root"] == str(expect)


def test_no_python_on_the_node_is_a_refusal(ssh_hosts: TestHosts) -> None:
    """A node without the interpreter needs a person: NodeRefused (python), not a retryable failure."""
    from hsched.errors import NodeRefused, Refusal

    async def main() -> NodeRefused:
        ex = ssh_hosts.executor(ssh_hosts[2], python="no-such-python3")
        try:
            with pytest.raises(NodeRefused) as err:
                await ex.probe()
            assert ex.last_error is err.value
            return err.value
        finally:
            await ex.close()

    refused = run(main())
    assert refused.reason is Refusal.PYTHON and not refused.retryable
    assert str(refused) == (f"{ssh_hosts[2].name}: no-such-python3 not found on the node; "
                            "hsched needs python3 >= 3.8 there")
