"""The node helper's reading of what a run used (hsched/node/cgroupstats.py), on cgroup folders laid out as the
kernel lays them out (v2's cpu.stat and memory.peak, v1's memory.max_usage_in_bytes and cpuacct.usage), and
the bundle that ships it to nodes beside the helper."""

from __future__ import annotations

import json
from pathlib import Path

from hsched.executors.ssh import helper_bundle

from hsched.node import cgroupstats

V2_CPU_STAT = "usage_usec 12500000\nuser_usec 12000000\nsystem_usec 500000\nnice_usec 0\n"


def _files(folder: Path, **files: str) -> str:
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name.replace("__", ".")).write_text(text)
    return str(folder)


def test_a_v2_cgroup_gives_cpu_time_and_peak(tmp_path: Path) -> None:
    v2 = _files(tmp_path / "v2", cpu__stat=V2_CPU_STAT, memory__peak=str(300 << 20), memory__current=str(200 << 20))
    assert cgroupstats.from_cgroups({"v2": v2}) == {"cpu_s": 12.5, "memory_peak_mib": 300.0, "memory_mib": 200.0,
                                                     "source": "cgroup"}


def test_a_hybrid_machine_reads_cpu_from_v2_and_memory_from_v1(tmp_path: Path) -> None:
    # v2 without the memory controller (this very kind of machine: controllers bound to v1)
    v2 = _files(tmp_path / "v2", cpu__stat=V2_CPU_STAT)
    mem = _files(tmp_path / "mem", memory__max_usage_in_bytes=str(512 << 20), memory__usage_in_bytes="0")
    got = cgroupstats.from_cgroups({"v2": v2, "memory": mem})
    assert got == {"cpu_s": 12.5, "memory_peak_mib": 512.0, "memory_mib": 0.0, "source": "cgroup"}
    # v1 alone: cpuacct beside cpu
    cpu = _files(tmp_path / "cpu", cpuacct__usage=str(3 * 10**9))
    assert cgroupstats.from_cgroups({"memory": mem, "cpu": cpu})["cpu_s"] == 3.0  # type: ignore[index]
    assert cgroupstats.from_cgroups({"v2": str(tmp_path / "gone")}) is None
    assert cgroupstats.from_cgroups({}) is None


def test_the_sampler_keeps_a_peak_where_the_kernel_keeps_none(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    _files(v2, cpu__stat=V2_CPU_STAT, memory__current=str(100 << 20))  # Linux < 5.19: no memory.peak
    run = tmp_path / "1-1-r0-5"
    run.mkdir()
    (run / "handle.json").write_text(json.dumps({"pid": 1, "cgroups": {"v2": str(v2)}}))
    s = cgroupstats.Sampler(0.5)
    (first,) = s.read([str(run)])
    (v2 / "memory.current").write_text(str(40 << 20))
    (second,) = s.read([str(run)])
    assert (first["memory_peak_mib"], second["memory_peak_mib"], second["memory_mib"]) == (100.0, 100.0, 40.0)
    assert second["run_dir"] == str(run) and second["source"] == "cgroup"
    assert s.read([str(tmp_path / "no-handle-yet")]) == []
    s.read([])  # the run is no longer active: forgotten
    assert s.handles == {} and s.peaks == {}


def test_an_exit_records_reading_is_passed_on_as_numbers_only() -> None:
    assert cgroupstats.clean({"cpu_s": 1.5, "memory_peak_mib": True, "memory_mib": "x", "t": -1, "source": "rm -rf",
                              "final": True}) == {"cpu_s": 1.5, "memory_peak_mib": None, "memory_mib": None,
                                                  "t": None, "source": None, "final": True}
    assert cgroupstats.clean("garbage") is None and cgroupstats.clean(None) is None


def test_the_bundle_ships_the_reader_beside_the_helper() -> None:
    files = dict(helper_bundle().files)
    src = Path(cgroupstats.__file__).read_bytes()
    assert files["cgroupstats.py"] == src
    names = [n for n, _ in helper_bundle().files]
    assert names.index("cgroupstats.py") < names.index("nodehelper.py")  # the helper last: its presence means complete
