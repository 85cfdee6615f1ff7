"""The Prometheus endpoint of a real controller (issue 16): settings `metrics`, parsed with prometheus-client's
text parser, served while jobs run; `hsched metrics` prints the same families once."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Hs, wait_until

FLEET = """
[[node]]
name = "box"
[node.simulate]
model = "NVIDIA L4"
count = 2
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def test_the_endpoint_serves_gpus_jobs_and_rounds(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "settings.toml").write_text(f'metrics = "127.0.0.1:{port}"\npoll_interval_s = 0.2\n')
    (tmp_path / "fleet.toml").write_text(FLEET)
    hs = Hs(tmp_path / "home", fleet=tmp_path / "fleet.toml")
    try:
        jid = hs.run("submit", "--parsable", "--gpus", "1", "--", "sleep", "300", check=True).stdout.strip()

        def scrape() -> dict[str, list[tuple[dict[str, str], float]]] | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                    m = families(r.read().decode())
            except OSError:
                return None
            return m if ({"state": "RUNNING", "qos": "normal"}, 1.0) in m.get("hsched_jobs", []) else None

        m = wait_until(scrape, "the running job in a scrape")
        held = [labels for labels, _ in m["hsched_gpu_utilization_ratio"] if labels["job_id"] == jid]
        assert len(held) == 1 and held[0]["model"] == "NVIDIA L4"
        assert all(0 < v <= 72 for _, v in m["hsched_gpu_power_watts"])  # an L4's board power
        assert m["hsched_round_duration_seconds_count"][0][1] > 0
        once = families(hs.run("metrics", check=True).stdout)
        assert set(once) >= {"hsched_jobs", "hsched_gpu_memory_total_bytes", "hsched_node_state"}
    finally:
        hs.stop()
