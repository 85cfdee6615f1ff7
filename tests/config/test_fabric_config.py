"""Issue 32: the fleet file's switch layout (`[[switch]]` tables or Slurm's topology.conf) and a simulated node's
NICs; each mistake one clear line naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from hsched.config import load_fleet
from hsched.errors import ConfigError
from hsched.model import Nic, NicKind
from hsched.topo.fabric import Switch, expand_hostlist

NODES = "".join(f'[[node]]\nname = "n{i}"\n' for i in range(1, 5))


def problems(p: Path) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_fleet(p)
    return list(e.value.problems)


def test_switch_tables_and_nics(tmp_path: Path) -> None:
    p = tmp_path / "fleet.toml"
    p.write_text(
        '[[node]]\nname = "n1"\n[node.simulate]\nmodel = "NVIDIA H100 80GB HBM3"\ncount = 4\n'
        'nics = [{name = "mlx5_0", kind = "ib", rate_gbps = 400, netdev = "ib0", near = [0, 1]},\n'
        '        {name = "eth0", kind = "ethernet", rate_gbps = 25, active = false}]\n'
        + "".join(f'[[node]]\nname = "n{i}"\n' for i in range(2, 5))
        + '[[switch]]\nname = "leaf1"\nnodes = ["n1", "n2"]\nrate_gbps = 800\n'
          '[[switch]]\nname = "leaf2"\nnodes = ["n3", "n4"]\n'
          '[[switch]]\nname = "spine"\nswitches = ["leaf1", "leaf2"]\n')
    fleet = load_fleet(p)
    assert fleet.fabric.switches == (Switch("leaf1", ("n1", "n2"), (), 800.0), Switch("leaf2", ("n3", "n4")),
                                     Switch("spine", (), ("leaf1", "leaf2")))
    assert fleet.fabric.path_up("n3") == ["leaf2", "spine"]
    sim = fleet.nodes[0].simulate
    assert sim is not None and sim.nics == (
        Nic("mlx5_0", NicKind.IB, 400.0, True, "ib0", (0, 1)), Nic("eth0", NicKind.ETHERNET, 25.0, False))


def test_slurm_topology_conf(tmp_path: Path) -> None:
    (tmp_path / "topology.conf").write_text(
        "# Slurm's tree form\nSwitchName=s1 Nodes=n[1-2]\nSwitchName=s2 Nodes=n[3-4] LinkSpeed=200\n"
        "SwitchName=top Switches=s[1-2]\n")
    p = tmp_path / "fleet.toml"
    p.write_text('topology = "topology.conf"\n' + NODES)  # (a top-level key: before the tables)
    fleet = load_fleet(p)
    assert [(s.name, s.nodes, s.switches, s.rate_gbps) for s in fleet.fabric.switches] == [
        ("s1", ("n1", "n2"), (), None), ("s2", ("n3", "n4"), (), 200.0), ("top", (), ("s1", "s2"), None)]


def test_hostlists() -> None:
    assert expand_hostlist("gpu[01-03,7],login") == ["gpu01", "gpu02", "gpu03", "gpu7", "login"]
    with pytest.raises(ValueError):
        expand_hostlist("n[1-")


@pytest.mark.parametrize(("text", "want"), [
    ('[[switch]]\nname = "l1"\nnodes = ["n1", "n9"]\n',
     "switch 'l1' names node 'n9', which is not a [[node]] of this fleet"),
    ('[[switch]]\nname = "l1"\nnodes = ["n1"]\n[[switch]]\nname = "l2"\nnodes = ["n1"]\n',
     "'n1' is under both 'l1' and 'l2'; each has one parent switch"),
    ('[[switch]]\nname = "l1"\nnodes = ["n1"]\nrate_gbps = -5\n', "switch[0].rate_gbps: expected a positive number"),
    ('[[switch]]\nname = "l1"\n', "switch[0]: a switch needs nodes = [...] (a leaf) or switches = [...]"),
    ('[[switch]]\nname = "top"\nswitches = ["nowhere"]\n', "switch 'top' names unknown switch 'nowhere'"),
    ('[[switch]]\nname = "l1"\nnodes = ["n1"]\nrate = 5\n', "switch[0].rate: unknown key"),
    ('topology = "missing.conf"\n', "topology: cannot read"),
])
def test_switch_layout_mistakes(tmp_path: Path, text: str, want: str) -> None:
    p = tmp_path / "fleet.toml"
    p.write_text(text + NODES if text.startswith("topology") else NODES + text)
    got = problems(p)
    assert any(want in line for line in got), got
    assert all("\n" not in line for line in got)


def test_topology_conf_mistakes_name_the_line(tmp_path: Path) -> None:
    (tmp_path / "topology.conf").write_text("SwitchName=s1 Nodes=n[1-2]\nSwitchName=s2 Nodez=n3\n")
    p = tmp_path / "fleet.toml"
    p.write_text('topology = "topology.conf"\n' + NODES)  # (a top-level key: before the tables)
    got = problems(p)
    assert len(got) == 1 and "topology.conf: line 2: unknown key(s) nodez" in got[0], got


def test_nic_mistakes(tmp_path: Path) -> None:
    p = tmp_path / "fleet.toml"
    p.write_text('[[node]]\nname = "n1"\n[node.simulate]\nmodel = "H100"\ncount = 2\n'
                 'nics = [{name = "mlx5_0", kind = "omnipath", rate_gbps = 100, near = [5]}]\n')
    got = "\n".join(problems(p))
    assert 'nics[0].kind: expected "ib", "roce" or "ethernet"' in got
    assert "nics[0].near: expected a list of this node's GPU indices" in got


def test_a_cycle_of_switches(tmp_path: Path) -> None:
    p = tmp_path / "fleet.toml"
    p.write_text(NODES + '[[switch]]\nname = "a"\nswitches = ["b"]\n[[switch]]\nname = "b"\nswitches = ["a"]\n')
    assert any("is in a cycle" in line for line in problems(p))
