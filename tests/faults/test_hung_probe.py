"""A hung `nvidia-smi` on one node (a stub that never answers and ignores SIGTERM, first on that host's PATH):
`hsched queue` stays fast from the first second after start, the node is UNHEALTHY within its probe timeout, the
other node works, and no hung probe is left alive after the controller stops."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator

import pytest

from hsched.controller import health
from hsched.errors import ControllerError
from tests.faults.cluster import TERMINAL, Cluster, FaultHosts, boot_override_available, wait_for
from tests.faults.conftest import need_sshd
from tests.procs import processes

pytestmark = pytest.mark.slow  # sshd hosts, a controller, hung processes

PROBE_TIMEOUT_S = 4.0
HUNG = "987654"
"""The stub's sleep: how its processes are told apart."""
STUB = f"""#!/bin/sh
# a hung nvidia-smi: never answers, ignores the polite signals (its sleep inherits that)
trap '' TERM INT HUP
sleep {HUNG}
"""


@pytest.fixture(scope="module")
def hung(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FaultHosts, Cluster]]:
    need_sshd()
    if not boot_override_available():
        pytest.skip("a PATH of its own for one host needs root (its sshd runs in a mount namespace of its own)")
    base = tmp_path_factory.mktemp("hungprobe")
    stub = base / "stub"
    stub.mkdir()
    (stub / "nvidia-smi").write_text(STUB)
    (stub / "nvidia-smi").chmod(0o755)
    with FaultHosts(base / "hosts", 2, setenv={1: f"PATH={stub}:/usr/local/bin:/usr/bin:/bin"}) as hosts:
        fleet = (f'[[node]]\nname = "{hosts[0].name}"\nexecutor = "ssh"\nhost = "{hosts[0].name}"\n'
                 '[node.simulate]\nmodel = "NVIDIA A100-SXM4-80GB"\ncount = 2\n\n'
                 f'[[node]]\nname = "{hosts[1].name}"\nexecutor = "ssh"\nhost = "{hosts[1].name}"\n')  # real GPUs
        lab = Cluster(base / "lab", hosts=hosts, fleet_text=fleet, settings={"probe_timeout_s": PROBE_TIMEOUT_S})
        try:
            yield hosts, lab
        finally:
            lab.close()
            for pid in stubs(hosts):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def stubs(hosts: FaultHosts) -> list[int]:
    """Processes of the hung stub (its shell and its sleep), wherever they are."""
    return [p.pid for p in processes() if any(HUNG.encode() in a or a.endswith(b"stub/nvidia-smi") for a in p.argv)
            and p.state != "Z"]


def helpers_on(hosts: FaultHosts, i: int) -> list[int]:
    on = set(hosts.pids(hosts[i]))
    return [p.pid for p in processes() if p.pid in on and any(b"nodehelper" in a or b"helper-" in a for a in p.argv)]


def test_a_hung_probe_never_holds_up_the_controller(hung: tuple[FaultHosts, Cluster]) -> None:
    hosts, lab = hung
    t0 = time.time()
    lab.spawn()
    wait_for(lambda: lab.pid() is not None, "the controller to take its lock", every_s=0.01)

    def listening() -> bool:
        try:
            lab.call("ping")
            return True
        except ControllerError:
            return False

    wait_for(listening, "the controller to listen", every_s=0.01)
    listens_after = time.time() - t0
    wait_for(lambda: time.time() >= t0 + 1.0, "the first second after start")
    took = []
    for _ in range(100):  # `hsched queue`'s request, from the first second after start
        t = time.perf_counter()
        lab.call("queue")
        took.append((time.perf_counter() - t) * 1000)
    p99 = sorted(took)[98]
    real = hosts[1].name
    node = lab.wait_node(real, "UNHEALTHY")
    unhealthy_after = time.time() - t0
    cli = time.perf_counter()
    assert lab.hs.run("queue").returncode == 0
    cli_ms = (time.perf_counter() - cli) * 1000
    # the node's probe timeout: settings.probe_timeout_s where the settings have it, else the controller's own
    timeout = PROBE_TIMEOUT_S if "probe_timeout_s" in lab.settings else health.PROBE_TIMEOUT_S
    print(f"listening {listens_after:.2f} s after start; queue p99 {p99:.1f} ms (max {max(took):.1f}) from 1 s "
          f"after start; {real} UNHEALTHY after {unhealthy_after:.1f} s, probe timeout {timeout:g} s "
          f"({node['message']}); `hsched queue` (a whole CLI process) {cli_ms:.0f} ms; "
          f"hung stubs alive: {len(stubs(hosts))}")
    assert p99 < 200, sorted(took)[-5:]
    assert unhealthy_after <= timeout + 3.0, (unhealthy_after, timeout)
    # the other node works meanwhile
    jid = lab.submit(["true"], gpus=1)
    job = lab.wait_state(jid, *TERMINAL)
    assert job["state"] == "COMPLETED" and lab.read().runs_of(jid)[0]["node"] == hosts[0].name
    lab.check()
    # `hsched daemon stop`: afterwards no hung probe is alive (once the helpers that ran them are gone)
    lab.call("stop")
    wait_for(lambda: lab.pid() is None, "the controller to stop")
    wait_for(lambda: not helpers_on(hosts, 1), "the node helpers on the hung host to go")
    assert not stubs(hosts), f"hung probes alive after daemon stop: {stubs(hosts)}"
