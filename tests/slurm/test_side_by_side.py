"""The same batch scripts through `hsched submit` and through a real `sbatch` (issue 29, item 9): each case below
writes down what sbatch does with it (the environment the script sees, the output files it leaves, the exit code
`N:S`, or the refusal at submit), and both runners are held to it. hsched always runs (a real controller, two
local nodes n1 and n2, real processes); the real Slurm cluster of tests/slurm/cluster.py (nodes n1 and n2 too)
runs the same scripts where it can start (root, Slurm installed), so the written-down behaviour is checked against
Slurm itself, and hsched's results against Slurm's.

Job ids differ between the two: they are compared as templates ({J} the job's id, {A} its array's, {W} the
working folder, {U} the user, {N} a node of the job). Where hsched differs from sbatch on purpose
(docs/slurm-compat.md, "Deliberate differences"), the case says so in `hsched_only`/`slurm_only`.
"""

from __future__ import annotations

import getpass
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hsched.spec.hostlist import expand
from tests.conftest import Hs
from tests.slurm.cluster import SlurmCluster, available

pytestmark = pytest.mark.slow  # real controllers, real processes, a real Slurm where it can start

NODES = ("n1", "n2")
FLEET = "".join(f'[[node]]\nname = "{n}"\n[node.simulate]\nmodel = "NVIDIA A100-SXM4-80GB"\ncount = 2\n\n'
                for n in NODES)
SETTINGS = "poll_interval_s = 0.2\nkill_after_s = 2\n"
BASIC = ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NAME", "SLURM_SUBMIT_DIR", "SLURM_JOB_USER", "SLURM_NNODES",
         "SLURM_JOB_NUM_NODES", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
BASIC_VALUES = {"SLURM_JOB_ID": "{J}", "SLURM_JOBID": "{J}", "SLURM_SUBMIT_DIR": "{W}", "SLURM_JOB_USER": "{U}",
                "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "{N}", "SLURM_NODELIST": "{N}"}


@dataclass(frozen=True)
class Case:
    name: str
    body: str = ""
    """The script after `#!/bin/bash` and the lines printing `env`: #SBATCH lines, commands."""
    args: tuple[str, ...] = ()
    """Options before the script, on the command line (the same for sbatch and hsched submit)."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables the script prints, and the value sbatch gives each ("<unset>": not set)."""
    files: tuple[str, ...] = ("slurm-{J}.out",)
    """The output files sbatch leaves in the working folder (the first holds the printed lines)."""
    exit: str = "0:0"
    """The job's exit code as sacct/scontrol show it."""
    lines: tuple[str, ...] = ()
    """Other lines the script prints (srun's tasks: compared in sorted order)."""
    refused: str = ""
    """A refusal at submit: a word of sbatch's message (the script never runs)."""
    after: str = ""
    """`--dependency` on another case's job: `afterok:{case}` ({case}: its id), `{case}_1` one task of its array."""
    tasks: tuple[int, ...] = ()
    """An array's task indices (files and env per task: {T} the task's index)."""
    nodes: tuple[str, ...] = ()
    """The job's nodes, when sbatch decides them (-w, -x)."""
    hsched_only: dict[str, str] = field(default_factory=dict)
    """Variables whose value hsched gives differently on purpose (docs/slurm-compat.md): hsched's value."""


CASES = [
    Case("env", env=dict(BASIC_VALUES, SLURM_JOB_NAME="env.sh")),
    Case("submit_dir", body='cd "$SLURM_SUBMIT_DIR" && echo "PWD=$(pwd)"', lines=("PWD={W}",),
         env={"SLURM_SUBMIT_DIR": "{W}"}),
    Case("output_name", body="#SBATCH -J named\n#SBATCH -o %x-%j.log", files=("named-{J}.log",),
         env={"SLURM_JOB_NAME": "named"}),
    Case("output_error", args=("-o", "out.%j", "-e", "err.%j"), body="echo oops >&2", files=("out.{J}", "err.{J}"),
         env={"SLURM_JOB_ID": "{J}"}),
    Case("exit_code", body="exit 3", exit="3:0", env={"SLURM_JOB_ID": "{J}"}),
    Case("killed", body="kill -9 $$", exit="0:9", env={"SLURM_JOB_ID": "{J}"}),
    Case("array", args=("--array", "0-2"), tasks=(0, 1, 2), files=("slurm-{A}_{T}.out",),
         env={"SLURM_ARRAY_JOB_ID": "{A}", "SLURM_ARRAY_TASK_ID": "{T}", "SLURM_ARRAY_TASK_COUNT": "3",
              "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "2"}),
    Case("array_output", body="#SBATCH --array=1,3\n#SBATCH -o arr-%A_%a.out", tasks=(1, 3),
         files=("arr-{A}_{T}.out",), env={"SLURM_ARRAY_JOB_ID": "{A}", "SLURM_ARRAY_TASK_ID": "{T}"}),
    Case("dep_job", after="afterok:{exit_code}?afterany:{env}", env={"SLURM_JOB_ID": "{J}"}),
    Case("dep_array_task", after="afterok:{array}_1", env={"SLURM_JOB_ID": "{J}"}),
    Case("dep_whole_array", after="afterok:{array}", env={"SLURM_JOB_ID": "{J}"}),
    Case("cpus_per_task", body="#SBATCH --cpus-per-task=2", env={"SLURM_CPUS_PER_TASK": "2"}),
    Case("export", body="#SBATCH --export=ALL,FOO=bar", env={"FOO": "bar", "FROM_SUBMITTER": "yes"}),
    Case("nodelist", args=("-w", "n2"), nodes=("n2",), env={"SLURM_JOB_NODELIST": "n2", "SLURM_NNODES": "1"}),
    Case("exclude", body="#SBATCH -x n1", nodes=("n2",), env={"SLURM_JOB_NODELIST": "n2"}),
    Case("hostlist_two_nodes", body="#SBATCH -w n[1-2]", nodes=("n1", "n2"),
         env={"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NNODES": "2"},
         hsched_only={"SLURM_JOB_NODELIST": "n1,n2"}),  # a host list either way (compressed by Slurm)
    # -N 1: without it Slurm may spread the tasks over both nodes when CPUs are busy (hsched keeps them on one)
    Case("ntasks_srun", body="#SBATCH --ntasks=2 -c 1 -N 1\n"
         "srun bash -c 'echo task $SLURM_PROCID $SLURM_LOCALID of $SLURM_NTASKS step $SLURM_STEP_ID'",
         env={"SLURM_NTASKS": "2", "SLURM_NPROCS": "2", "SLURM_CPUS_PER_TASK": "1"},
         lines=("task 0 0 of 2 step 0", "task 1 1 of 2 step 0")),
    Case("ntasks_srun_one", args=("-n", "2", "-N", "1"),
         body="srun -n1 bash -c 'echo one $SLURM_PROCID of $SLURM_NTASKS'\nsrun true", env={"SLURM_NTASKS": "2"},
         lines=("one 0 of 1",)),
    Case("srun_exit", body="#SBATCH -n 2 --nodes=1\nsrun bash -c 'exit $((SLURM_PROCID + 4))'", exit="5:0",
         env={"SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "{N}"},
         lines=("srun: error: {N}: task 0: Exited with exit code 4",
                "srun: error: {N}: task 1: Exited with exit code 5")),
    Case("gres", body="#SBATCH --gres=gpu:1", env={"SLURM_GPUS_ON_NODE": "1"}),
    Case("bad_node", args=("-w", "n9"), refused="invalid node name"),
    Case("bad_exclude", args=("-x", "n[1-9]"), refused="invalid node name"),
    Case("exclude_all", args=("-x", "n[1-2]"), refused="requested node configuration is not available"),
]
MISSING_SCRIPT = "nosuch.sh"


def script_text(case: Case) -> str:
    sbatch = [ln for ln in case.body.splitlines() if ln.startswith("#SBATCH")]
    rest = [ln for ln in case.body.splitlines() if not ln.startswith("#SBATCH")]
    prints = [f"printf 'ENV %s=%s\\n' {k} \"${{{k}-<unset>}}\"" for k in case.env]
    return "\n".join(["#!/bin/bash", *sbatch, *prints, *rest]) + "\n"


@dataclass
class Result:
    """What one runner made of one case."""

    submit_code: int
    submit_out: str
    submit_err: str
    ids: dict[str, str] = field(default_factory=dict)
    """{J}, {A} of the job."""
    files: dict[str, str] = field(default_factory=dict)
    """Output files found (name -> text), by the names they have."""
    exit: dict[str, str] = field(default_factory=dict)
    """Each job's (or task's) exit code N:S, by its display id."""
    nodes: dict[str, list[str]] = field(default_factory=dict)


class Runner:
    """Submits every case from its own working folder, waits for all, gathers the results."""

    name = ""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.results: dict[str, Result] = {}

    def workdir(self, case: Case) -> Path:
        return self.root / "work" / case.name

    def submit(self, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError

    def run_all(self) -> dict[str, Result]:
        for case in CASES:
            w = self.workdir(case)
            w.mkdir(parents=True)
            os.chmod(w, 0o777)
            (w / f"{case.name}.sh").write_text(script_text(case))
            argv = list(case.args)
            if case.after:
                dep = re.sub(r"\{(\w+)\}", lambda m: self.results[m.group(1)].ids["J"], case.after)
                argv += ["--dependency", dep]
            # sbatch names the job after its script: every case's script is env.sh-like, named for the case
            if case.name == "env":
                (w / "env.sh").write_text(script_text(case))
            proc = self.submit([*argv, "env.sh" if case.name == "env" else f"{case.name}.sh"], w)
            res = Result(proc.returncode, proc.stdout, proc.stderr)
            m = re.fullmatch(r"Submitted batch job (\d+)\n", proc.stdout)
            if m:
                res.ids = {"J": m.group(1), "A": m.group(1)}
            self.results[case.name] = res
        self.missing = self.submit([MISSING_SCRIPT], self.root)
        self.wait([r.ids["J"] for r in self.results.values() if r.ids])
        for case in CASES:
            res = self.results[case.name]
            if not res.ids:
                continue
            w = self.workdir(case)
            res.files = {p.name: p.read_text() for p in w.iterdir() if not p.name.endswith(".sh")}
            res.exit, res.nodes = self.ended(res.ids["J"], case)
        return self.results

    def wait(self, ids: list[str]) -> None:
        raise NotImplementedError

    def ended(self, jid: str, case: Case) -> tuple[dict[str, str], dict[str, list[str]]]:
        raise NotImplementedError


class HschedRunner(Runner):
    name = "hsched"

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        (root / "home").mkdir(parents=True)
        (root / "home" / "settings.toml").write_text(SETTINGS)
        (root / "fleet.toml").write_text(FLEET)
        self.hs = Hs(root / "home", fleet=root / "fleet.toml")

    def submit(self, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
        env = dict(self.hs.env, FROM_SUBMITTER="yes")
        return subprocess.run([sys.executable, "-m", "hsched", "submit", *argv], env=env, cwd=cwd,
                              capture_output=True, text=True, timeout=300)

    def wait(self, ids: list[str]) -> None:
        # the dependants too: `wait` follows each id (a whole array) to its end, on the controller's events
        self.hs.run("wait", *ids, "--timeout", "300", timeout=400)

    def ended(self, jid: str, case: Case) -> tuple[dict[str, str], dict[str, list[str]]]:
        rows = self.hs.run("acct", "-j", jid, "-n", "-P", "-o", "jobid,exitcode,nodelist", check=True).stdout
        exits, nodes = {}, {}
        for row in rows.splitlines():
            did, code, where = row.split("|")
            exits[did] = code
            nodes[did] = [n for n in where.split(",") if n]
        return exits, nodes


class SlurmRunner(Runner):
    name = "sbatch"

    def __init__(self, root: Path, cluster: SlurmCluster) -> None:
        super().__init__(root)
        self.cluster = cluster

    def submit(self, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
        env = dict(self.cluster.env, FROM_SUBMITTER="yes")
        return subprocess.run(["sbatch", *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)

    def wait(self, ids: list[str]) -> None:
        # Slurm has no `wait` for many jobs: its queue is asked until none of them is left (a safety net of 300 s
        # for a hung cluster; the jobs themselves take a second or two)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            q = self.cluster.run("squeue", "-h", "-o", "%i %r", check=False).stdout.split("\n")
            left = [ln for ln in q if ln.strip()]
            if not left:
                return
            time.sleep(0.5)
        raise AssertionError(f"Slurm jobs still queued: {left}")

    def ended(self, jid: str, case: Case) -> tuple[dict[str, str], dict[str, list[str]]]:
        exits, nodes = {}, {}
        text = self.cluster.run("scontrol", "-o", "show", "job", jid, check=True).stdout
        for line in text.splitlines():
            f = dict(w.split("=", 1) for w in line.split() if "=" in w)
            did = f"{f['ArrayJobId']}_{f['ArrayTaskId']}" if "ArrayTaskId" in f else f["JobId"]
            exits[did] = f["ExitCode"]
            nodes[did] = expand(f["NodeList"]) if f.get("NodeList") not in (None, "(null)") else []
        return exits, nodes


@pytest.fixture(scope="module")
def hsched_results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HschedRunner]:
    runner = HschedRunner(tmp_path_factory.mktemp("hsched"))
    try:
        runner.run_all()
        yield runner
    finally:
        runner.hs.stop()


@pytest.fixture(scope="module")
def slurm_results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> SlurmRunner | None:
    """The same cases through the real sbatch; None where the cluster cannot start (the cases' written-down
    behaviour stands in for it)."""
    if available() is not None:
        return None
    cluster = request.getfixturevalue("slurm_cluster")
    runner = SlurmRunner(tmp_path_factory.mktemp("sbatch"), cluster)
    try:
        runner.run_all()
    finally:
        cluster.cancel_all()
    return runner


def fill(template: str, res: Result, runner: Runner, case: Case, task: int | None = None,
         node: str | None = None) -> str:
    """`template` with the job's values; {N} (a node of the job) only where `node` says which."""
    subs = {"J": res.ids.get("J", "?"), "A": res.ids.get("A", "?"), "W": str(runner.workdir(case)),
            "U": getpass.getuser(), "T": "" if task is None else str(task), "N": node or "{N}"}
    return re.sub(r"\{([JAWUTN])\}", lambda m: subs[m.group(1)], template)


def check(case: Case, runner: Runner, res: Result) -> list[str]:
    """How `res` departs from what sbatch does with `case` (empty: it does what sbatch does)."""
    who = runner.name
    if case.refused:
        bad = []
        if res.submit_code == 0 or case.refused not in res.submit_err.lower():
            bad.append(f"{who}: expected a refusal naming {case.refused!r}, got exit {res.submit_code}: "
                       f"{res.submit_out!r} {res.submit_err!r}")
        if len(res.submit_err.strip().splitlines()) != 1:
            bad.append(f"{who}: the refusal is not one line: {res.submit_err!r}")
        if who == "hsched" and res.submit_code != 2:
            bad.append(f"hsched: a refusal of bad input exits 2 (sbatch: 1), got {res.submit_code}")
        return bad
    if res.submit_code != 0 or not res.ids:
        return [f"{who}: submit exit {res.submit_code}, {res.submit_out!r} {res.submit_err!r} (expected sbatch's "
                "'Submitted batch job N')"]
    out = []
    tasks: list[int | None] = list(case.tasks) or [None]
    want_files = sorted({fill(f, res, runner, case, t) for f in case.files for t in tasks})
    if sorted(res.files) != want_files:
        out.append(f"{who}: output files {sorted(res.files)}, expected {want_files}")
    for t in tasks:
        did = f"{res.ids['A']}_{t}" if t is not None else res.ids["J"]
        text = res.files.get(fill(case.files[0], res, runner, case, t), "")
        got_env = dict(ln[4:].split("=", 1) for ln in text.splitlines() if ln.startswith("ENV "))
        job_nodes = res.nodes.get(did, [])
        for k, template in case.env.items():
            if runner.name == "hsched" and k in case.hsched_only:
                template = case.hsched_only[k]
            want = fill(template, res, runner, case, t)
            got = got_env.get(k)
            if want == "{N}":
                ok = got is not None and got in job_nodes and len(job_nodes) == 1
            else:
                ok = got == want
            if not ok:
                out.append(f"{who} {did}: {k}={got!r}, expected {want!r} (nodes {job_nodes})")
        others = sorted(ln for ln in text.splitlines() if not ln.startswith("ENV "))
        node = job_nodes[0] if len(job_nodes) == 1 else None
        want_lines = sorted(fill(ln, res, runner, case, t, node) for ln in case.lines)
        if others != want_lines:
            out.append(f"{who} {did}: printed {others}, expected {want_lines}")
        if res.exit.get(did) != case.exit:
            out.append(f"{who} {did}: exit code {res.exit.get(did)!r}, expected {case.exit!r}")
        if case.nodes and sorted(job_nodes) != sorted(case.nodes):
            out.append(f"{who} {did}: ran on {job_nodes}, expected {list(case.nodes)}")
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_script_behaves_as_under_sbatch(case: Case, hsched_results: HschedRunner,
                                            slurm_results: SlurmRunner | None) -> None:
    problems = check(case, hsched_results, hsched_results.results[case.name])
    if slurm_results is not None:
        # the written-down behaviour is Slurm's own: the real sbatch is held to it too
        problems += check(case, slurm_results, slurm_results.results[case.name])
    assert not problems, "\n".join(problems)


def test_a_missing_script_is_refused_at_submit(hsched_results: HschedRunner,
                                               slurm_results: SlurmRunner | None) -> None:
    # sbatch: "sbatch: error: Unable to open file nosuch.sh", exit 1 (hsched: exit 2, as for all bad input)
    for runner in (hsched_results, slurm_results):
        if runner is None:
            continue
        proc: Any = runner.missing
        assert proc.returncode != 0 and proc.stdout == "", (runner.name, proc)
        assert MISSING_SCRIPT in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, (runner.name, proc)
        assert proc.returncode == (2 if runner.name == "hsched" else 1), (runner.name, proc)
