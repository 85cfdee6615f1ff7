"""The Prometheus endpoint (issue 16): what a scrape carries, parsed with prometheus-client's own parser, and
the endpoint served from its own thread against a live in-process controller."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from hsched.controller.metrics import parse_address, recorder, render, serve, take_snapshot
from hsched.model import JobState
from hsched.testing import Lab


def parsed(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


async def test_a_scrape_carries_gpus_nodes_jobs_and_round_latency(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("train", gpus=2)
        await lab.submit("held", gpus=1, hold=True)  # pending
        await lab.round()
        assert (await lab.job(job.id)).state is JobState.RUNNING
        snap = await take_snapshot(lab.ctl)
        m = parsed(render(lab.ctl, snap).decode())
        totals = m["hsched_gpu_memory_total_bytes"]
        assert len(totals) == 8 and all(v > 0 for _, v in totals)
        held = [labels for labels, _ in totals if labels["job_id"] == str(job.id)]
        assert len(held) == 2 and {h["node"] for h in held} <= {"a", "b"}
        # issue 29: `job` is the label Prometheus keeps for its scrape job (a target's own becomes `exported_job`)
        assert all("job" not in labels for labels, _ in totals)
        assert {(h["user"], h["qos"]) for h in held} == {("alice", "normal")}
        assert ({"state": "RUNNING", "qos": "normal"}, 1.0) in m["hsched_jobs"]
        assert ({"state": "PENDING", "qos": "normal"}, 1.0) in m["hsched_jobs"]
        assert ({"node": "a", "state": "UP"}, 1.0) in m["hsched_node_state"]
        assert recorder(lab.ctl).rounds >= 1
        assert m["hsched_round_duration_seconds_count"][0][1] == recorder(lab.ctl).rounds
        assert "hsched_preemptions_total" in m


async def test_the_endpoint_serves_from_its_own_thread(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        await lab.submit("train", gpus=1)
        await lab.round()
        srv = serve(lab.ctl, "127.0.0.1:0", asyncio.get_running_loop())
        try:
            port = srv.server.server_address[1]

            def scrape() -> str:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                    return str(r.read().decode())

            # the scrape thread asks the event loop for a snapshot: the loop must be free to answer
            text = await asyncio.to_thread(scrape)
            assert ({"state": "RUNNING", "qos": "normal"}, 1.0) in parsed(text)["hsched_jobs"]

            def scrape_openmetrics() -> tuple[str, str]:
                ask = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                             headers={"Accept": "application/openmetrics-text; version=1.0.0"})
                with urllib.request.urlopen(ask, timeout=10) as r:
                    return r.headers["Content-Type"], str(r.read().decode())

            # OpenMetrics when the scraper asks for it (prometheus-client's own negotiation), the text format else
            kind, om = await asyncio.to_thread(scrape_openmetrics)
            assert kind.startswith("application/openmetrics-text") and om.rstrip().endswith("# EOF")
            assert "hsched_jobs{" in om
        finally:
            srv.close()


def test_addresses() -> None:
    assert parse_address("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_address(":9464") == ("127.0.0.1", 9464)
    assert parse_address("[::1]:9464") == ("::1", 9464)


async def test_the_metrics_op_is_one_scrape(tmp_path: Path) -> None:
    import os

    from hsched.controller.api import Api

    async with Lab.open(tmp_path) as lab:
        await lab.submit("train", gpus=1)
        await lab.round()
        text = (await Api(lab.ctl).handle("metrics", {}, os.getuid()))["text"]
        assert ({"state": "RUNNING", "qos": "normal"}, 1.0) in parsed(text)["hsched_jobs"]
