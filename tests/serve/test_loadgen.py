"""The load generator (tests/bench/loadgen.py): the trace's slices, scaling, and a 30-request replay through a real
router to a stand-in replica over loopback, with a 503 retried after Retry-After."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hsched.examples.serve.standin import Standin, serve

from hsched.sched.servicetime import ServiceModel
from hsched.serve.router import Router
from tests.bench.loadgen import load, main, replay, trace_path
from tests.serve.replicas import until

FAST = ServiceModel(prefill_s=0.000002, decode_s=0.0001, max_batch=8, batch_alpha=0.1)  # ~20 ms a request


def test_slices_scale_and_speedup() -> None:
    full = load(trace_path("conv"), speedup=1.0)
    assert len(full) == 19366 and full[0].at_s == 0.0
    assert full == sorted(full, key=lambda a: a.at_s)
    assert (full[0].context_tokens, full[0].generated_tokens) == (374, 44)
    fast = load(trace_path("conv"), speedup=10.0)
    assert fast[-1].at_s == pytest.approx(full[-1].at_s / 10)
    minute = load(trace_path("conv"), speedup=1.0, start_s=600, duration_s=60)
    assert 37 <= len(minute) <= 507 and all(a.at_s < 60 for a in minute)
    assert len(load(trace_path("conv"), speedup=1.0, scale=0.5)) == 19366 // 2
    doubled = load(trace_path("code"), speedup=1.0, scale=2.0, duration_s=60)
    assert len(doubled) == 2 * len(load(trace_path("code"), speedup=1.0, duration_s=60))


def test_a_bad_trace_is_one_line_naming_the_file_and_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "t.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,12,x\n")
    assert main(["http://127.0.0.1:1", "--trace", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2:" in err and "Traceback" not in err
    assert main(["http://127.0.0.1:1", "--trace", str(tmp_path / "none.csv")]) == 2


async def test_a_30_request_slice_through_the_router_with_a_503_retried() -> None:
    arrivals = load(trace_path("conv"), speedup=10.0)[:30]
    router = Router("svc", wait_ready_s=0.0, retry_after_s=1)
    await router.start()
    ports: asyncio.Queue[int] = asyncio.Queue()
    server = asyncio.create_task(serve("127.0.0.1", 0, Standin(FAST, speed=1.0), ports.put_nowait))
    port = await ports.get()
    try:
        run = asyncio.create_task(replay(router.url, arrivals, slo_s=10.0))
        await until(lambda: router.stats().unavailable >= 1, "a request met no ready replica")
        router.add_ready("r0", f"http://127.0.0.1:{port}")  # a replica comes up: the 503'd requests retry
        report = await run
        assert report.requests == 30 and report.answered == 30 and report.failed == 0
        assert report.retried >= 1 and report.retries >= report.retried
        assert report.attainment == 1.0
        assert report.p50_s is not None and report.p99_s is not None and report.max_s is not None
        assert 0 < report.p50_s <= report.p99_s <= report.max_s
        assert sum(m.requests for m in report.timeline) == 30
        st = router.stats()
        assert st.requests - st.errors == 30 and st.unavailable == report.retries
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
        await router.close()
