"""Per-service metrics in the controller's Prometheus scrape, fed from a real router's stats (issue 30)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from hsched.controller.metrics import ServiceReading, render, serve, take_snapshot, watch_services
from hsched.serve.router import Router
from hsched.testing import Lab
from tests.serve.replicas import Replica


def parsed(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


async def test_a_scrape_carries_each_services_requests_latency_replicas_and_attainment(tmp_path: Path) -> None:
    router = Router("chat", wait_ready_s=0.01, slo_s=5.0)
    await router.start()
    rep = await Replica("r0").start()
    rep.release.set()
    try:
        async with Lab.open(tmp_path) as lab, aiohttp.ClientSession() as session:
            # before any source: no service families' samples
            assert "hsched_service_requests_total" not in parsed(render(lab.ctl, None).decode())
            async with session.get(router.url + "/hold") as resp:
                assert resp.status == 503  # no replica yet: an error, counted
            router.add_ready("r0", rep.url)
            for _ in range(3):
                async with session.get(router.url + "/hold") as resp:
                    assert resp.status == 200
            watch_services(lab.ctl, lambda: [ServiceReading("chat", router.stats(), wanted=2)])
            m = parsed(render(lab.ctl, await take_snapshot(lab.ctl)).decode())
            chat = {"service": "chat"}
            assert ({**chat, "outcome": "answered"}, 3.0) in m["hsched_service_requests_total"]
            assert ({**chat, "outcome": "error"}, 1.0) in m["hsched_service_requests_total"]
            assert m["hsched_service_request_duration_seconds_count"] == [(chat, 3.0)]
            inf = [v for labels, v in m["hsched_service_request_duration_seconds_bucket"] if labels["le"] == "+Inf"]
            assert inf == [3.0]
            assert ({**chat, "state": "ready"}, 1.0) in m["hsched_service_replicas"]
            assert ({**chat, "state": "wanted"}, 2.0) in m["hsched_service_replicas"]
            assert m["hsched_service_slo_attainment_ratio"] == [(chat, 0.75)]  # the 503 is a miss
            assert m["hsched_service_slo_seconds"] == [(chat, 5.0)]
            assert m["hsched_service_requests_in_flight"] == [(chat, 0.0)]

            # and the endpoint, from its own thread, reads them on the controller's loop
            import asyncio

            srv = serve(lab.ctl, "127.0.0.1:0", asyncio.get_running_loop())
            try:
                port = srv.server.server_address[1]

                def scrape() -> str:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                        return str(r.read().decode())

                text = await asyncio.to_thread(scrape)
                assert ({**chat, "state": "wanted"}, 2.0) in parsed(text)["hsched_service_replicas"]
            finally:
                await asyncio.to_thread(srv.close)
    finally:
        await rep.close()
        await router.close()


async def test_the_controllers_service_manager_feeds_the_scrape_without_registration(tmp_path: Path) -> None:
    from tests.controller.test_services import Script, make_manager, spec

    async with Lab.open(tmp_path) as lab:
        script = Script()
        m, _routers = make_manager(lab, script)  # the manager as the controller keeps it: ctl.state.services
        await m.start_service(spec(lo=2, hi=3), "alice", {"PATH": "/usr/bin"})
        got = parsed(render(lab.ctl, await take_snapshot(lab.ctl)).decode())
        assert ({"service": "llm", "state": "wanted"}, 2.0) in got["hsched_service_replicas"]
        assert got["hsched_service_slo_seconds"] == [({"service": "llm"}, 0.3)]
