"""Issue 32 through the real local executor and the real node helper it starts: a node whose PATH has the stub
amd-smi of tests/fixtures/amdbin is probed as an MI300X node, and a node with a discovery plugin gets the
plugin's output, both sharing one helper with a plain node whose probe is unchanged."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hsched.executors.local import LocalExecutor

from hsched.controller.fleet import read_plugin

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


async def test_the_real_helper_probes_amd_gpus_and_runs_a_discovery_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    # the helper inherits this environment: only the stub amd-smi, no nvidia-smi or NVML
    monkeypatch.setenv("PATH", os.pathsep.join([str(ROOT / "tests/fixtures/amdbin/mi300x"),
                                                os.path.dirname(sys.executable), "/usr/bin", "/bin"]))
    amd = LocalExecutor(node="mi300x")
    plugin = LocalExecutor(node="tt", discover=str(ROOT / "examples/discover/tenstorrent-n300"))
    try:
        reply = await amd.probe(gpu_timeout_s=30.0)
        gpus = reply["gpus"]
        assert gpus["source"] == "amd-smi" and len(gpus["devices"]) == 8
        assert gpus["topo_format"] == "amd-smi topology"
        reply = await plugin.probe(gpu_timeout_s=30.0)
        assert reply["gpus"]["source"] == "plugin"
        read_plugin(reply)
        assert [d["name"] for d in reply["gpus"]["devices"]] == ["tenstorrent-n300"] * 2
        assert reply["gpus"]["select_env"] == "TT_VISIBLE_DEVICES"
    finally:
        await amd.close()
        await plugin.close()
