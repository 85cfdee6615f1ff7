"""The service router over real sockets on loopback: where requests go, what streams, what drain and a missing or
refusing replica do, and what it measures (on a fake clock, exactly)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from hsched.serve.router import LATENCY_BUCKETS_S, Router, quantile
from hsched.testing import FakeClock
from tests.serve.replicas import Replica, loads, refused_url, until


def run(test: Callable[[], Awaitable[None]]) -> None:
    async def guarded() -> None:
        async with asyncio.timeout(60):  # a hang fails the test, it does not stall the lane
            await test()

    asyncio.run(guarded())


async def started(*names: str, **kw: object) -> tuple[Router, list[Replica], aiohttp.ClientSession]:
    router = Router("svc", **kw)  # type: ignore[arg-type]
    await router.start()
    reps = [await Replica(n).start() for n in names]
    for r in reps:
        router.add_ready(r.name, r.url)
    return router, reps, aiohttp.ClientSession()


async def closed(router: Router, reps: list[Replica], session: aiohttp.ClientSession) -> None:
    await session.close()
    for r in reps:
        await r.close()
    await router.close()


def test_least_outstanding_spreads_and_avoids_the_busy_replica() -> None:
    async def body() -> None:
        router, reps, session = await started("a", "b", "c")
        try:
            calls = [asyncio.create_task(session.get(router.url + "/hold")) for _ in range(6)]
            for r in reps:
                for _ in range(2):
                    await r.arrived.get()
            assert [len(r.seen) for r in reps] == [2, 2, 2]
            assert router.stats().outstanding == {"a": 2, "b": 2, "c": 2}
            reps[1].release.set()  # b's two answer; the next two go to b, which now has none outstanding
            await until(lambda: router.stats().outstanding["b"] == 0, "b's requests answered")
            reps[1].release.clear()
            more = [asyncio.create_task(session.get(router.url + "/hold")) for _ in range(2)]
            await reps[1].arrived.get()
            await reps[1].arrived.get()
            assert [len(r.seen) for r in reps] == [2, 4, 2]
            for r in reps:
                r.release.set()
            for resp in await asyncio.gather(*calls, *more):
                assert resp.status == 200
                resp.release()
            st = router.stats()
            assert st.requests == 8 and st.errors == 0 and st.in_flight == 0
            assert sum(r.requests for r in st.replicas) == 8
        finally:
            await closed(router, reps, session)

    run(body)


def test_ties_are_taken_in_turn() -> None:
    async def body() -> None:
        router, reps, session = await started("a", "b")
        try:
            for _ in range(6):  # one at a time: every pick is a tie at 0 outstanding
                async with session.get(router.url + "/echo") as resp:
                    assert resp.status == 200
            assert [len(r.seen) for r in reps] == [3, 3]
        finally:
            await closed(router, reps, session)

    run(body)


def test_request_and_response_pass_through_with_forwarded_headers() -> None:
    async def body() -> None:
        router, reps, session = await started("a")
        try:
            async with session.post(router.url + "/echo?x=1&y=%20", data=b'{"n": 3}',
                                    headers={"X-Custom": "kept", "Connection": "keep-alive, X-Hop",
                                             "X-Hop": "dropped", "X-Forwarded-For": "10.0.0.9"}) as resp:
                assert resp.status == 200
                assert resp.headers["X-Replica"] == "a"
                got = loads(await resp.text())
            assert got["method"] == "POST" and got["path"] == "/echo?x=1&y=%20" and got["body"] == '{"n": 3}'
            headers = got["headers"]
            assert isinstance(headers, dict)
            assert headers["X-Custom"] == "kept"
            assert "X-Hop" not in headers  # named by Connection: hop-by-hop
            assert headers["X-Forwarded-For"] == "10.0.0.9, 127.0.0.1"
            assert headers["X-Forwarded-Host"] == router.url.removeprefix("http://")
        finally:
            await closed(router, reps, session)

    run(body)


def test_a_streamed_response_reaches_the_client_before_it_ends() -> None:
    async def body() -> None:
        router, reps, session = await started("a")
        try:
            async with session.get(router.url + "/stream") as resp:
                assert resp.status == 200
                assert resp.headers.get("Transfer-Encoding") == "chunked"
                first = await resp.content.readexactly(len(b"first;"))
                assert first == b"first;"  # the replica has not sent its second chunk yet: it waits on step
                assert not reps[0].step.is_set()
                reps[0].step.set()
                assert await resp.content.read() == b"second"
        finally:
            await closed(router, reps, session)

    run(body)


def test_drain_waits_for_in_flight_requests_and_cuts_none() -> None:
    async def body() -> None:
        router, reps, session = await started("a", "b")
        a, b = reps
        try:
            held = [asyncio.create_task(session.get(router.url + "/hold")) for _ in range(4)]
            for _ in range(2):
                await a.arrived.get()
                await b.arrived.get()
            drain = asyncio.create_task(router.drain("a", timeout_s=30))
            await asyncio.sleep(0)
            assert not drain.done()
            # while a drains, new requests go to b only
            b.release.set()
            extra = [asyncio.create_task(session.get(router.url + "/echo")) for _ in range(3)]
            for resp in await asyncio.gather(*extra):
                assert (await resp.text()).find('"replica": "b"') >= 0
                resp.release()
            assert not drain.done() and router.stats().outstanding["a"] == 2
            a.release.set()
            assert await drain == 0
            for resp in await asyncio.gather(*held):
                assert resp.status == 200
                assert await resp.text() in ("a", "b")
                resp.release()
            router.remove("a")
            st = router.stats()
            assert st.errors == 0 and st.requests == 7 and [r.name for r in st.replicas] == ["b"]
        finally:
            await closed(router, reps, session)

    run(body)


def test_drain_times_out_and_says_how_many_remain() -> None:
    async def body() -> None:
        router, reps, session = await started("a")
        try:
            held = asyncio.create_task(session.get(router.url + "/hold"))
            await reps[0].arrived.get()
            assert await router.drain("a", timeout_s=0.05) == 1
            reps[0].release.set()
            (await held).release()
        finally:
            await closed(router, reps, session)

    run(body)


def test_no_ready_replica_answers_503_with_retry_after() -> None:
    async def body() -> None:
        router, reps, session = await started(wait_ready_s=0.05, retry_after_s=3)
        try:
            async with session.get(router.url + "/anything") as resp:
                assert resp.status == 503
                assert resp.headers["Retry-After"] == "3"
            st = router.stats()
            assert st.requests == 1 and st.errors == 1 and st.unavailable == 1 and st.ready == 0
        finally:
            await closed(router, reps, session)

    run(body)


def test_a_request_waits_for_a_replica_to_become_ready_then_is_forwarded() -> None:
    async def body() -> None:
        router, reps, session = await started(wait_ready_s=30)
        late = await Replica("late").start()
        try:
            call = asyncio.create_task(session.get(router.url + "/echo"))
            await until(lambda: router.stats().in_flight == 1, "the request reached the router")
            assert not call.done()
            router.add_ready("late", late.url)
            resp = await call
            assert resp.status == 200 and loads(await resp.text())["replica"] == "late"
            resp.release()
            assert router.stats().errors == 0
        finally:
            await late.close()
            await closed(router, reps, session)

    run(body)


def test_a_refusing_replica_is_marked_not_ready_and_the_request_retried_once_elsewhere() -> None:
    async def body() -> None:
        router, reps, session = await started("live")
        unready: list[str] = []
        router.on_unready = unready.append
        router.add_ready("dead", refused_url())
        try:
            for _ in range(4):  # the first two picks are a tie taken in turn: one of them is the dead replica
                async with session.post(router.url + "/echo", data=b"x") as resp:
                    assert resp.status == 200
                    assert loads(await resp.text())["body"] == "x"  # the body went again on the retry
            st = router.stats()
            assert st.errors == 0 and st.requests == 4
            assert {r.name: r.ready for r in st.replicas} == {"live": True, "dead": False}
            assert unready == ["dead"] and len(reps[0].seen) == 4
        finally:
            await closed(router, reps, session)

    run(body)


def test_no_second_retry_when_every_replica_refuses() -> None:
    async def body() -> None:
        router, reps, session = await started(wait_ready_s=0.05)
        router.add_ready("d1", refused_url())
        router.add_ready("d2", refused_url())
        try:
            async with session.get(router.url + "/x") as resp:
                assert resp.status == 502
            st = router.stats()
            assert st.ready == 0 and st.errors == 1
        finally:
            await closed(router, reps, session)

    run(body)


def test_sample_integrates_in_flight_requests_exactly_on_a_fake_clock() -> None:
    async def body() -> None:
        clock = FakeClock()
        router, reps, session = await started("a", clock=clock.monotonic)
        (a,) = reps
        try:
            router.sample()  # the interval starts now
            first = asyncio.create_task(session.get(router.url + "/hold"))
            await a.arrived.get()
            clock.advance(10)
            second = asyncio.create_task(session.get(router.url + "/hold"))
            await a.arrived.get()
            clock.advance(10)
            a.release.set()
            for resp in await asyncio.gather(first, second):
                resp.release()
            await until(lambda: router.stats().in_flight == 0, "both answered at the router")
            clock.advance(20)
            s = router.sample()
            # 1 in flight for 10 s, 2 for 10 s, none for 20 s: 30 request-seconds over 40 s
            assert s.dt == 40 and s.concurrency == pytest.approx(30 / 40, abs=1e-12)
            assert s.arrivals == 2 and s.ready == 1
            assert s.p99_s == 20  # the first took 20 s, the second 10 s
            a.release.clear()
            third = asyncio.create_task(session.get(router.url + "/hold"))
            await a.arrived.get()
            clock.advance(5)
            s2 = router.sample()
            assert (s2.dt, s2.concurrency, s2.arrivals, s2.p99_s) == (5, 1.0, 1, None)
            a.release.set()
            (await third).release()
            st = router.stats()
            assert st.requests == 3 and st.latency_sum_s == 30 + 5
        finally:
            await closed(router, reps, session)

    run(body)


def test_stats_histogram_quantiles_and_attainment() -> None:
    async def body() -> None:
        clock = FakeClock()
        router, reps, session = await started("a", clock=clock.monotonic, slo_s=0.3)
        (a,) = reps
        a.release.set()
        try:
            for _ in range(9):
                async with session.get(router.url + "/hold") as resp:
                    assert resp.status == 200
            for _ in range(9):
                a.arrived.get_nowait()
            a.release.clear()
            slow = asyncio.create_task(session.get(router.url + "/hold"))
            await a.arrived.get()
            clock.advance(2.0)
            a.release.set()
            (await slow).release()
            await until(lambda: router.stats().in_flight == 0, "answered")
            st = router.stats()
            assert st.requests == 10 and st.answered == 10
            assert st.buckets[0] == 9 and st.buckets[LATENCY_BUCKETS_S.index(2.0)] == 1
            assert st.attainment() == 0.9 and st.attainment(0.3) == 0.9 and st.attainment(5.0) == 1.0
            assert st.p50_s is not None and st.p50_s <= LATENCY_BUCKETS_S[0]
            assert st.p99_s is not None and 1.5 < st.p99_s <= 2.0
        finally:
            await closed(router, reps, session)

    run(body)


def test_quantile_reads_a_histogram_as_prometheus_does() -> None:
    buckets = [0] * (len(LATENCY_BUCKETS_S) + 1)
    assert quantile(buckets, 0.5) is None
    i = LATENCY_BUCKETS_S.index(0.2)
    buckets[i] = 10  # all ten between 0.15 and 0.2
    assert quantile(buckets, 0.5) == pytest.approx(0.175)
    buckets[-1] = 1
    assert quantile(buckets, 1.0) == LATENCY_BUCKETS_S[-1]


def test_max_ongoing_queues_at_the_router_first_come_first_served_and_a_new_replica_takes_the_queue() -> None:
    async def body() -> None:
        router, reps, session = await started("a", max_ongoing=1)
        (a,) = reps
        late = await Replica("late").start()
        try:
            first = asyncio.create_task(session.get(router.url + "/hold"))
            await a.arrived.get()
            queued = [asyncio.create_task(session.get(router.url + "/echo")) for _ in range(2)]
            await until(lambda: router.stats().in_flight == 3, "both queued at the router")
            assert a.arrived.empty() and router.stats().outstanding == {"a": 1}
            router.add_ready("late", late.url)  # a new replica takes the oldest queued request at once
            await late.arrived.get()
            second, third = await asyncio.gather(*queued)
            assert second.status == third.status == 200
            second.release()
            third.release()
            assert len(late.seen) == 2 and len(a.seen) == 1  # a held its one; late took both, one after the other
            a.release.set()
            (await first).release()
            assert router.stats().errors == 0
        finally:
            await late.close()
            await closed(router, reps, session)

    run(body)
