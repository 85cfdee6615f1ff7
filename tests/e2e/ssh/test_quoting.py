"""Hostile strings in job names, arguments, environment values, working folders and run folder names arrive
byte-exact on a remote node, and none of them runs anything (a canary file is never created)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hsched.executors.base import LaunchRequest
from hsched.executors.ssh import SSHExecutor, shell_command

from tests.e2e.ssh.conftest import run
from tests.e2e.ssh.hosts import TestHosts
from tests.executors.waits import wait_exited

pytestmark = pytest.mark.slow  # real sshd hosts and processes


def corpus(canary: Path) -> list[str]:
    c = str(canary)
    return [
        "plain", "with space", "  leading and trailing  ", "it's", 'say "hi"', "back\\slash", "semi;colon",
        "a && b", "a || b", "pipe|here", f"$(touch {c})", f"`touch {c}`", f"; touch {c}", f"&& touch {c}",
        f"| touch {c}", f"> {c}", f"x=$(touch {c})", f"'; touch {c}; '", f'"; touch {c}; "', f"\ntouch {c}\n",
        "$HOME", "${PATH}", "$((1+1))", "new\nline", "tab\there", "carriage\rreturn", "glob*?[a]", "~", "~root",
        "-n", "--", "-c", "héllo wörld", "日本語のジョブ", "emoji 🚀", "'\"'\"'", "\\'", "!bang !!", "#comment",
        "%s%n%x", "{a,b}", "\x1b[31mred\x1b[0m", "", " ", "*", "\\", "'", '"',
    ]


DUMP = """
import json, os, sys
names = json.loads(os.environ["HOSTILE_KEYS"])
print(json.dumps({
    "argv": [os.fsencode(a).hex() for a in sys.argv[1:]],
    "env": {k: os.fsencode(os.environ[k]).hex() for k in names},
    "cwd": os.fsencode(os.getcwd()).hex(),
}))
"""


def test_hostile_strings_arrive_byte_exact(ssh_hosts: TestHosts, tmp_path: Path, local_runs: Path) -> None:
    canary = tmp_path / "CANARY"
    strings = corpus(canary)
    assert len(strings) >= 30
    h = ssh_hosts[2]
    # working folders with hostile names, made on the host (it shares this machine's filesystem)
    workdirs = [h.root / "wd" / name for name in (f"a b;$(touch {canary})", "it's \"x\"\nnew 日本", "-rf ~ *")]
    for w in workdirs:
        w.mkdir(parents=True)
    env = {f"HOSTILE_{i}": s for i, s in enumerate(strings)}
    env["HSCHED_JOB_NAME"] = f"job $(touch {canary}); 'name'\n\"ünï\""
    env["HOSTILE_KEYS"] = json.dumps(sorted(env))

    async def main() -> list[tuple[dict, str | None]]:
        ex: SSHExecutor = ssh_hosts.executor(h)
        try:
            results = []
            for i, wd in enumerate([None, *workdirs]):
                # the run folder's own name is hostile too: it becomes part of the node's path
                run_dir = str(local_runs / f"{i}-1-$(touch {canary});'x'\n\"y\" ü")
                handle = await ex.launch(LaunchRequest(run_dir=run_dir, command=("python3", "-c", DUMP, *strings),
                                                       env=env, workdir=str(wd) if wd else None))
                rep = await wait_exited(ex, handle)
                assert rep.exit_code == 0, await ex.read_log(run_dir, 0)
                results.append((json.loads(await ex.read_log(run_dir, 0)), str(wd) if wd else None))
            return results
        finally:
            await ex.close()

    for got, wd in run(main()):
        assert got["argv"] == [s.encode().hex() for s in strings]
        assert got["env"] == {k: v.encode().hex() for k, v in env.items() if k != "HOSTILE_KEYS"}
        if wd is not None:
            assert bytes.fromhex(got["cwd"]).decode() == wd
    assert not canary.exists()


def test_every_word_of_a_remote_command_is_quoted(ssh_hosts: TestHosts, tmp_path: Path) -> None:
    """shell_command is the only way commands are built; words with shell syntax reach argv intact."""
    canary = tmp_path / "CANARY2"
    words = corpus(canary)

    async def main() -> list[str]:
        ex = ssh_hosts.executor(ssh_hosts[0])
        try:
            conn, _ = await ex._connection()
            script = "import json,sys; print(json.dumps(sys.argv[1:]))"
            rc, out, err = await ex._run(conn, shell_command("python3", "-c", script, *words), b"")
            assert rc == 0, err
            return list(json.loads(out))
        finally:
            await ex.close()

    assert run(main()) == words
    assert not canary.exists()
