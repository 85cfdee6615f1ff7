"""The fleet file's slurm node group: its keys, the one-line problems, and the executor it makes. Pure: no
process (constructing a SlurmExecutor runs nothing), the fast lane."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from hsched.executors.slurm.executor import SlurmExecutor, login_config

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


def test_a_slurm_group_reached_over_ssh() -> None:
    """`login` makes the group's Slurm commands run on a login node, with the ssh keys an ssh node has."""
    [nc] = fleet(GROUP + 'login = "me@login1.dept"\nport = 2222\nidentity_file = "~/.ssh/id_lab"\n'
                 'known_hosts = "~/.ssh/known_hosts_lab"\n').nodes
    assert (nc.login, nc.port, nc.identity_file, nc.known_hosts, nc.host) == (
        "me@login1.dept", 2222, "~/.ssh/id_lab", "~/.ssh/known_hosts_lab", None)
    login = login_config(nc)  # the executor's ssh settings (tests/slurm/test_slurm_login.py connects with them)
    assert (login.executor, login.host, login.user, login.port, login.identity_file, login.known_hosts) == (
        "ssh", "login1.dept", "me", 2222, "~/.ssh/id_lab", "~/.ssh/known_hosts_lab")
    [alias] = fleet('[[node]]\nname = "c"\nexecutor = "slurm"\npartition = "p"\nlogin = "cluster"\nuser = "u"\n').nodes
    assert (login_config(alias).host, login_config(alias).user) == ("cluster", "u")
    # without login nothing changes: this machine's client commands
    assert SlurmExecutor.from_config(fleet(GROUP).nodes[0]).login is None


@pytest.mark.parametrize(("text", "problem"), [
    ('[[node]]\nname = "c"\nexecutor = "slurm"\npartition = "gpu"\nlogin = "a b"\n',
     'node[0] (c).login: expected a login node as "user@host"'),
    ('[[node]]\nname = "c"\nexecutor = "slurm"\npartition = "gpu"\nlogin = "-oProxyCommand=x"\n',
     "node[0] (c).login: expected"),
    ('[[node]]\nname = "c"\nexecutor = "slurm"\npartition = "gpu"\nlogin = "me@"\n', "node[0] (c).login"),
    ('[[node]]\nname = "c"\nexecutor = "slurm"\npartition = "gpu"\nlogin = ""\n', "node[0] (c).login"),
    ('[[node]]\nname = "c"\nexecutor = "slurm"\npartition = "gpu"\nport = 22\n',
     'node[0] (c).port: only with login = "user@host"'),
    ('[[node]]\nname = "c"\nexecutor = "slurm"\npartition = "gpu"\nidentity_file = "k"\n',
     "node[0] (c).identity_file: only with login"),
    ('[[node]]\nname = "c"\nexecutor = "ssh"\nhost = "h"\nlogin = "me@x"\n',
     'node[0] (c).login: only for executor = "slurm"'),
])
def test_login_problems_name_the_key(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as e:
        fleet(text)
    assert any(problem in p for p in e.value.problems), e.value.problems


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


def test_login_dir_says_where_hscheds_folder_is_on_the_login_node() -> None:
    from hsched.executors.slurm.text import expand_login_dir

    [nc] = fleet(GROUP + 'login = "me@login1"\nlogin_dir = "/scratch/$USER/hsched"\n').nodes
    assert nc.login_dir == "/scratch/$USER/hsched"
    assert fleet(GROUP + 'login = "me@login1"\n').nodes[0].login_dir is None
    for ok in ("~", "~/hsched", "$HOME/x", "${HOME}/x/${USER}", "/p/$USER-x/y"):
        assert fleet(GROUP + f'login = "me@l"\nlogin_dir = "{ok}"\n').nodes[0].login_dir == ok
    # expanded with what the login node says of its user (never by a shell)
    assert expand_login_dir("/scratch/$USER/hsched", "/home/me", "me") == "/scratch/me/hsched"
    assert expand_login_dir("~", "/home/me", "me") == "/home/me"
    assert expand_login_dir("~/a/../b/", "/home/me", "me") == "/home/me/b"
    assert expand_login_dir("${HOME}/x-${USER}", "/home/me", "me") == "/home/me/x-me"


@pytest.mark.parametrize(("value", "problem"), [
    ("scratch/hsched", "node[0] (c).login_dir: expected an absolute folder on the login node (/..., ~/... or "
                       "$HOME/...), found 'scratch/hsched' (e.g. \"/scratch/$USER/hsched\")"),
    ("/scratch/$LOGNAME/h", "node[0] (c).login_dir: expected an absolute folder on the login node where only $HOME "
                            "and $USER (or ~) are expanded, found '/scratch/$LOGNAME/h'"),
    ("/x/$(id -un)", "where only $HOME and $USER"),
    ("$HOMEX/h", "where only $HOME and $USER"),
    ("~bob/h", "expected an absolute folder"),
    ("/x\\ny", "expected a folder name without control characters"),
    ("", "node[0] (c).login_dir: expected a non-empty string"),
])
def test_login_dir_problems_are_one_line_naming_the_key(value: str, problem: str) -> None:
    text = f'[[node]]\nname = "c"\nexecutor = "slurm"\npartition = "gpu"\nlogin = "me@l"\nlogin_dir = "{value}"\n'
    with pytest.raises(ConfigError) as e:
        fleet(text)
    assert any(problem in p for p in e.value.problems), e.value.problems
    with pytest.raises(ConfigError) as e:
        fleet('[[node]]\nname = "c"\nexecutor = "slurm"\npartition = "gpu"\nlogin_dir = "/scratch"\n')
    assert e.value.problems == ['fleet.toml: node[0] (c).login_dir: only with login = "user@host" (a slurm node '
                                'reached over SSH)'], e.value.problems
