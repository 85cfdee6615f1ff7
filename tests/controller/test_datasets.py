"""Datasets live (issue 15, items 1 and 2), in-process on a fake clock with fake nodes whose data ops touch real files:
a job goes to the node holding its data when that node frees within the modelled copy time, elsewhere with a copy
when not; a queued job's data is prefetched to where it will start; copies are byte-identical, recorded, and evicted
under a node's quota."""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace
from pathlib import Path

import pytest

from hsched.config import Settings
from hsched.controller import data
from hsched.datasets import Dataset, PlaceState
from hsched.model import JobState
from hsched.testing import CannedNode, Lab

A100 = "NVIDIA A100-SXM4-80GB"
ONE_GPU_NODES = (CannedNode("a", A100, 1), CannedNode("b", A100, 1))
GIB = 1 << 30

# 5 GiB declared at 100 Mbit/s: a modelled copy of 5 * 2**30 / 12.5e6 = 429.5 s
SETTINGS = Settings(data_link_mbps=100.0, prefetch_horizon_s=900.0)
COPY_S = 5 * GIB / 12.5e6


def make_dataset(root: Path) -> Path:
    """A small real tree (the declared size is what placement models; the bytes are what is copied)."""
    src = root / "a-disk" / "imagenet"
    (src / "train" / "n01").mkdir(parents=True)
    (src / "train" / "n01" / "x.bin").write_bytes(os.urandom(300_000))
    (src / "labels.txt").write_text("cat\ndog\n")
    (src / "empty").write_bytes(b"")
    return src


def tree_hash(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def exists(path: str) -> bool:
    return os.path.lexists(path)


def imagenet(src: Path) -> Dataset:
    return Dataset(name="imagenet", paths={"a": str(src)}, size_bytes=5 * GIB)


async def kinds(lab: Lab, job_id: int) -> list[str]:
    return [k for k in await lab.events(job_id) if k in ("data_copy", "data_copied", "started")]


async def test_waits_for_the_holder_that_frees_before_a_copy_would_end(tmp_path: Path) -> None:
    src = make_dataset(tmp_path)
    async with Lab.open(tmp_path, nodes=ONE_GPU_NODES, settings=SETTINGS, datasets=[imagenet(src)]) as lab:
        blocker = await lab.submit("sleep", time_limit_s=300)  # a frees in 300 s < 429.5 s of copy
        await lab.round()
        assert [p.node for p in (await lab.job(blocker.id)).placement] == ["a"]
        job = await lab.submit("train", data=["imagenet"])
        await lab.round()
        waiting = await lab.job(job.id)
        assert waiting.state is JobState.PENDING
        assert waiting.reason.startswith("Data (waiting for a, which holds imagenet: free in ~5 min")
        assert "a copy would take ~7 min" in waiting.reason
        await lab.advance(300)
        await lab.finish(blocker.id)
        await lab.round()
        await lab.round()
        started = await lab.job(job.id)
        assert started.state is JobState.RUNNING
        assert [p.node for p in started.placement] == ["a"]
        assert "data_copy" not in await lab.events(job.id)
        env = (await lab.fake_runs(job.id))[0].request.env
        assert env["HSCHED_DATA_IMAGENET"] == str(src)


async def test_goes_elsewhere_with_a_copy_when_the_holder_frees_later(tmp_path: Path) -> None:
    src = make_dataset(tmp_path)
    async with Lab.open(tmp_path, nodes=ONE_GPU_NODES, settings=SETTINGS, datasets=[imagenet(src)]) as lab:
        blocker = await lab.submit("sleep", time_limit_s=7200)  # a frees in 2 h > 429.5 s of copy
        await lab.round()
        job = await lab.submit("train", data=["imagenet"])
        await lab.round()
        started = await lab.job(job.id)
        assert started.state is JobState.RUNNING, started.reason
        assert [p.node for p in started.placement] == ["b"]
        assert await kinds(lab, job.id) == ["data_copy", "data_copied", "started"]
        env = (await lab.fake_runs(job.id))[0].request.env
        copied = Path(env["HSCHED_DATA_IMAGENET"])
        assert copied != src and copied.name == "imagenet"
        assert tree_hash(copied) == tree_hash(src)
        assert not exists(str(copied) + ".partial")
        # the copy is a place now: the next job naming it on b needs none, and the listing says so
        place = data.state(lab.ctl).places[("imagenet", "b")]
        assert place.state is PlaceState.READY and place.bytes == 300_000 + len("cat\ndog\n")
        listing = await data.listing(lab.ctl)
        assert {w["node"]: w["origin"] for w in listing[0]["where"]} == {"a": "declared", "b": "copy"}
        # and the metrics count it (hsched_data_copies_total{outcome="copied"}, hsched_data_copied_bytes_total)
        from hsched.controller.metrics import render

        text = render(lab.ctl, None).decode()
        assert 'hsched_data_copies_total{outcome="copied"} 1.0' in text
        assert "hsched_data_copied_bytes_total 300008.0" in text
        assert blocker.id != job.id


async def test_prefetch_puts_the_data_where_the_job_will_start_before_it_starts(tmp_path: Path) -> None:
    src = make_dataset(tmp_path)
    async with Lab.open(tmp_path, nodes=ONE_GPU_NODES, settings=SETTINGS, datasets=[imagenet(src)]) as lab:
        on_a = await lab.submit("sleep", time_limit_s=7200)
        on_b = await lab.submit("sleep", time_limit_s=600)  # b frees in 10 min: within the horizon
        await lab.round()
        assert {p.node for j in (on_a, on_b) for p in (await lab.job(j.id)).placement} == {"a", "b"}
        job = await lab.submit("train", data=["imagenet"])
        await lab.round()  # nothing free: it waits, and its data goes to b meanwhile
        assert (await lab.job(job.id)).state is JobState.PENDING
        assert await kinds(lab, job.id) == ["data_copy", "data_copied"]
        copy = next(e for e in await lab.ctl.db(lab.ctl.store.events, job.id) if e["kind"] == "data_copy")
        assert "(prefetch)" in copy["message"]
        await lab.advance(600)
        await lab.finish(on_b.id)
        await lab.round()
        await lab.round()
        started = await lab.job(job.id)
        assert started.state is JobState.RUNNING and [p.node for p in started.placement] == ["b"]
        # the event order proves it: copied, then started; and no second copy at the start
        assert await kinds(lab, job.id) == ["data_copy", "data_copied", "started"]


async def test_prefetch_off_copies_at_the_start(tmp_path: Path) -> None:
    src = make_dataset(tmp_path)
    settings = replace(SETTINGS, prefetch=False)
    async with Lab.open(tmp_path, nodes=ONE_GPU_NODES, settings=settings, datasets=[imagenet(src)]) as lab:
        await lab.submit("sleep", time_limit_s=7200)
        on_b = await lab.submit("sleep", time_limit_s=600)
        await lab.round()
        job = await lab.submit("train", data=["imagenet"])
        await lab.round()
        assert await kinds(lab, job.id) == []
        await lab.advance(600)
        await lab.finish(on_b.id)
        await lab.round()
        await lab.round()
        assert await kinds(lab, job.id) == ["data_copy", "data_copied", "started"]


async def test_a_dataset_on_no_node_that_is_up_waits_with_a_reason(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=ONE_GPU_NODES, settings=SETTINGS,
                        datasets=[Dataset(name="coco", path="/nowhere/coco")]) as lab:
        job = await lab.submit("train", data=["coco"])
        await lab.round()
        waiting = await lab.job(job.id)
        assert waiting.state is JobState.PENDING
        assert waiting.reason == "Data (coco is on no node that is up; `hsched data scan` looks for it)"


async def test_scan_finds_the_declared_paths(tmp_path: Path) -> None:
    src = make_dataset(tmp_path)
    ds = Dataset(name="imagenet", path=str(src))  # declared path, holders unknown: the scan finds them
    async with Lab.open(tmp_path, nodes=ONE_GPU_NODES, settings=SETTINGS, datasets=[ds]) as lab:
        found = await data.scan(lab.ctl)
        # the fake nodes share this machine's disk: both see the path
        assert {(f["node"], f["present"], f["bytes"]) for f in found} == {
            ("a", True, 300_008), ("b", True, 300_008)}
        job = await lab.submit("train", data=["imagenet"])
        await lab.round()
        assert (await lab.job(job.id)).state is JobState.RUNNING
        assert "data_copy" not in await lab.events(job.id)


async def test_quota_evicts_the_least_recently_used_copy(tmp_path: Path) -> None:
    src = make_dataset(tmp_path)
    other = tmp_path / "a-disk" / "coco"
    other.mkdir(parents=True)
    (other / "c.bin").write_bytes(os.urandom(200_000))
    nodes = (CannedNode("a", A100, 1), CannedNode("b", A100, 1))
    sets = [Dataset(name="imagenet", paths={"a": str(src)}), Dataset(name="coco", paths={"a": str(other)})]
    async with Lab.open(tmp_path, nodes=nodes, settings=SETTINGS, datasets=sets) as lab:
        b = lab.ctl.nodes["b"]
        # at most 400 kB of copies on b: imagenet (300 kB) must go before coco (200 kB) comes
        b.config = replace(b.config, data_quota_bytes=400_000)
        await data.copy(lab.ctl, sets[0], "b", job_id=None, why="start")
        place = await data.copy(lab.ctl, sets[1], "b", job_id=None, why="start")
        assert place.state is PlaceState.READY
        assert ("imagenet", "b") not in data.state(lab.ctl).places
        assert not exists(str(Path(data.state(lab.ctl).places[("coco", "b")].path).with_name("imagenet")))
        kinds_ = [e["kind"] for e in await lab.ctl.db(lab.ctl.store.events)]
        assert "data_evicted" in kinds_


@pytest.mark.parametrize("bad", [["zzz"], ["imagenet", "zzz"]])
async def test_submit_refuses_an_undeclared_dataset(tmp_path: Path, bad: list[str]) -> None:
    from hsched.controller.api import Api
    from hsched.errors import UserError

    src = make_dataset(tmp_path)
    async with Lab.open(tmp_path, nodes=ONE_GPU_NODES, settings=SETTINGS, datasets=[imagenet(src)]) as lab:
        with pytest.raises(UserError, match="data: no dataset 'zzz' in the fleet file"):
            await Api(lab.ctl).op_submit({"spec": {"command": ["true"], "data": bad}}, os.getuid())


async def test_a_confined_helper_gets_its_copies_under_its_data_folder(tmp_path: Path) -> None:
    """A service account's helper writes datasets only under ROOT/data (its `data_root` answer): the default data_dir
    goes there; any other node's is a `data/<node>` folder of the controller's home as the node sees it."""
    async with Lab.open(tmp_path, nodes=ONE_GPU_NODES, settings=SETTINGS) as lab:
        rt = lab.ctl.nodes["b"]
        ex = lab.executors["b"]
        assert await data.data_dir(lab.ctl, rt) == str(lab.ctl.home.root / "data" / "b")
        plain = ex.data

        async def confined(op: str, req: dict[str, object], *, timeout_s: float = 120.0) -> dict[str, object]:
            return {"root": "/var/lib/hsched-node/data"} if op == "root" else await plain(op, req, timeout_s=timeout_s)

        ex.data = confined  # type: ignore[method-assign,assignment]
        assert await data.data_dir(lab.ctl, rt) == "/var/lib/hsched-node/data/b"
