"""Network failures: a run survives its node being cut off, and status works again once it is back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from hsched.executors.base import LaunchRequest, StatusQuery

from hsched.errors import NodeUnreachable
from hsched.model import RunReport, RunStatus
from tests.e2e.ssh.conftest import run
from tests.e2e.ssh.hosts import TestHosts
from tests.executors.waits import wait_log

pytestmark = pytest.mark.slow  # real sshd hosts and processes


async def wait_exit_recorded(root: Path, name: str) -> None:
    """Until the wrapper on the host has recorded how the run `name` ended (its exit.json)."""
    while True:
        if await asyncio.to_thread(lambda: any(root.glob(f"runs/*/{name}/exit.json"))):
            return
        await asyncio.sleep(0.05)


def test_run_survives_a_cut_and_reports_after_reconnect(ssh_hosts: TestHosts, tmp_path: Path,
                                                       local_runs: Path) -> None:
    h = ssh_hosts[1]
    marker = tmp_path / "marker"
    go = tmp_path / "go"
    run_dir = str(local_runs / "survivor")
    # the job ends when told (the host shares this machine's disk): while its node is cut off
    script = (f'echo start >> "{marker}"; echo started; while [ ! -e "{go}" ]; do sleep 0.05; done; '
              f'echo end >> "{marker}"; echo ended; exit 7')

    async def main() -> tuple[float, RunReport, bytes]:
        ex = ssh_hosts.executor(h, command_timeout_s=2.0)
        try:
            handle = await ex.launch(LaunchRequest(run_dir=run_dir, command=("sh", "-c", script)))
            await wait_log(ex, run_dir, b"started")
            h.cut()
            t0 = time.monotonic()
            try:
                with pytest.raises(NodeUnreachable):
                    await ex.status([StatusQuery(run_dir, handle)])
                assert isinstance(ex.last_error, NodeUnreachable)
                failed_after = time.monotonic() - t0
                go.touch()
                await wait_exit_recorded(h.root, "survivor")  # the job has ended, its node still cut off
            finally:
                h.restore()
            while True:  # reconnects on its own once the backoff allows
                try:
                    [rep] = await ex.status([StatusQuery(run_dir, handle)])
                    break
                except NodeUnreachable:
                    await asyncio.sleep(0.2)
            return failed_after, rep, await ex.read_log(run_dir, 0)
        finally:
            await ex.close()

    failed_after, rep, log = run(main())
    assert failed_after < 10  # the command timeout (2 s), not TCP's minutes
    assert rep.status is RunStatus.EXITED and rep.exit_code == 7
    assert log == b"started\nended\n"
    assert marker.read_text() == "start\nend\n"  # ran once, not restarted


def test_watch_notices_a_silent_cut(ssh_hosts: TestHosts) -> None:
    h = ssh_hosts[2]

    async def main() -> tuple[int, float, str]:
        ex = ssh_hosts.executor(h)
        seen = 0
        t0 = 0.0
        try:
            with pytest.raises(NodeUnreachable) as err:
                async for _ in ex.watch(0.2, stale_after_s=1.5):
                    seen += 1
                    if seen == 2:
                        h.cut()
                        t0 = time.monotonic()
            assert ex.last_error is err.value
            return seen, time.monotonic() - t0, str(err.value)
        finally:
            h.restore()
            await ex.close()

    seen, took, msg = run(main())
    assert seen >= 2 and took < 10 and msg.startswith(h.name)  # staleness (1.5 s), not TCP's minutes


def test_a_connection_that_closed_unheard_is_replaced(ssh_hosts: TestHosts) -> None:
    """The connection closes in a way the executor never heard of (as when it closes while still being set up,
    found by the randomized fault history: a host rebooting during first contact): the next call opens a new
    one instead of failing for ever on the dead one."""
    async def main() -> tuple[dict, dict]:  # type: ignore[type-arg]
        ex = ssh_hosts.executor(ssh_hosts[0])
        try:
            first = await ex.probe()
            conn = ex._conn
            assert conn is not None
            ex._conn_id += 1  # its lost-callback now names a connection the executor does not hold: unheard
            conn.close()
            await conn.wait_closed()
            assert ex._conn is conn and conn.is_closed()
            return first, await ex.probe()
        finally:
            await ex.close()

    first, again = run(main())
    assert again["boot_id"] == first["boot_id"] and again["hostname"] == first["hostname"]
