"""The fake executor's controls for containment and probe tests (issue 12): what the controller's tests play."""

from __future__ import annotations

import asyncio

import pytest
from hsched.executors.base import LaunchRequest, StatusQuery
from hsched.executors.fake import FakeExecutor, FakeSignal

from hsched.model import GpuHolder, RunStatus


async def test_finish_carries_the_exit_record() -> None:
    ex = FakeExecutor()
    h = await ex.launch(LaunchRequest(run_dir="/runs/a", command=("train",), memory_mib=64, devices=("GPU-0",)))
    holders = [GpuHolder("GPU-0", 4242, "python3")]
    ex.finish(h.run_dir, 137, end_time=1234.5, oom=True, gpu_left=holders)
    [rep] = await ex.status([StatusQuery(h.run_dir, h)])
    assert (rep.status, rep.exit_code, rep.signal) == (RunStatus.EXITED, 137, 9)
    assert (rep.end_time, rep.oom, rep.gpu_left) == (1234.5, True, tuple(holders))
    assert ex.runs[h.run_dir].request.memory_mib == 64  # the launch request as the controller sent it


async def test_a_lost_run_is_reported_lost_and_takes_no_signal() -> None:
    ex = FakeExecutor()
    h = await ex.launch(LaunchRequest(run_dir="/runs/a", command=("train",)))
    ex.lose(h.run_dir)
    [rep] = await ex.status([StatusQuery(h.run_dir, h)])
    assert rep.status is RunStatus.LOST and rep.exit_code is None
    assert await ex.signal(h, "KILL", all_processes=True) is False
    assert ex.running() == []


async def test_every_signal_call_is_recorded_with_how_it_was_sent() -> None:
    ex = FakeExecutor()
    h = await ex.launch(LaunchRequest(run_dir="/runs/a", command=("train",)))
    assert await ex.signal(h, "USR1", batch_only=True)
    assert await ex.signal(h, "SIGTERM", all_processes=True)
    run = ex.runs[h.run_dir]
    assert run.signal_calls == [FakeSignal("USR1", batch_only=True), FakeSignal("TERM", all_processes=True)]
    assert (run.signals, run.signalled_batch, run.signalled_all) == (["USR1", "TERM"], ["USR1"], ["TERM"])


async def test_a_probe_can_hang_until_cancelled_or_report_a_gpu_timeout() -> None:
    ex = FakeExecutor(devices=[{"uuid": "GPU-0"}])
    ex.probe_hangs = True
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await ex.probe(gpu_timeout_s=3.0)
    ex.probe_hangs = False
    ex.probe_gpu_error = "GPU probe did not answer within 3 s (nvidia-smi pid 7 killed)"
    p = await ex.probe()
    assert p["gpus"] == {"source": None, "devices": [], "error": ex.probe_gpu_error}
    ex.probe_gpu_error = None
    assert (await ex.probe())["gpus"]["devices"] == [{"uuid": "GPU-0"}]
    assert ex.probe_timeouts == [3.0, 10.0, 10.0]
