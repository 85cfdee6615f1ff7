"""The sample Grafana dashboard (examples/grafana/hsched.json, issue 16 item 7) asks only for what the
controller exports: every metric a query names, and every label a query selects on, is in a scrape of an
in-process controller with running and pending jobs behind it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from hsched.controller.health import simulate_telemetry
from hsched.controller.metrics import render, take_snapshot
from hsched.testing import Lab

DASHBOARD = Path(__file__).resolve().parents[2] / "examples" / "grafana" / "hsched.json"
METRIC = re.compile(r"\b(hsched_[a-zA-Z0-9_]+)\s*(\{[^}]*\})?")
LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")


def queries(node: Any) -> Iterator[str]:
    """Every PromQL text in the dashboard: panel targets' `expr`, template variables' `query`/`definition`."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                yield value
            elif key == "query" and isinstance(value, str) and "hsched_" in value:
                yield value
            else:
                yield from queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from queries(item)


def test_the_dashboard_is_well_formed() -> None:
    dash = json.loads(DASHBOARD.read_text())
    panels = dash["panels"]
    assert dash["uid"] and dash["title"] and panels
    assert len({p["id"] for p in panels}) == len(panels)
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] != "row":
            assert p["targets"] and all(t["expr"] for t in p["targets"]), p["title"]
            assert len({t["refId"] for t in p["targets"]}) == len(p["targets"]), p["title"]
    variables = {v["name"] for v in dash["templating"]["list"]}
    used = set(re.findall(r"\$\{?([a-zA-Z_]+)", json.dumps(panels))) - {"__rate_interval", "__all"}
    assert used <= variables


async def test_every_metric_and_label_the_dashboard_asks_for_is_exported(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        await lab.submit("train", gpus=2)
        await lab.submit("waits", gpus=1, hold=True)  # held: it stays pending
        await lab.round()
        # power and temperature readings, as the daemon's health loop makes them for simulated GPUs
        active = [j for j in await lab.ctl.db(lab.ctl.store.jobs) if j.state.is_active()]
        simulate_telemetry(lab.ctl, lab.ctl.owners(active), lab.clock.time())
        text = render(lab.ctl, await take_snapshot(lab.ctl)).decode()
    labels: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels.setdefault(s.name, set()).update(s.labels)
    asked = list(queries(json.loads(DASHBOARD.read_text())))
    assert asked
    named = set()
    for q in asked:
        for name, selector in METRIC.findall(q):
            named.add(name)
            assert name in labels, f"{name} (in {q!r}) is not exported; exported: {sorted(labels)}"
            for label in LABEL.findall(selector or ""):
                assert label in labels[name], f"{name} has no label {label!r} (in {q!r})"
    # the dashboard covers what the exporter has (a new metric gets a panel, or a reason here)
    families = {n.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum") for n in labels}
    shown = {n.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum") for n in named}
    missing = families - shown - {"hsched_round_duration_seconds_created", "hsched_preemptions_created",
                                "hsched_moves_created"}
    assert not missing, f"exported but on no panel of {DASHBOARD.name}: {sorted(missing)} (add a panel)"
