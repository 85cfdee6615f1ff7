"""The live controller learns how fast each kind of job runs (issue 14, items 1-2): progress reports from the
jobs, a run's speed from its first and last report, the kind's moving average per GPU type, count and
placement class in the store, and the policy placing the kind's next job on the type where it measured
fastest, even against the accelerator table's prior. In-process, on a fake clock."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from hsched.controller import learning
from hsched.controller.api import Api
from hsched.controller.launching import job_cache
from hsched.learn.kinds import KindRate, PlacementClass, averaged, learned_model, placement_class
from hsched.sched.live import gpu_type_of
from hsched.spec.jobkind import derive_kind
from hsched.testing import CannedNode, Lab


@pytest.mark.parametrize(("command", "kind"), [
    (["python", "train.py", "--model", "resnet50", "--batch-size", "64", "--lr", "0.1", "--seed", "3"],
     "train.py model=resnet50 batch-size=64"),
    (["python3", "-u", "/home/a/exp/train.py", "--model=vit_b", "--out", "/tmp/x"], "train.py model=vit_b"),
    (["torchrun", "--nproc_per_node", "8", "-m", "pkg.train", "--config", "cfg/big.yaml"], "pkg.train config=big.yaml"),
    (["sh", "-c", "cd /w && python3 bert.py --dataset squad --bs 32"], "bert.py dataset=squad bs=32"),
    (["sh", "-c", "sleep 600"], "sleep"),
    (["sh", "-c", "python3 bert.py --dataset squad --bs 32 > log"], "bert.py dataset=squad bs=32"),
    (["./run.sh"], "run.sh"),
    ([], ""),
    # issue 29: a shell line is named by the program it runs, not by its first word; one that runs none of its
    # own (echo, a loop of shell words, id) has no kind; a batch script is named by its file, not `#SBATCH`
    (["sh", "-c", "echo hello"], ""),
    (["sh", "-c", "for i in 1 2 3; do echo $i; done"], ""),
    (["sh", "-c", "id; hostname"], ""),
    (["sh", "-c", "for f in a b; do python3 prep.py --data $f; done"], "prep.py data=$f"),
    (["sh", "-c", "cd /w && FOO=1 ./bench --model gpt2 | tee out"], "bench model=gpt2"),
    (["/bin/bash", "-c", "#!/bin/bash\n#SBATCH -G 2\n#SBATCH -J x\nsrun python train.py\n", "/home/a/run_bert.sh",
      "--model", "bert"], "run_bert.sh model=bert"),
])
def test_a_kind_is_the_script_and_its_model_and_batch_arguments(command: list[str], kind: str) -> None:
    assert derive_kind(command) == kind


def test_placement_classes() -> None:
    nv = [("g0", "g1"), ("g1", "g2"), ("g0", "g2")]
    assert placement_class([["g0"]], nv) is PlacementClass.SINGLE
    assert placement_class([["g0", "g1", "g2"]], nv) is PlacementClass.NVLINK
    assert placement_class([["g0", "g3"]], nv) is PlacementClass.PCIE
    assert placement_class([["g0"], ["h0"]], nv) is PlacementClass.SPANNING


def test_the_moving_average_follows_a_kind_that_changes() -> None:
    assert averaged(None, 0, 4.0) == 4.0
    assert averaged(4.0, 1, 8.0) == 6.0  # the second run counts a half
    r = 4.0
    for n in range(1, 20):
        r = averaged(r, n, 10.0)
    assert r == pytest.approx(10.0, abs=0.05)  # at least 1/5 each: the old figure fades


def test_the_learned_model_fills_unmeasured_types_from_the_prior() -> None:
    prior = {"a100": 2.0, "h100": 3.0, "v100": 1.0}
    rates = [KindRate("k", "a100", 1, PlacementClass.SINGLE, 10.0, 2, 0.0),
             KindRate("k", "v100", 1, PlacementClass.SINGLE, 9.0, 1, 0.0),
             KindRate("k", "a100", 2, PlacementClass.SPANNING, 12.0, 1, 0.0)]
    m = learned_model(rates, ["a100", "h100", "v100"], prior)
    assert m.rate("k", 1, "a100") == 10.0 and m.rate("k", 1, "v100") == 9.0  # measured: as measured
    # never measured on h100: the geometric mean of a100's and v100's figures scaled by the prior
    assert m.rate("k", 1, "h100") == pytest.approx(((10 * 3 / 2) * (9 * 3 / 1)) ** 0.5)
    # a kind faster on the "slower" type stays faster there: measurements beat the prior
    assert m.fastest_types("k", 1, ("a100", "v100")) == ("a100", "v100")
    assert m.rate("k", 2, "a100", spans=True) == 12.0
    assert not m.knows("other") and m.rel_speeds("other", 1, ("a100", "h100"))["h100"] == 1.0


def progress(run_dir: str, t: float, step: float, total: float | None = None) -> dict[str, Any]:
    return {"seq": 1, "gpus": {"source": None, "devices": []}, "processes": [],
            "progress": [{"run_dir": run_dir, "job_run_dir": run_dir, "t": t, "step": step, "total": total,
                          "reports": 1}]}


async def _report(lab: Lab, node: str, run_dir: str, step: float, total: float | None = None) -> None:
    await lab.ctl.db(job_cache(lab.ctl).read, lab.ctl.store)
    learning.observe(lab.ctl, lab.ctl.nodes[node], progress(run_dir, lab.clock.time(), step, total),
                     lab.clock.time(), job_cache(lab.ctl).last)


async def _run_for(lab: Lab, job_id: int, speed: float, seconds: float = 60.0, total: float = 1000.0,
                   step: float = 0.0) -> str:
    """The job's run reports progress at `speed` steps/s for `seconds` (from `step`), then ends; its node."""
    (run,) = [r for r in await lab.runs(job_id) if r.state.is_live()]
    for _ in range(int(seconds // 10) + 1):
        await _report(lab, run.node, run.run_dir, step, total)
        lab.clock.advance(10.0)
        step += 10.0 * speed
    await lab.finish(job_id, 0)
    await lab.round()
    await _report(lab, run.node, run.run_dir, step)  # the cache moved on: the ended run is learnt from
    await lab.settle_tasks()
    return run.node


FLEET = (CannedNode("fast", "NVIDIA H100 80GB HBM3", 1), CannedNode("slow", "NVIDIA A100-SXM4-80GB", 1))
H100, A100 = gpu_type_of("NVIDIA H100 80GB HBM3"), gpu_type_of("NVIDIA A100-SXM4-80GB")  # the policy's type names


async def test_a_kind_measured_fastest_on_the_slower_type_goes_there_from_then_on(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=FLEET) as lab:
        # the prior sends an unknown job to the H100
        first = await lab.submit("python3", "sim.py", "--model", "odd", gpus=1)
        await lab.round()
        assert (await lab.job(first.id)).placement[0].node == "fast"
        # two jobs of the kind at once: one on each type; this one is twice as fast on the A100
        second = await lab.submit("python3", "sim.py", "--model", "odd", gpus=1)
        await lab.round()
        assert (await lab.job(second.id)).placement[0].node == "slow"
        api = Api(lab.ctl)
        shown = await api.handle("show", {"id": first.id}, os.getuid())
        assert shown["kind"] == "sim.py model=odd" and shown["progress"] is None
        await _report(lab, "fast", (await lab.runs(first.id))[0].run_dir, 0.0, 1000.0)
        lab.clock.advance(20.0)
        await _report(lab, "fast", (await lab.runs(first.id))[0].run_dir, 20.0, 1000.0)
        live = (await api.handle("show", {"id": first.id}, os.getuid()))["progress"]
        assert live["step"] == 20.0 and live["steps_per_s"] == pytest.approx(1.0)
        assert live["remaining_s"] == pytest.approx(980.0) and live["class"] == "single"
        await _run_for(lab, first.id, 1.0, step=20.0)
        await _run_for(lab, second.id, 2.0)
        stored = {(r.gpu_type, r.runs): r.steps_per_s for r in lab.ctl.store.kind_rates()}
        assert stored == {(H100, 1): pytest.approx(1.0), (A100, 1): pytest.approx(2.0)}
        # an unknown kind still goes to the faster type by the prior; this kind goes where it measured fastest
        lab.clock.advance(learning.MODEL_EVERY_S)
        other = await lab.submit("python3", "other.py", gpus=1)
        third = await lab.submit("python3", "sim.py", "--model", "odd", gpus=1)
        await lab.round()
        assert (await lab.job(third.id)).placement[0].node == "slow"
        assert (await lab.job(other.id)).placement[0].node == "fast"
        kinds = {k["kind"]: k for k in await api.handle("kinds", {}, os.getuid())}
        rates = {r["gpu_type"]: r for r in kinds["sim.py model=odd"]["rates"]}
        assert rates[A100]["steps_per_s"] == pytest.approx(2.0) and rates[A100]["stored_runs"] == 1
        assert kinds["sim.py model=odd"]["jobs_now"] == 1 and kinds["other.py"]["rates"] == []
        # the finished attempt's progress is kept
        kept = (await api.handle("show", {"id": first.id}, os.getuid()))["progress"]
        assert kept["steps_per_s"] == pytest.approx(1.0) and kept["attempt"] == 1
    # and a restarted controller knows what was learnt
    async with Lab.open(tmp_path, nodes=FLEET, clock=lab.clock) as again:
        assert {r.gpu_type for r in again.ctl.store.kind_rates()} == {H100, A100}


async def test_reports_of_other_ranks_ended_attempts_and_strangers_are_ignored(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("python3", "t.py", gpus=1, kind="mine")
        await lab.round()
        (run,) = await lab.runs(job.id)
        for rd in (run.run_dir.replace("-r0-", "-r1-"), run.run_dir.replace(f"{job.id}-1-", f"{job.id}-9-"),
                   "/elsewhere/not-a-run", None):
            await _report(lab, run.node, str(rd), 5.0)
        assert learning.learning(lab.ctl).runs == {}
        await _report(lab, run.node, run.run_dir, 5.0)
        assert list(learning.learning(lab.ctl).runs) == [(job.id, 1)]
        assert learning.learning(lab.ctl).runs[(job.id, 1)].key[0] == "mine"  # --kind wins over the command


def test_a_kind_seen_only_as_a_gang_still_has_a_rate_for_one_gpu() -> None:
    """A kind measured only at 4 GPUs: a 1-GPU job of it must still be placeable (it had no rate anywhere)."""
    from hsched.learn.kinds import _fallback, measured_prior

    rates = [KindRate("k", "a100", 4, PlacementClass.NVLINK, 40.0, 1, 0.0)]
    prior = {"a100": 2.0, "h100": 3.0}
    model = _fallback(learned_model(rates, ["a100", "h100"], measured_prior(rates, prior, ["a100", "h100"])))
    assert model.fastest_types("k", 1, ("a100", "h100")) == ("h100", "a100")
    assert model.rate("k", 4, "a100") == 40.0
