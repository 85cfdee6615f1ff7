"""The stand-in model server: answers after the service model's time (hsched.sched.servicetime), batches up to
max_batch and queues beyond, is ready after its load time; and runs as a replica would (a process on
$HSCHED_PORT)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import aiohttp
import pytest
from hsched.examples.serve.standin import Standin, serve

from hsched.sched.servicetime import ServiceModel, service_time_s, slowdown
from hsched.testing import FakeClock

MODEL = ServiceModel(prefill_s=0.0001, decode_s=0.002, max_batch=4, batch_alpha=0.25)


async def test_batching_and_the_fifo_queue_follow_the_model_exactly_on_a_fake_clock() -> None:
    clock = FakeClock()
    s = Standin(MODEL, speed=2.0, clock=clock.monotonic)
    t0 = clock.monotonic()
    futs = [s.submit(1000, 100)[0] for _ in range(6)]  # 4 in service, 2 queued
    alone = service_time_s(1000, 100, MODEL, speed=2.0)
    assert alone == pytest.approx((1000 * 0.0001 + 100 * 0.002) / 2)
    first_batch = alone * slowdown(MODEL, 4)  # 1.75x alone
    clock.advance(first_batch - 1e-6)
    s._tick()
    assert not any(f.done() for f in futs)
    clock.advance(2e-6)
    s._tick()
    assert [f.done() for f in futs] == [True] * 4 + [False] * 2
    assert futs[0].result() == pytest.approx(t0 + first_batch)
    # the two queued ones then run as a batch of two: 1.25x alone
    clock.advance(alone * slowdown(MODEL, 2))
    s._tick()
    assert all(f.done() for f in futs)
    assert futs[5].result() == pytest.approx(t0 + first_batch + alone * 1.25)
    assert s.served == 6
    if s.timer is not None:
        s.timer.cancel()


async def test_answers_over_http_no_sooner_than_the_model_and_health_after_load() -> None:
    ports: asyncio.Queue[int] = asyncio.Queue()
    s = Standin(MODEL, speed=1.0, load_s=0.3)
    server = asyncio.create_task(serve("127.0.0.1", 0, s, ports.put_nowait))
    port = await ports.get()
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/health") as resp:
                assert resp.status == 503  # still "loading"
            await asyncio.sleep(max(0.0, s.ready_at - s.clock()) + 0.01)  # the load time, on the stand-in's clock
            async with session.get(url + "/health") as resp:
                assert resp.status == 200
            async with session.post(url + "/generate", json={"context_tokens": 1}) as resp:
                assert resp.status == 400
            alone = service_time_s(2000, 50, MODEL)  # 0.3 s
            t = time.monotonic()
            async with session.post(url + "/generate", json={"context_tokens": 2000, "generated_tokens": 50}) as resp:
                got = await resp.json()
            took = time.monotonic() - t
            assert got["alone_s"] == pytest.approx(alone)
            # never early; late only by this machine's scheduling (a generous bound: the lower one is the model)
            assert alone - 0.005 <= got["latency_s"] <= took < alone + 1.0
            # five at once on max_batch 4: four finish together at 1.75x alone, the fifth waits for them
            t = time.monotonic()

            async def one() -> float:
                async with session.post(url + "/generate", json={"context_tokens": 2000, "generated_tokens": 50}) as r:
                    await r.json()
                    return time.monotonic() - t

            lat = sorted(await asyncio.gather(*(one() for _ in range(5))))
            assert all(x >= alone * 1.75 - 0.005 for x in lat[:4])
            assert lat[4] >= alone * (1.75 + 1.0) - 0.005
            assert lat[4] < alone * 2.75 + 1.5
    finally:
        server.cancel()
        with pytest.raises(asyncio.CancelledError):
            await server


@pytest.mark.slow
def test_runs_as_a_replica_on_hsched_port() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "HSCHED_PORT": str(port), "HSCHED_GPU_MODEL": "NVIDIA H100 80GB HBM3"}
    proc = subprocess.Popen([sys.executable, "-m", "hsched.examples.serve.standin"], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        hello = json.loads(proc.stdout.readline())
        assert hello["port"] == port and hello["speed"] > 1.0  # an H100 serves faster than the reference V100
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    bad = subprocess.run([sys.executable, "-m", "hsched.examples.serve.standin"], capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "HSCHED_PORT"}, timeout=60)
    assert bad.returncode == 2 and "HSCHED_PORT" in bad.stderr and "Traceback" not in bad.stderr
