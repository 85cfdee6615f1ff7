"""Discovery plugins (issue 32): a node's `discover = "/path"` executable describes accelerators hsched has no tool
for. The schema's reading (fast), and through the controller (slow: the plugins are processes, run by the node
helper's own probe code): the example n300 plugin's devices are scheduled by type with its variable; a plugin
that prints no JSON, leaves out a field, or hangs leaves its node UNHEALTHY with one line, and the rest of the
fleet works on."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from hsched.config import FleetConfig, NodeConfig, load_fleet
from hsched.controller import commands
from hsched.controller.health import check_health, record_sample
from hsched.controller.loops import one_round
from hsched.errors import UserError
from hsched.model import JobSpec, JobState, NodeState, Resources
from hsched.node.probe import probe
from hsched.testing import FakeClock, FakeExecutor
from hsched.topo.plugin import PluginError, parse_plugin_output
from tests.controller.probed import probed_controller

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "discover" / "tenstorrent-n300"
GOOD = {"select_env": "TT_VISIBLE_DEVICES", "devices": [
    {"id": "t0", "index": 0, "type": "tenstorrent-n300", "memory_mib": 24576, "numa_node": 0},
    {"id": "t1", "index": 1, "type": "tenstorrent-n300", "memory_mib": 24576, "numa_node": 1}],
    "links": [{"a": "t0", "b": "t1", "kind": "eth", "bandwidth_gbps": 25}]}


def test_the_schema_is_read_and_each_mistake_is_one_line_naming_the_field() -> None:
    r = parse_plugin_output(json.dumps(GOOD))
    assert r.select_env == "TT_VISIBLE_DEVICES" and r.select_by == "index" and r.utilization == "none"
    assert [(d.id, d.index, d.type, d.memory_mib, d.numa_node) for d in r.devices] == [
        ("t0", 0, "tenstorrent-n300", 24576, 0), ("t1", 1, "tenstorrent-n300", 24576, 1)]
    assert [(lk.a, lk.b, lk.kind, lk.bandwidth_gbps) for lk in r.links] == [("t0", "t1", "ETH", 25.0)]
    no_memory = json.loads(json.dumps(GOOD))
    del no_memory["devices"][1]["memory_mib"]
    cases = {
        "card 0: ok\n": "printed no JSON",
        "": "printed nothing",
        "[1, 2]": "expected a JSON object, found list",
        json.dumps({"devices": []}): 'missing field "select_env"',
        json.dumps({"select_env": "PATH", "devices": []}): '"select_env" must name',
        json.dumps({"select_env": "X_DEVICES"}): 'missing field "devices"',
        json.dumps(no_memory): 'devices[1]: missing field "memory_mib"',
        json.dumps({**GOOD, "links": [{"a": "t0", "b": "t9", "kind": "ETH"}]}): "links[0]: a and b must be",
        json.dumps({**GOOD, "select_by": "uuid"}): '"select_by" must be "index" or "id"',
    }
    for text, want in cases.items():
        with pytest.raises(PluginError) as e:
            parse_plugin_output(text)
        assert want in str(e.value) and "\n" not in str(e.value), (text, str(e.value))


def test_the_fleet_file_takes_an_absolute_plugin_path_for_real_nodes_only(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[[node]]\nname = "tt1"\ndiscover = "/opt/lab/tenstorrent-n300"\n')
    assert load_fleet(fleet).nodes[0].discover == "/opt/lab/tenstorrent-n300"
    for bad, want in (('discover = "tt-plugin"', "node[0] (tt1).discover: expected the absolute path"),
                      ('discover = "/x"\nsimulate = {model = "A100", count = 1}', "only for a real node")):
        fleet.write_text(f'[[node]]\nname = "tt1"\n{bad}\n')
        with pytest.raises(UserError) as e:
            load_fleet(fleet)
        assert want in str(e.value)


class HelperProbed(FakeExecutor):
    """A node whose probe is the node helper's own (`hsched.node.probe.probe`, in a thread) with its
    discovery plugin; everything else faked."""

    def __init__(self, discover: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.discover = discover

    async def probe(self, *, gpu_timeout_s: float = 10.0) -> dict[str, Any]:
        reply = await super().probe(gpu_timeout_s=gpu_timeout_s)
        real = await asyncio.to_thread(probe, {"discover": self.discover, "gpu_timeout_s": 2.0})
        reply["gpus"] = real["gpus"]
        return reply


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


@pytest.mark.slow
async def test_plugin_devices_are_scheduled_by_type_and_bad_plugins_leave_only_their_node_unhealthy(
        tmp_path: Path) -> None:
    missing = json.loads(json.dumps(GOOD))
    del missing["devices"][0]["type"]
    plugins = {
        "tt": str(EXAMPLE),
        "notjson": script(tmp_path, "notjson", "echo 'n300 cards: 2'\n"),
        "missing": script(tmp_path, "missing", f"cat <<'J'\n{json.dumps(missing)}\nJ\n"),
        "hangs": script(tmp_path, "hangs", "exec sleep 600\n"),
    }
    cfg = FleetConfig(nodes=tuple(NodeConfig(name=n, executor="local", discover=p) for n, p in plugins.items()),
                      source="<test>")
    clock = FakeClock()
    executors = {n: HelperProbed(p, name=n, cpus=16, clock=clock.time, monotonic=clock.monotonic)
                 for n, p in plugins.items()}
    async with probed_controller(tmp_path, cfg, executors, clock) as ctl:
        for rt in ctl.nodes.values():
            record_sample(rt, {"seq": 0, "gpus": {"devices": []}, "processes": []}, clock.time(),
                          seen=clock.monotonic())
        await check_health(ctl)
        tt = ctl.nodes["tt"].node
        assert tt.state is NodeState.UP
        assert [(d.uuid, d.index, d.model, d.memory_total_mib, d.numa_node) for d in tt.devices] == [
            ("tt-n300-0", 0, "tenstorrent-n300", 24576, 0), ("tt-n300-1", 1, "tenstorrent-n300", 24576, 0)]
        assert [(lk.a, lk.b, lk.kind, lk.bandwidth_gbps) for lk in tt.links] == [
            ("tt-n300-0", "tt-n300-1", "ETH", 25.0)]
        messages = {n: ctl.nodes[n].node.message for n in ("notjson", "missing", "hangs")}
        assert all(ctl.nodes[n].node.state is NodeState.UNHEALTHY for n in messages)
        assert messages["notjson"].startswith(f"discovery plugin {plugins['notjson']}: printed no JSON")
        assert messages["missing"] == f'discovery plugin {plugins["missing"]}: devices[0]: missing field "type"'
        assert messages["hangs"].startswith(f"discovery plugin {plugins['hangs']} did not answer within 2 s")
        assert all("\n" not in m for m in messages.values())

        # the healthy plugin node is scheduled by its type, with its own variable
        job = await commands.submit(ctl, JobSpec(command=("true",), name="tt", resources=Resources(
            gpus=2, gpu_types=("n300",))), "alice", None)
        await one_round(ctl)
        while ctl._tasks:
            await asyncio.gather(*list(ctl._tasks), return_exceptions=True)
        assert (await ctl.get(job.id)).state is JobState.RUNNING
        [run] = list(executors["tt"].runs.values())
        assert run.request.env["TT_VISIBLE_DEVICES"] == "0,1" and "CUDA_VISIBLE_DEVICES" not in run.request.env
        assert not any(ex.runs for n, ex in executors.items() if n != "tt")


def example_output() -> str:
    """What the example plugin prints (its here-document), read without running it."""
    text = EXAMPLE.read_text()
    return text.split("<<'JSON'\n", 1)[1].split("\nJSON\n", 1)[0]


def test_the_example_plugins_devices_show_in_nodes_and_topo_show(capsys: pytest.CaptureFixture[str]) -> None:
    from hsched.cli.fleet import render_nodes
    from hsched.controller.fleet import NodeRuntime, node_from_probe, read_plugin
    from hsched.model import Node
    from hsched.serialize import node_from_dict, node_to_dict
    from hsched.topo.place import topology_of_node

    reply: dict[str, Any] = {"cpus": 16, "numa": [], "gpus": {"source": "plugin", "plugin": str(EXAMPLE),
                                                               "output": example_output(), "devices": []}}
    read_plugin(reply)
    nc = NodeConfig(name="tt1", executor="local", discover=str(EXAMPLE))
    rt = NodeRuntime(config=nc, executor=FakeExecutor(name="tt1"),
                     node=Node(name="tt1", executor="local", state=NodeState.UP))
    node = node_from_probe(rt, reply)
    raw = node_to_dict(node)
    render_nodes([raw])
    out = capsys.readouterr().out
    assert "tt1" in out and "tenstorrent-n300" in out
    topo = topology_of_node(node_from_dict(raw)).with_bandwidth().to_json()
    assert [(d["uuid"], d["model"], d["numa_node"]) for d in topo["devices"]] == [
        ("tt-n300-0", "tenstorrent-n300", 0), ("tt-n300-1", "tenstorrent-n300", 0)]
    assert [(lk["a"], lk["b"], lk["kind"]) for lk in topo["links"]] == [("GPU0", "GPU1", "ETH")]


def test_a_confined_helper_runs_plugins_only_from_the_admins_folder(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    """A service account's helper is root: a request naming any other executable (one it planted, or
    /sbin/reboot) is refused before anything runs."""
    from hsched.node import confine
    from hsched.node.plugin import run_plugin

    monkeypatch.setattr(confine, "CONFINE", str(tmp_path / "root"))
    for path in (str(EXAMPLE), "/sbin/reboot", "/etc/hsched/discover/../../../sbin/reboot"):
        reply = run_plugin(path, 1.0)
        assert reply["source"] is None and reply["devices"] == []
        assert "runs discovery plugins only from /etc/hsched/discover" in reply["error"]
    reply = run_plugin("/etc/hsched/discover/n300", 1.0)  # not there on this machine
    assert reply["source"] is None and reply["error"].startswith("discovery plugin /etc/hsched/discover/n300: /etc")


async def test_the_example_plugins_devices_show_on_the_dashboard() -> None:
    # issue 32: a plugin-declared type shows in the dashboard's fleet view as GPUs do (the node as the controller's
    # snapshot carries it: node_to_dict of the node the plugin's output made)
    from hsched.tui.app import DashApp
    from hsched.tui.model import parse_snapshot

    from hsched.controller.fleet import NodeRuntime, node_from_probe, read_plugin
    from hsched.model import Node
    from hsched.serialize import node_to_dict
    from tests.tui.canned import EVENTS, NOW, snapshot

    reply: dict[str, Any] = {"cpus": 16, "numa": [], "gpus": {"source": "plugin", "plugin": str(EXAMPLE),
                                                               "output": example_output(), "devices": []}}
    read_plugin(reply)
    rt = NodeRuntime(config=NodeConfig(name="tt1", executor="local", discover=str(EXAMPLE)),
                     executor=FakeExecutor(name="tt1"), node=Node(name="tt1", executor="local", state=NodeState.UP))
    snap = snapshot()
    snap["nodes"] = [*snap["nodes"], node_to_dict(node_from_probe(rt, reply))]
    app = DashApp(None, frame=parse_snapshot(snap, EVENTS, True), clock=lambda: NOW, view="fleet", user="alice")
    async with app.run_test(size=(140, 50)):
        rows = {k: " ".join(str(getattr(c, "plain", c)) for c in (app.fleet.sync.cells(k) or ()))
                for k in app.fleet.sync.keys()}
        mine = [text for key, text in rows.items() if key.startswith("tt-n300-")]
        # (the model column is as wide as for any GPU: a long type name is cut, as "A100-PCIE-40GB" would be)
        assert len(mine) == 2 and all("tenstorrent-n3" in t for t in mine), rows
        assert mine[0].startswith("tt1 up 0 ") and mine[1].split()[0] == "1"
