"""`hsched topo parse` and `hsched place` as CONTRACT.md describes them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from captures import capture
from typer.testing import CliRunner

from hsched.cli import app

runner = CliRunner()


def _write(tmp_path, name: str):
    f = tmp_path / name
    f.write_text(capture(name))
    return f


def test_parse_json_contract(tmp_path):
    f = _write(tmp_path, "nvidia-smi-topo__a100-sxm-8gpu-nv12-2numa.txt")
    r = runner.invoke(app, ["topo", "parse", str(f), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert [d["name"] for d in data["devices"]] == [f"GPU{i}" for i in range(8)]
    assert data["devices"][4]["numa_node"] == 1 and data["devices"][4]["cpu_affinity"][0] == 24
    assert data["nics"] == [] and {lk["kind"] for lk in data["links"]} == {"NV12"}
    assert data["links"][0]["bandwidth_gbps"] == 300.0


def test_parse_readable_and_other_captures(tmp_path):
    f = _write(tmp_path, "nvidia-smi-topo__dgx1-v100-4nic-oldlegend.txt")
    r = runner.invoke(app, ["topo", "parse", str(f)])
    assert r.exit_code == 0 and "mlx5_3" in r.stdout and "hostbridge0" in r.stdout
    q = _write(tmp_path, "nvidia-smi-q__l40s-x1.txt")
    r = runner.invoke(app, ["topo", "parse", str(q), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["gpus"][0]["name"] == "NVIDIA L40S"


def test_bad_input_is_one_line_exit_2(tmp_path):
    r = runner.invoke(app, ["topo", "parse", "/nonexistent"])
    assert r.exit_code == 2 and r.output.strip() == "hsched: error: /nonexistent: no such file"
    bad = tmp_path / "cut.txt"
    bad.write_text("\tGPU0\tGPU1\nGPU0\t X \tNV2\nGPU1\tNV2\n")
    r = runner.invoke(app, ["topo", "parse", str(bad)])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    assert f"{bad}, line 3" in r.output and "Traceback" not in r.output


def test_place_json_and_text(tmp_path):
    f = _write(tmp_path, "nvidia-smi-topo__h100-sxm-8gpu-11nic-ansi.txt")
    r = runner.invoke(app, ["place", "--topology", str(f), "--gpus", "4", "--busy", "GPU1,GPU5", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["devices"] == ["GPU0", "GPU2", "GPU3", "GPU4"]  # 2 NUMA nodes needed; lowest indices
    assert set(data) >= {"devices", "score", "explanation"}
    assert "GPU1" not in data["devices"] and "GPU5" not in data["devices"]
    r = runner.invoke(app, ["place", "--topology", str(f), "--gpus", "2"])
    assert r.exit_code == 0 and "GPU0-1: all pairs NV18, NUMA 0" in r.stdout
    r = runner.invoke(app, ["place", "--topology", str(f), "--gpus", "9"])
    assert r.exit_code == 2 and "need 9 devices" in r.output
    r = runner.invoke(app, ["place", "--topology", str(f), "--gpus", "2", "--busy", "GPU42"])
    assert r.exit_code == 2 and "GPU42" in r.output
    r = runner.invoke(app, ["place", "--topology", str(tmp_path / "none.txt"), "--gpus", "1"])
    assert r.exit_code == 2 and "no such file" in r.output


def test_public_surface_is_pinned():
    import hsched.topo as topo

    assert sorted(topo.__all__) == sorted(
        [
            "DEFAULT_CATALOG",
            "AcceleratorModel",
            "Catalog",
            "Constraints",
            "GpuInfo",
            "HostNuma",
            "Inventory",
            "LinkClass",
            "NoPlacement",
            "PlacementResult",
            "TopoDevice",
            "TopoLink",
            "TopoNic",
            "Topology",
            "TopologyParseError",
            "build_graph",
            "estimate_bandwidth_gbps",
            "link_strength",
            "lookup_model",
            "parse_capture",
            "parse_topology",
            "place",
            "place_on_node",
            "read_capture",
            "read_topology_file",
            "synthetic_topology",
            "topology_from_nvml",
            "topology_of_node",
            "topology_to_links",
            "why_not_on_node",
        ]
    )


@pytest.mark.slow  # a fresh interpreter, to see what importing hsched.topo alone loads
def test_importing_the_topology_is_light():
    code = (
        "import sys, hsched.topo; bad = [m for m in ('networkx', 'asyncio', 'sqlite3', 'textual', 'pynvml') "
        "if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
