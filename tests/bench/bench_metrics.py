"""Does scraping the metrics endpoint slow the scheduling rounds? (issue 16)

A real controller on a simulated fleet (8 GPUs busy, 300 jobs pending, so every round has work), with
`metrics` on. For each of two phases of SECONDS seconds, the round latency is read from the controller's own
histogram (hsched_round_duration_seconds, sum and count over the phase): first without scraping, then while a
thread scrapes the endpoint RATE times a second. Printed: both means and their ratio (same run, same machine).

Run: python tests/bench/bench_metrics.py [--seconds 10] [--rate 100]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

FLEET = """
[[node]]
name = "box"
[node.simulate]
model = "NVIDIA A100-SXM4-80GB"
count = 8
"""


def hsched(env: dict[str, str], *args: str) -> str:
    return subprocess.run([sys.executable, "-m", "hsched", *args], env=env, capture_output=True, text=True,
                          check=True, timeout=600).stdout


def rounds(port: int) -> tuple[float, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    total = count = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "hsched_round_duration_seconds_sum":
                total = s.value
            elif s.name == "hsched_round_duration_seconds_count":
                count = s.value
    return total, count


def phase(port: int, seconds: float, rate: float) -> tuple[float, int, int]:
    """Mean round latency (s) over the phase, rounds in it, scrapes made."""
    stop = threading.Event()
    scrapes = [0]

    def scraper() -> None:
        # a scraper fetches; it does not parse here (parsing would be this process's CPU, not the controller's)
        period = 1.0 / rate
        while not stop.is_set():
            t0 = time.monotonic()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
                r.read()
            scrapes[0] += 1
            time.sleep(max(0.0, period - (time.monotonic() - t0)))

    s0, c0 = rounds(port)
    threads = [threading.Thread(target=scraper) for _ in range(1 if rate else 0)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    s1, c1 = rounds(port)
    n = int(c1 - c0)
    return ((s1 - s0) / n if n else float("nan")), n, scrapes[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=100.0)
    opts = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        home.mkdir(mode=0o700)
        (home / "settings.toml").write_text(f'metrics = "127.0.0.1:{port}"\npoll_interval_s = 0.05\n')
        (Path(tmp) / "fleet.toml").write_text(FLEET)
        env = dict(os.environ, HSCHED_HOME=str(home), HSCHED_FLEET=str(Path(tmp) / "fleet.toml"))
        hsched(env, "submit", "--gpus", "8", "--", "sleep", "3600")
        for _ in range(300):
            hsched(env, "submit", "--parsable", "--gpus", "1", "--", "true")
        try:
            idle, n_idle, _ = phase(port, opts.seconds, 0)
            busy, n_busy, scrapes = phase(port, opts.seconds, opts.rate)
            print(json.dumps({"round_mean_ms_without_scrapes": round(idle * 1000, 3), "rounds_without": n_idle,
                              "round_mean_ms_while_scraped": round(busy * 1000, 3), "rounds_while": n_busy,
                              "scrapes": scrapes, "scrapes_per_s": round(scrapes / opts.seconds, 1),
                              "ratio": round(busy / idle, 3)}))
        finally:
            ids = [str(j["id"]) for j in json.loads(hsched(env, "queue", "--json"))]
            if ids:
                hsched(env, "cancel", *ids)
            hsched(env, "daemon", "stop")


if __name__ == "__main__":
    main()
