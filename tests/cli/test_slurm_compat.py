"""docs/slurm-compat.md cannot rot: every row it says hsched honours is checked against the CLI's own option
parser (the Typer app as click sees it) and the batch script reader, and every row it says hsched lacks is
checked to be still refused by the command it belongs to."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer.main

from hsched.cli._app import app
from hsched.spec.batch import _IGNORED, _translate

TABLE = Path(__file__).resolve().parents[2] / "docs" / "slurm-compat.md"
STATUSES = {"same", "differs", "script", "ignored", "no"}
# the hsched command each Slurm command's options are checked against ("no" rows and the Slurm side of "same")
COMMAND_OF = {"sbatch": "submit", "squeue": "queue", "scancel": "cancel", "sacct": "acct", "sshare": "share"}
# values for the #SBATCH options a script row translates (a new script row needs one here)
SCRIPT_VALUES = {"--gres": "gpu:a100:2", "--ntasks": "4", "--ntasks-per-node": "2", "--cpus-per-task": "4",
                 "--export": "ALL,FOO=bar"}


def rows() -> list[tuple[str, str, str, str]]:
    """(Slurm command of the section, Slurm cell, status, hsched cell) of every table row."""
    out = []
    section = ""
    for line in TABLE.read_text().splitlines():
        if line.startswith("## "):
            m = re.match(r"## (\w+)", line)
            section = m.group(1) if m else ""
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 4 and cells[1] in STATUSES:
            out.append((section, cells[0], cells[1], cells[2]))
    return out


def words(cell: str) -> list[str]:
    """The words in a cell's backticks, without `=VALUE` parts or trailing commas."""
    out = []
    for code in re.findall(r"`([^`]*)`", cell):
        out += [w.rstrip(",").split("=")[0] for w in code.split()]
    return out


def options(cell: str) -> list[str]:
    return [w for w in words(cell) if w.startswith("-")]


def command(path: list[str]) -> Any:
    """The click command of `hsched PATH...` and the words after its name."""
    cmd: Any = typer.main.get_command(app)
    rest = list(path)
    while rest and hasattr(cmd, "commands") and rest[0] in cmd.commands:
        cmd = cmd.commands[rest.pop(0)]
    return cmd, rest


def accepted(cmd: Any) -> set[str]:
    return {o for p in cmd.params for o in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ()))
            if o.startswith("-")}


ALL = rows()


def test_the_table_is_read() -> None:
    assert len(ALL) > 60
    assert {s for s, *_ in ALL} >= {"sbatch", "srun", "squeue", "scancel", "scontrol", "sacct", "seff"}


@pytest.mark.parametrize(("section", "slurm", "status", "hsched"),
                         [r for r in ALL if r[2] in ("same", "differs")], ids=lambda v: str(v)[:40])
def test_what_the_table_says_hsched_accepts_it_accepts(section: str, slurm: str, status: str, hsched: str) -> None:
    assert hsched.startswith("`hsched "), f"{slurm}: the hsched cell names the command: `hsched CMD OPTIONS`"
    cmd, rest = command(words(hsched)[1:])
    assert not [w for w in rest if not w.startswith("-")], f"{hsched}: no such hsched command"
    have = accepted(cmd)
    missing = [o for o in rest if o not in have]
    assert not missing, f"{slurm}: the table says `{hsched}`, but it does not accept {missing}"
    if status == "same" and section in COMMAND_OF:
        # the same meaning under Slurm's own spelling: the Slurm names work too
        theirs = [o for o in options(slurm) if o not in have]
        assert not theirs, f"{slurm}: marked same, but hsched {COMMAND_OF[section]} refuses {theirs}"


@pytest.mark.parametrize(("section", "slurm", "status", "hsched"),
                         [r for r in ALL if r[2] == "script"], ids=lambda v: str(v)[:40])
def test_script_rows_translate_to_options_submit_accepts(section: str, slurm: str, status: str, hsched: str) -> None:
    submit, _ = command(["submit"])
    for opt in options(hsched):
        assert opt in SCRIPT_VALUES, f"{slurm}: give an example value for {opt} in SCRIPT_VALUES"
        out, warnings = _translate([opt, SCRIPT_VALUES[opt]], Path("job.sh"))
        assert not warnings and out, f"#SBATCH {opt}: ignored or dropped, the table says it is honoured"
        unknown = [w for w in out if w.startswith("-") and w not in accepted(submit)]
        assert not unknown, f"#SBATCH {opt} becomes {out}, which submit does not accept"


@pytest.mark.parametrize(("section", "slurm", "status", "hsched"),
                         [r for r in ALL if r[2] == "ignored"], ids=lambda v: str(v)[:40])
def test_ignored_rows_are_ignored_with_a_warning(section: str, slurm: str, status: str, hsched: str) -> None:
    for opt in options(hsched):
        assert opt in _IGNORED, f"#SBATCH {opt}: the table says ignored, batch.py does something else"


@pytest.mark.parametrize(("section", "slurm", "status", "hsched"),
                         [r for r in ALL if r[2] == "no" and r[0] in COMMAND_OF], ids=lambda v: str(v)[:40])
def test_what_the_table_says_hsched_lacks_it_still_refuses(section: str, slurm: str, status: str,
                                                           hsched: str) -> None:
    cmd, _ = command([COMMAND_OF[section]])
    help_names = {"-h", "--help"}  # every command's help, whatever squeue's -h means
    taken = [o for o in options(slurm) if o in accepted(cmd) and o not in help_names]
    assert not taken, f"{slurm}: hsched {COMMAND_OF[section]} now accepts {taken}; update docs/slurm-compat.md"


def test_cpus_per_task_and_export_in_a_script(tmp_path: Path) -> None:
    # issue 29: `#SBATCH --cpus-per-task` refused the whole script, and `--export=ALL,FOO=bar` never set FOO
    from hsched.spec.batch import read_batch_script

    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --cpus-per-task=4\n#SBATCH --ntasks-per-node=2\n"
                      "#SBATCH --export=ALL,FOO=bar,BAZ=a=b\nsrun python train.py\n")
    got = read_batch_script(script)
    assert got is not None and not got.warnings
    opts = got.options
    assert opts[opts.index("--cpus") + 1] == "8"  # per task, times the tasks on a node
    envs = [opts[i + 1] for i, w in enumerate(opts) if w == "--env"]
    assert envs == ["FOO=bar", "BAZ=a=b"]
    out, warnings = _translate(["--export=NONE"], Path("job.sh"))
    assert out == [] and warnings and "only ALL and NAME=VALUE" in warnings[0]


@pytest.mark.parametrize("word", ["train.shh", "./run.sh", "jobs/missing.py"])
def test_a_mistyped_script_name_is_refused_at_submit(word: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # issue 29: sbatch refuses a script it cannot open; hsched queued it as a command (exit 0, then 127)
    from hsched.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HSCHED_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("sys.argv", ["hsched", "submit", word])
    with pytest.raises(SystemExit) as ex:
        main()
    err = capsys.readouterr().err.strip().splitlines()
    assert ex.value.code == 2 and len(err) == 1 and f"{word}: no such file" in err[0] and "`--`" in err[0]
    assert not (tmp_path / "home" / "hsched.db").exists()  # nothing queued, no controller asked


def test_programs_and_commands_after_dashes_are_not_scripts() -> None:
    from hsched.cli.submitting import missing_script

    assert missing_script("python3") is None and missing_script("sleep") is None  # on PATH
    assert missing_script("torchrun-only-on-the-nodes") is None  # a bare name may be the nodes' program


@pytest.mark.parametrize("argv", [["submit", "--", "missing.py"], ["submit", "--gpus", "0", "--", "missing.py", "-x"],
                                  ["submit", "-G0", "--", "missing.py"]])  # -G0: Typer's path, not the quick one
def test_a_command_after_dashes_is_run_as_given(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`hsched submit -- missing.py` runs `missing.py` as given, on both parsers (each drops the `--`): the
    missing-script refusal is only for a command written without `--`."""
    from hsched.cli import main, submitting
    from hsched.errors import UserError

    real = submitting.job_table

    def made(o: dict[str, Any], args: list[str], table: dict[str, Any]) -> dict[str, Any]:
        raise UserError(f"would queue {real(o, args, table)['command']}")  # no controller needed to see it

    monkeypatch.setattr(submitting, "job_table", made)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HSCHED_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("sys.argv", ["hsched", *argv])
    with pytest.raises(SystemExit):
        main()
    assert f"would queue {argv[argv.index('--') + 1:]}" in capsys.readouterr().err
