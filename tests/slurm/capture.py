"""Capture the Slurm outputs under tests/fixtures/slurm/ from a real cluster (tests/slurm/cluster.py), as root:

    .venv/bin/python -m tests.slurm.capture [FOLDER [FILE...]]

FILE...: write only these captures (job_preempted.txt job_node_fail.txt), leaving the others as they are.

Each file is one command's stdout, byte for byte, with a `# command:` and a `# slurm:` header line that
`tests/slurm/test_slurm_text.py` strips. Times are epochs (SLURM_TIME_FORMAT=%s, as the executor sets it).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from tests.conftest import FIXTURES
from tests.slurm.cluster import SlurmCluster


def main(out: Path, only: frozenset[str] = frozenset()) -> None:
    """Write the captures into `out` (only those named in `only`, when given: the others stay as they were)."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hsched-slurm-capture-") as tmp, SlurmCluster(Path(tmp)) as c:
        c.env["SLURM_TIME_FORMAT"] = "%s"
        version = c.run("sinfo", "--version").stdout.strip()

        def save(name: str, *argv: str) -> str:
            text = c.run(*argv).stdout
            if only and name not in only:
                return text
            (out / name).write_text(f"# command: {' '.join(argv)}\n# slurm: {version}\n{text}")
            return text

        def sbatch(*args: str) -> str:
            return c.run("sbatch", "--parsable", "-o", "/dev/null", *args).stdout.strip().split(";")[0]

        def wait_state(job: str, *states: str) -> None:
            deadline = time.monotonic() + 60
            while c.job(job)["JobState"] not in states:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"job {job} never reached {states}")
                time.sleep(0.1)

        save("partition.txt", "scontrol", "-o", "show", "partition", c.partition)
        save("nodes_idle.txt", "scontrol", "-d", "-o", "show", "node", "n[1-2]")
        running = sbatch("--gres=gpu:a100:1", "--comment=hsched:7:0123456789abcdef", "-J", "train a b",
                         "--wrap", "sleep 60")
        both = sbatch("-N2", "--gpus-per-node=1", "--wrap", "sleep 60")
        wait_state(running, "RUNNING")
        wait_state(both, "RUNNING")
        pending = sbatch("--gres=gpu:a100:2", "--wrap", "true")  # no node has 2 GPUs free now
        time.sleep(1.5)  # let the scheduler give it a reason
        save("nodes_busy.txt", "scontrol", "-d", "-o", "show", "node", "n[1-2]")
        save("job_running.txt", "scontrol", "-d", "-o", "show", "job", running)
        save("job_two_nodes.txt", "scontrol", "-d", "-o", "show", "job", both)
        save("job_pending.txt", "scontrol", "-d", "-o", "show", "job", pending)
        c.run("scancel", pending)
        c.run("scancel", running, both)
        failed = sbatch("--wrap", "exit 3")
        killed = sbatch("--wrap", "kill -USR1 $$")
        wait_state(failed, "FAILED")
        wait_state(killed, "FAILED", "CANCELLED")
        for job in (running, both, pending):
            wait_state(job, "CANCELLED")
        save("job_failed.txt", "scontrol", "-d", "-o", "show", "job", failed)
        save("job_signaled.txt", "scontrol", "-d", "-o", "show", "job", killed)
        save("job_cancelled_running.txt", "scontrol", "-d", "-o", "show", "job", running)
        save("job_cancelled_pending.txt", "scontrol", "-d", "-o", "show", "job", pending)
        save("squeue.txt", "squeue", "-h", "-t", "all", "-o", "%i\t%T\t%r\t%N\t%k\t%S\t%e")
        c.run("scontrol", "update", "nodename=n2", "state=drain", "reason=fan broken: replace")
        save("nodes_drained.txt", "scontrol", "-d", "-o", "show", "node", "n[1-2]")
        c.run("scontrol", "update", "nodename=n2", "state=resume")
        # Slurm takes jobs away: preempted by a job of the higher partition, and ended by a node going down
        victim = sbatch("--no-requeue", "-w", "n1", "--gres=gpu:a100:1", "--wrap", "sleep 60")
        doomed = sbatch("--no-requeue", "-w", "n2", "--wrap", "sleep 60")
        wait_state(victim, "RUNNING")
        wait_state(doomed, "RUNNING")
        urgent = sbatch("-p", "urgent", "-w", "n1", "--gres=gpu:a100:2", "--wrap", "sleep 60")
        wait_state(victim, "PREEMPTED")
        c.node_down("n2", "capture")
        wait_state(doomed, "NODE_FAIL")
        save("job_preempted.txt", "scontrol", "-d", "-o", "show", "job", victim)
        save("job_node_fail.txt", "scontrol", "-d", "-o", "show", "job", doomed)
        c.run("scancel", urgent)
        c.wait_nodes_up()


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURES / "slurm", frozenset(sys.argv[2:]))
