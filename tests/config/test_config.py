from __future__ import annotations

from pathlib import Path

import pytest

from hsched.config import (
    job_spec_from_table,
    load_fleet,
    load_job_spec,
    load_settings,
    parse_checkpoint_signal,
    parse_duration_s,
    parse_size_mib,
)
from hsched.errors import ConfigError, UserError
from hsched.model import Interconnect


def test_spec_file_round_trip(tmp_path: Path) -> None:
    p = tmp_path / "job.toml"
    p.write_text(
        'name = "bert"\ncommand = ["python", "train.py", "--epochs", "3"]\nworkdir = "/data"\nqos = "prod"\n'
        'checkpoint_signal = "USR1@60"\ntime = "1h30m"\n[env]\nWANDB_MODE = "offline"\n'
        '[resources]\ngpus = 4\ngpu_types = ["a100", "h100"]\ninterconnect = "nvlink"\ngpu_memory = "40G"\n'
    )
    spec = load_job_spec(p)
    assert spec.command == ("python", "train.py", "--epochs", "3")
    assert spec.resources.gpus == 4 and spec.resources.interconnect is Interconnect.NVLINK
    assert spec.resources.gpu_memory_mib == 38146  # 40 GB, as vendors count (issue 15)
    assert spec.checkpoint_signal.signal == "USR1" and spec.checkpoint_signal.grace_s == 60
    assert spec.time_limit_s == 5400
    assert spec.env == (("WANDB_MODE", "offline"),)
    assert spec.qos == "prod"


def test_misspelt_key_suggests_the_right_one(tmp_path: Path) -> None:
    p = tmp_path / "job.toml"
    p.write_text('command = ["true"]\n[resources]\ngpu = 2\n')
    with pytest.raises(ConfigError) as e:
        load_job_spec(p)
    assert e.value.problems == [f"{p}: resources.gpu: unknown key (did you mean 'gpus'?)"]


def test_every_problem_one_line(tmp_path: Path) -> None:
    p = tmp_path / "job.toml"
    p.write_text('command = "  "\nqos = "urgent"\n[resources]\ngpus = -1\ninterconnect = "infiniband"\n')
    with pytest.raises(ConfigError) as e:
        load_job_spec(p)
    lines = e.value.problems
    assert f"{p}: resources.gpus: expected an integer >= 0, found -1" in lines
    assert any("qos: expected one of prod, normal, scavenger, found 'urgent'" in ln for ln in lines)
    assert any("resources.interconnect" in ln and "'infiniband'" in ln for ln in lines)
    assert any(ln.startswith(f"{p}: command:") for ln in lines)
    assert all("\n" not in ln for ln in lines)


def test_not_toml_is_one_line(tmp_path: Path) -> None:
    p = tmp_path / "job.toml"
    p.write_text("this is [not toml\n")
    with pytest.raises(UserError) as e:
        load_job_spec(p)
    assert len(e.value.problems) == 1
    assert e.value.problems[0].startswith(f"{p}: not valid TOML: ")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such file"):
        load_job_spec(tmp_path / "nope.toml")


def test_sizes_durations_signals() -> None:
    assert parse_size_mib("16G") == 16384
    assert parse_size_mib("512M") == 512
    assert parse_size_mib("1.5T") == int(1.5 * 1024 * 1024)
    assert parse_duration_s("01:30:00") == 5400
    assert parse_duration_s("2-00:00:00") == 2 * 86400
    assert parse_duration_s("5m30s") == 330
    for bad in ("abc", "1x", "-5", "", "1-", "1-2:3:4:5", "1:2:3:4", "90s5"):
        with pytest.raises(ValueError):
            parse_duration_s(bad)


@pytest.mark.parametrize(("text", "seconds"), [
    # sbatch's --time, exactly: a bare number is minutes
    ("90", 5400), (90, 5400), ("10:30", 630), ("01:30:00", 5400), ("2-12", 216000), ("1-02:30", 95400),
    ("1-02:30:15", 95415),
    # hsched's own units
    ("90s", 90), ("2h", 7200), ("1h30m", 5400), ("2d", 172800),
])
def test_time_limits_mean_what_sbatch_means(text: str | int, seconds: float) -> None:
    assert parse_duration_s(text) == seconds
    assert parse_checkpoint_signal("SIGUSR1@10").signal == "USR1"
    with pytest.raises(ValueError):
        parse_checkpoint_signal("NOPE@10")


def test_command_string_runs_in_a_shell() -> None:
    spec = job_spec_from_table({"command": "echo hi && true"}, "x")
    assert spec.command == ("/bin/sh", "-c", "echo hi && true")


def test_fleet_file(tmp_path: Path) -> None:
    (tmp_path / "topo.txt").write_text("GPU0\tX\n")
    p = tmp_path / "fleet.toml"
    p.write_text(
        '[[node]]\nname = "gpu-a"\nexecutor = "ssh"\nhost = "gpu-a.lab"\nport = 2222\n'
        '[node.simulate]\nmodel = "NVIDIA A100-SXM4-80GB"\ncount = 4\nmemory_mib = 81920\ntopology = "topo.txt"\n'
        '[[node]]\nname = "ws"\n'
    )
    fleet = load_fleet(p)
    assert [n.name for n in fleet.nodes] == ["gpu-a", "ws"]
    assert fleet.nodes[0].simulate is not None and fleet.nodes[0].simulate.topology == str(tmp_path / "topo.txt")
    assert fleet.nodes[1].executor == "local"


def test_fleet_problems(tmp_path: Path) -> None:
    p = tmp_path / "fleet.toml"
    p.write_text('[[node]]\nname = "a"\nexecutor = "ssh"\n[[node]]\nname = "a"\nexecuter = "local"\n')
    with pytest.raises(ConfigError) as e:
        load_fleet(p)
    text = "\n".join(e.value.problems)
    assert "node[0] (a).host: missing" in text
    assert "duplicate node name 'a'" in text
    assert "executer: unknown key (did you mean 'executor'?)" in text


def test_settings(tmp_path: Path) -> None:
    p = tmp_path / "settings.toml"
    p.write_text("lease_s = 60\ncheckpoint_exit_code = 85\npoll_interval = 2\n")
    with pytest.raises(ConfigError, match="did you mean 'poll_interval_s'"):
        load_settings(p)
    p.write_text("lease_s = 60\n")
    assert load_settings(p).lease_s == 60


@pytest.mark.parametrize(("key", "value"), [("checkpoint_signal", "KILL@5"), ("checkpoint_signal", "SIGSTOP"),
                                            ("signal", "9@60"), ("signal", "STOP@10")])
def test_an_uncatchable_signal_cannot_ask_for_a_checkpoint_or_warn(key: str, value: str) -> None:
    with pytest.raises(UserError) as err:
        job_spec_from_table({"command": ["true"], key: value}, "<command line>")
    [line] = err.value.problems
    assert line.startswith(f"<command line>: {key}: expected a signal the job can catch") and "cannot be caught" in line


@pytest.mark.parametrize(("table", "key", "words"), [
    ({"name": "a\x00b"}, "name", "unprintable character '\\x00'"),
    ({"name": "two\nlines"}, "name", "unprintable character '\\n'"),
    ({"name": "\x1b[2Jwiped"}, "name", "unprintable character '\\x1b'"),
    ({"name": "é" * 129}, "name", "longer than 256 bytes"),
    ({"command": ["echo", "a\x00b"]}, "command[1]", "NUL character"),
    ({"env": {"A": "x\x00y"}}, "env.A", "NUL character"),
    ({"workdir": "/tmp/\x00"}, "workdir", "NUL character"),
    ({"retries": -1}, "retries", "an integer >= 0"),
    ({"retries": 101}, "retries", "from 0 to 100"),
    ({"retries": "2"}, "retries", "an integer"),
])
def test_names_argv_and_retries_are_checked_at_submit(table: dict[str, object], key: str, words: str) -> None:
    # caught here, one line naming the key, rather than a launch that hangs or a name that rewrites a terminal
    with pytest.raises(UserError) as err:
        job_spec_from_table({"command": ["true"], **table}, "<command line>")
    [line] = err.value.problems
    assert line.startswith(f"<command line>: {key}: ") and words in line


def test_a_long_printable_name_and_a_newline_in_a_shell_script_are_fine() -> None:
    spec = job_spec_from_table({"command": ["sh", "-c", "echo a\necho b"], "name": "x" * 256, "retries": 3},
                               "<command line>")
    assert spec.name == "x" * 256 and spec.retries == 3


def test_batch_only_signals() -> None:
    ck = parse_checkpoint_signal("B:USR1@60")
    assert (ck.signal, ck.grace_s, ck.batch_only, str(ck)) == ("USR1", 60.0, True, "B:USR1@60")
    assert not parse_checkpoint_signal("USR1@60").batch_only
    assert parse_checkpoint_signal("b:sigterm").batch_only


def test_retry_settings(tmp_path: Path) -> None:
    p = tmp_path / "settings.toml"
    p.write_text("retries = 2\nfatal_exit_codes = [3, 126]\nretry_backoff_s = 5\nretry_backoff_max_s = 60\n")
    s = load_settings(p)
    assert (s.retries, s.fatal_exit_codes, s.retry_backoff_s, s.retry_backoff_max_s) == (2, (3, 126), 5.0, 60.0)
    p.write_text("fatal_exit_codes = [85]\n")
    with pytest.raises(ConfigError, match="fatal_exit_codes: cannot hold 0 or the checkpoint exit code"):
        load_settings(p)
    p.write_text("fatal_exit_codes = 3\n")
    with pytest.raises(ConfigError, match="fatal_exit_codes: expected a list of exit codes"):
        load_settings(p)


def test_priority_range_and_probe_timeout(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="priority: expected an integer from -1000000 to 1000000"):
        job_spec_from_table({"command": ["true"], "priority": 10**7}, "<command line>")
    p = tmp_path / "settings.toml"
    p.write_text("probe_timeout_s = 4\n")
    assert load_settings(p).probe_timeout_s == 4.0
