"""The fleet file's [[dataset]] tables, a node's data_dir/data_quota, the data settings and a job's `data`: what each
reads, and one clear line naming the key for what it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from hsched.config import fleet_from_table, job_spec_from_table, load_settings
from hsched.datasets import Dataset, env_name, parse_bytes, show_bytes
from hsched.errors import ConfigError, UserError
from hsched.serialize import spec_from_dict, spec_to_dict

NODES = [{"name": "ws1"}, {"name": "ws2", "data_dir": "/scratch/hsched", "data_quota": "500G"}]


def fleet(datasets: list[dict[str, object]]) -> object:
    return fleet_from_table({"node": NODES, "dataset": datasets}, "fleet.toml", Path("."))


def test_a_dataset_reads_every_key() -> None:
    f = fleet([{"name": "imagenet", "path": "/data/imagenet", "nodes": ["ws1"], "size": "140G", "source": "ws1",
                "paths": {"ws2": "/scratch/imagenet"}},
               {"name": "laion", "path": "/mnt/nfs/laion", "shared": True}])
    imagenet, laion = f.datasets  # type: ignore[attr-defined]
    assert imagenet == Dataset(name="imagenet", path="/data/imagenet", nodes=("ws1",),
                               paths={"ws2": "/scratch/imagenet"}, size_bytes=140 * 2**30, source="ws1")
    assert imagenet.holders == ("ws1", "ws2")
    assert imagenet.declared_path("ws2") == "/scratch/imagenet" and imagenet.declared_path("ws3") is None
    assert laion.shared and laion.declared_path("anywhere") == "/mnt/nfs/laion"
    ws2 = f.nodes[1]  # type: ignore[attr-defined]
    assert ws2.data_dir == "/scratch/hsched" and ws2.data_quota_bytes == 500 * 2**30


@pytest.mark.parametrize(("table", "line"), [
    ({"name": "i", "nodes": ["ws9"], "path": "/d"}, "fleet.toml: dataset[0] (i).nodes: no node 'ws9' in the fleet "
                                                    "file (nodes: ws1, ws2)"),
    ({"name": "i", "path": "data/i", "nodes": ["ws1"]}, "dataset[0] (i).path: expected an absolute path"),
    ({"name": "i", "path": "/d", "size": "lots"}, "dataset[0] (i).size: expected a size such as 140G"),
    ({"name": "i", "shared": True}, "dataset[0] (i).path: missing: a shared dataset needs path"),
    ({"name": "i"}, "dataset[0] (i).path: missing: give path"),
    ({"name": "i", "path": "/d", "colour": 1}, "dataset[0].colour: unknown key; a dataset takes name, nodes, path"),
    ({"name": "a b", "path": "/d"}, "dataset[0].name: expected letters, digits"),
])
def test_a_bad_dataset_is_one_line_naming_its_key(table: dict[str, object], line: str) -> None:
    with pytest.raises(ConfigError) as e:
        fleet([table])
    assert line in str(e.value)


def test_duplicate_datasets_and_bad_node_keys_are_refused() -> None:
    with pytest.raises(ConfigError, match="duplicate dataset 'i'"):
        fleet([{"name": "i", "path": "/d", "nodes": ["ws1"]}, {"name": "i", "path": "/e", "nodes": ["ws1"]}])
    with pytest.raises(ConfigError, match=r"node\[0\] \(ws1\).data_dir: expected an absolute path"):
        fleet_from_table({"node": [{"name": "ws1", "data_dir": "scratch"}]}, "fleet.toml", Path("."))
    with pytest.raises(ConfigError, match=r"node\[0\] \(ws1\).data_quota: expected a size"):
        fleet_from_table({"node": [{"name": "ws1", "data_quota": "-"}]}, "fleet.toml", Path("."))


def test_sizes_read_as_people_write_them() -> None:
    assert parse_bytes("5G") == parse_bytes("5GiB") == 5 * 2**30
    assert parse_bytes("5GB") == 5 * 10**9
    assert parse_bytes(1234) == 1234 and parse_bytes("1.5k") == 1536
    assert show_bytes(5 * 2**30) == "5.0 GiB" and show_bytes(None) == "?"
    assert env_name("imagenet-1k.v2") == "HSCHED_DATA_IMAGENET_1K_V2"


def test_settings_for_data(tmp_path: Path) -> None:
    path = tmp_path / "settings.toml"
    path.write_text("data_link_mbps = 10000\nprefetch = false\nprefetch_horizon_s = 60\ndata_limit_mbps = 800\n")
    s = load_settings(path)
    assert (s.data_link_mbps, s.prefetch, s.prefetch_horizon_s, s.data_limit_mbps) == (10000.0, False, 60.0, 800.0)
    path.write_text("data_link_mbps = 0\n")
    with pytest.raises(ConfigError, match="data_link_mbps: expected Mbit/s > 0"):
        load_settings(path)
    path.write_text("prefetch = 1\n")
    with pytest.raises(ConfigError, match="prefetch: expected true or false"):
        load_settings(path)


def test_a_job_names_its_data_and_it_survives_the_store() -> None:
    spec = job_spec_from_table({"command": ["train"], "data": "imagenet, coco"}, "<command line>")
    assert spec.data == ("imagenet", "coco")
    assert spec_from_dict(spec_to_dict(spec)).data == ("imagenet", "coco")
    assert job_spec_from_table({"command": ["t"], "data": ["a", "a"]}, "x").data == ("a",)
    with pytest.raises(UserError, match="data: expected dataset names"):
        job_spec_from_table({"command": ["t"], "data": ["../etc"]}, "job.toml")
    with pytest.raises(UserError, match="data: expected a list of dataset names"):
        job_spec_from_table({"command": ["t"], "data": 3}, "job.toml")
