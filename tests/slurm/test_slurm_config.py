"""The fleet file's slurm node group: its keys, the one-line problems, and the executor it makes. Pure: no
process (constructing a SlurmExecutor runs nothing), the fast lane."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from hsched.executors.slurm import SlurmExecutor

from hsched.config import fleet_from_table
from hsched.controller.fleet import build_fleet, make_executor
from hsched.errors import ConfigError

GROUP = """
[[node]]
name = "cluster-a100"
executor = "slurm"
partition = "gpu"
account = "lab-ml"
qos = "normal"
cluster = "dept"
labels = ["nvme"]
shared_paths = ["/home"]
"""


def fleet(text: str):  # type: ignore[no-untyped-def]
    return fleet_from_table(tomllib.loads(text), "fleet.toml", Path("/"))


def test_a_slurm_group_entry() -> None:
    [nc] = fleet(GROUP).nodes
    assert (nc.executor, nc.partition, nc.account, nc.slurm_qos, nc.cluster) == ("slurm", "gpu", "lab-ml", "normal",
                                                                                  "dept")
    assert nc.labels == ("nvme",) and nc.shared_paths == ("/home",) and nc.host is None
    ex = make_executor(nc)
    assert isinstance(ex, SlurmExecutor)
    assert (ex.kind, ex.name, ex.partition, ex.account, ex.qos, ex.cluster) == ("slurm", "cluster-a100", "gpu",
                                                                               "lab-ml", "normal", "dept")
    rt = build_fleet(fleet(GROUP))["cluster-a100"]
    assert rt.node.executor == "slurm" and rt.executor.kind == "slurm"
    [minimal] = fleet('[[node]]\nname = "c"\nexecutor = "slurm"\npartition = "debug"\n').nodes
    assert (minimal.account, minimal.slurm_qos, minimal.cluster) == (None, None, None)


@pytest.mark.parametrize(("text", "problem"), [
    ('[[node]]\nname = "c"\nexecutor = "slurm"\n', 'node[0] (c).partition: missing: a slurm node needs partition'),
    ('[[node]]\nname = "c"\nexecutor = "slurm"\npartition = ""\n', "node[0] (c).partition"),
    ('[[node]]\nname = "c"\nexecutor = "slurm"\npartition = 3\n', "node[0] (c).partition"),
    ('[[node]]\nname = "c"\nexecutor = "ssh"\nhost = "h"\npartition = "gpu"\n',
     'node[0] (c).partition: only for executor = "slurm"'),
    ('[[node]]\nname = "c"\nqos = "normal"\n', 'node[0] (c).qos: only for executor = "slurm"'),
    ('[[node]]\nname = "c"\nexecutor = "slurm"\npartition = "gpu"\nhost = "login1"\n',
     "node[0] (c).host: not for a slurm node"),
    ('[[node]]\nname = "c"\nexecutor = "slurm"\npartition = "gpu"\n[node.simulate]\nmodel = "a100"\n',
     "node[0] (c).simulate: not for a slurm node"),
])
def test_problems_name_the_key(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as e:
        fleet(text)
    assert any(problem in p for p in e.value.problems), e.value.problems
