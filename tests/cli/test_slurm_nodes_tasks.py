"""sbatch's -w/--nodelist and -x/--exclude (Slurm host lists), --ntasks with srun's meaning, and dependencies on one
array task (issue 29, item 9): the pure parts, the job table the CLI sends, and the controller in-process on a fake
clock. tests/slurm/test_side_by_side.py runs the same habits end to end beside a real sbatch."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hsched.cli.submitting import check_nodes, job_table
from hsched.config import job_spec_from_table
from hsched.errors import UserError
from hsched.model import Job, JobSpec, JobState
from hsched.serialize import spec_from_dict, spec_to_dict
from hsched.spec.batch import read_batch_script
from hsched.spec.constraints import node_labels, parse_constraint, with_nodes
from hsched.spec.dependencies import DepState, parse_dependency, verdict
from hsched.spec.hostlist import expand

# ------------------------------------------------------------------------------------------------ host lists


@pytest.mark.parametrize(("text", "names"), [
    ("n1", ["n1"]),
    ("n[1-3],gpu5", ["n1", "n2", "n3", "gpu5"]),
    ("n[01-03]", ["n01", "n02", "n03"]),
    ("n[1,3-4]", ["n1", "n3", "n4"]),
    ("r[1-2]-n[1,3]", ["r1-n1", "r1-n3", "r2-n1", "r2-n3"]),
    ("n1,n1,n[1-2]", ["n1", "n2"]),
])
def test_host_lists_expand_as_slurms(text: str, names: list[str]) -> None:
    assert expand(text) == names


@pytest.mark.parametrize(("text", "why"), [
    ("n[3-1]", "runs backwards"), ("n[1-", "not closed"), ("n1]", "without its"), ("a b", "not a node name"),
    ("n1,,n2", "empty name"), ("n[0-999999999]", "more than"), ("n[a-b]", "numbers and ranges"),
    ("n[[1]]", "do not nest"),
])
def test_bad_host_lists_say_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        expand(text)


# ------------------------------------------------------------------------------------------------ constraints


def test_node_names_in_constraints() -> None:
    c = parse_constraint(with_nodes("a100", ["n1", "n2"], ["n3"]))
    assert c.text == "(a100)&(@n1|@n2)&!@n3"
    assert c.satisfied_by(node_labels("n1", ["a100"])) and not c.satisfied_by(node_labels("n1", []))
    assert not c.satisfied_by(node_labels("n3", ["a100"])) and not c.satisfied_by(node_labels("n4", ["a100"]))
    only_not = parse_constraint(with_nodes(None, [], ["n3", "n4"]))
    assert only_not.satisfied_by(node_labels("n1", [])) and not only_not.satisfied_by(node_labels("n4", ["x"]))
    # a fleet file's label never reads as a node's name: labels start with a letter or digit
    assert not parse_constraint("@n1").satisfied_by(frozenset({"n1"}))
    assert with_nodes("", [], []) == "" and parse_constraint("a|b").satisfied_by({"b"})
    with pytest.raises(ValueError, match="negation"):
        parse_constraint("!nvme")  # negating a label is still refused; only -x's node names are negated


# ------------------------------------------------------------------------------------------------ the job table


def table(*opts: tuple[str, Any]) -> dict[str, Any]:
    return job_table(dict(opts), ["--", "true"], {})


def test_nodelist_and_exclude_become_the_constraint_and_the_node_count() -> None:
    t = table(("nodelist", "n[1-2]"), ("constraint", "nvme"))
    assert t["resources"]["nodes"] == 2 and t["resources"]["constraint"] == "(nvme)&(@n1|@n2)"
    t = table(("exclude", "n1,gpu[1-2]"), ("nodes", 2))
    assert (t["resources"]["nodes"], t["resources"]["constraint"]) == (2, "!@n1&!@gpu1&!@gpu2")
    assert table(("nodelist", "n2"), ("nodes", 1))["resources"]["constraint"] == "@n2"
    with pytest.raises(UserError, match=r"names 2 node.*--nodes is 1"):
        table(("nodelist", "n[1-2]"), ("nodes", 1))  # sbatch: invalid number of nodes (-N 2-1)
    with pytest.raises(UserError, match="both name n2"):
        table(("nodelist", "n[1-2]"), ("exclude", "n2"))
    with pytest.raises(UserError, match="--nodelist 'n\\[1-'"):
        table(("nodelist", "n[1-"),)


def test_ntasks_on_one_node_runs_once_and_over_several_nodes_as_ranks() -> None:
    t = table(("ntasks", 3))
    assert t["ntasks"] == 3 and "tasks_per_node" not in t.get("resources", {})
    spec = job_spec_from_table(t, "<command line>")
    assert spec.ntasks == 3 and spec.resources.tasks_per_node == 1
    assert spec_from_dict(spec_to_dict(spec)).ntasks == 3  # it survives the store
    t = table(("ntasks", 4), ("nodes", 2))
    assert "ntasks" not in t and t["resources"]["tasks_per_node"] == 2
    with pytest.raises(UserError, match="not a multiple"):
        table(("ntasks", 3), ("nodes", 2))
    with pytest.raises(UserError, match="disagree"):
        table(("ntasks", 3), ("tasks_per_node", 2))
    with pytest.raises(UserError, match="ntasks: one node only"):
        job_spec_from_table({"command": ["x"], "ntasks": 2, "resources": {"nodes": 2}}, "job.toml")


class Partitions:
    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer

    def call(self, op: str, **_: Any) -> dict[str, Any]:
        assert op == "partitions"
        return self.answer


def test_a_node_the_fleet_lacks_is_refused_in_one_line() -> None:
    fleet = Partitions({"partitions": {}, "nodes": ["n1", "n2"]})
    check_nodes(fleet, {"nodelist": ["n2"], "exclude": ["n1"]})
    with pytest.raises(UserError, match=r"^--exclude: invalid node name 'n9': no such node in the fleet \(nodes: "
                                        r"n1, n2\)$"):
        check_nodes(fleet, {"nodelist": ["n1"], "exclude": ["n9"]})
    with pytest.raises(UserError, match="--exclude: requested node configuration is not available"):
        check_nodes(fleet, {"exclude": ["n1", "n2"]})
    check_nodes(Partitions({"partitions": {}}), {"nodelist": ["n9"]})  # an older controller: its round decides


# ------------------------------------------------------------------------------------------------ batch scripts


def script(tmp_path: Path, lines: str) -> list[str]:
    path = tmp_path / "job.sh"
    path.write_text(f"#!/bin/bash\n{lines}\nsrun hostname\n")
    got = read_batch_script(path)
    assert got is not None
    return got.options


def test_sbatch_lines_for_tasks_nodes_and_the_name(tmp_path: Path) -> None:
    opts = script(tmp_path, "#SBATCH --ntasks=3 --cpus-per-task=2\n#SBATCH -w n[1-2] -x n3")
    assert opts[:2] == ["--job-name", "job.sh"]  # sbatch names the job after its script
    assert ["--ntasks", "3"] == opts[opts.index("--ntasks"):][:2] and opts[opts.index("--cpus") + 1] == "6"
    assert ["-w", "n[1-2]", "-x", "n3"] == opts[opts.index("-w"):][:4]
    opts = script(tmp_path, "#SBATCH -N 2 --ntasks-per-node=2 -c 3\n#SBATCH -J mine")
    assert "--job-name" not in opts and opts[opts.index("--ntasks") + 1] == "4"
    assert opts[opts.index("--cpus") + 1] == "6"
    with pytest.raises(UserError, match="disagree"):
        script(tmp_path, "#SBATCH -n 3 --ntasks-per-node=2")


# ------------------------------------------------------------------------------------------------ dependencies


def task(jid: int, array_id: int, index: int, state: JobState) -> Job:
    return Job(id=jid, spec=JobSpec(command=("x",)), user="u", state=state, reason="", submit_time=0.0,
               array_id=array_id, array_task=index)


def test_a_dependency_on_one_array_task() -> None:
    deps, _ = parse_dependency("afterok:5_3:9")
    assert str(deps[0]) == "afterok:9:5_3" and parse_dependency(str(deps[0]))[0] == deps
    me = Job(id=20, spec=JobSpec(command=("x",), dependency=deps), user="u", state=JobState.PENDING, reason="",
             submit_time=0.0)
    other = Job(id=9, spec=JobSpec(command=("x",)), user="u", state=JobState.COMPLETED, reason="", submit_time=0.0)
    tasks = [task(5, 5, 0, JobState.RUNNING), task(6, 5, 3, JobState.RUNNING)]
    others = {5: tasks[0], 9: other}
    assert verdict(me, others, set(), {5: tasks}).state is DepState.WAITING
    tasks[1] = replace(tasks[1], state=JobState.COMPLETED)  # task 3 done; task 0 still running: not waited for
    assert verdict(me, others, set(), {5: tasks}).state is DepState.SATISFIED
    tasks[1] = replace(tasks[1], state=JobState.FAILED)
    never = verdict(me, others, set(), {5: tasks})
    assert never.state is DepState.NEVER and "5_3" in never.why
    gone = verdict(replace(me, spec=JobSpec(command=("x",), dependency=parse_dependency("afterok:5_7")[0])), others,
                   set(), {5: tasks})
    assert gone.state is DepState.NEVER and "5_7 does not exist" in gone.why

