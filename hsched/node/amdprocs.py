"""The processes on AMD GPUs, for the after-run check (gpucheck.py) and the watch (samplers.py): `amd-smi process`
(text), else `rocm-smi --showpids`. Standard library only (Python 3.8).

Forms read, each from a published capture (tests/fixtures/amdprocs/): `amd-smi process` text (a "GPU: n" block
per GPU, a PROCESS_INFO entry per process with NAME, PID and MEMORY_USAGE/VRAM_MEM) and `rocm-smi --showpids`
(a table whose GPU(s) column is how MANY GPUs a process uses, not which: ROCm/rocm_smi_lib#166). No capture of
`amd-smi process --json` in its per-GPU form or of `rocm-smi --showpidgpus` was found, so neither is asked for:
a parser written from a guess of their layout would say "no process" whenever the guess is wrong.

rocm-smi places a process only where its count says it all the same: a process on as many GPUs as the node has is
on every one of them, one on none is on none. Any other row leaves the list unknown, and that is said, never
guessed (the controller takes a listed GPU without processes as free of foreign ones)."""

import re

from .amd import _known, _run

# "1.9 GB": amd-smi prints sizes in binary units under decimal names (191.7 GB is an MI300X's 192 GiB)
_SCALE_MIB = {"B": 1.0 / (1 << 20), "KB": 1.0 / 1024, "MB": 1.0, "GB": 1024.0, "TB": 1024.0 * 1024,
              "KIB": 1.0 / 1024, "MIB": 1.0, "GIB": 1024.0, "TIB": 1024.0 * 1024}


def _size_mib(text):
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B)\s*$", text or "", re.I)
    if not m:
        return None
    return int(round(float(m.group(1)) * _SCALE_MIB[m.group(2).upper()]))  # noqa: RUF046 (3.8: round of a float)


def parse_amd_smi_process(text):
    """[{index, pid, name, used_memory_mib}] from `amd-smi process` text. A GPU block without a PID line (no
    process there) adds nothing; a name of N/A is None."""
    out = []
    for block in re.split(r"(?m)^GPU:\s*", text or "")[1:]:
        m = re.match(r"(\d+)", block)
        if not m:
            continue
        index = int(m.group(1))
        # each process's entry starts at its NAME line (PROCESS_INFO: NAME, PID, MEMORY_USAGE ...)
        for entry in re.split(r"(?m)^(?=\s+NAME:)", block)[1:]:
            pid = re.search(r"(?m)^\s+PID:\s*(\d+)\s*$", entry)
            if not pid:
                continue
            name = re.search(r"(?m)^\s+NAME:\s*(.*?)\s*$", entry)
            vram = re.search(r"(?m)^\s+VRAM_MEM:\s*(.*?)\s*$", entry)
            out.append({"index": index, "pid": int(pid.group(1)), "name": _known(name.group(1)) if name else None,
                        "used_memory_mib": _size_mib(vram.group(1)) if vram else None})
    return out


_SHOWPIDS_ROW = re.compile(r"^(\d+)\s+(.+?)\s+(\d+)\s+(\d+|UNKNOWN|N/A)\s+\S+\s+\S+\s*$")


def parse_rocm_showpids(text):
    """[{pid, name, gpu_count, used_memory_mib}] from `rocm-smi --showpids`: the rows under its "PID PROCESS
    NAME GPU(s) ..." header; VRAM USED is bytes (UNKNOWN where the release cannot say: None)."""
    out = []
    rows = False
    for line in (text or "").splitlines():
        if re.match(r"^\s*PID\s+PROCESS NAME\s+GPU", line):
            rows = True
            continue
        if not rows:
            continue
        if line.startswith("="):
            break
        f = [x.strip() for x in line.split("\t")] if "\t" in line else None
        if f is not None and len(f) >= 4 and f[0].isdigit() and f[2].isdigit():
            pid, name, count, vram = f[0], f[1], f[2], f[3]
        else:
            m = _SHOWPIDS_ROW.match(line.strip())
            if not m:
                continue
            pid, name, count, vram = m.groups()
        out.append({"pid": int(pid), "name": name or None, "gpu_count": int(count),
                    "used_memory_mib": int(vram) // (1 << 20) if vram.isdigit() else None})
    return out


def amd_gpu_processes(devices, timeout_s):
    """([{uuid, pid, name, used_memory_mib}], None) for the node's AMD `devices` (the probe's dicts: index, uuid),
    a process on two GPUs listed once per GPU as nvidia-smi does; or (None, why) where the tools cannot say."""
    by_index = dict((d["index"], d["uuid"]) for d in devices)
    text = _run(["amd-smi", "process"], timeout_s)
    if text is not None:
        procs = []
        for p in parse_amd_smi_process(text):
            uuid = by_index.get(p["index"])
            if uuid is None:
                return None, "amd-smi process names GPU %d, which amd-smi static does not list" % p["index"]
            procs.append({"uuid": uuid, "pid": p["pid"], "name": p["name"], "used_memory_mib": p["used_memory_mib"]})
        return procs, None
    text = _run(["rocm-smi", "--showpids"], timeout_s)
    if text is None:
        return None, "neither `amd-smi process` nor `rocm-smi --showpids` answered: GPU processes are not listed"
    procs = []
    for p in parse_rocm_showpids(text):
        if p["gpu_count"] == 0:
            continue  # a KFD client on no GPU (rocm-smi lists every process that opened /dev/kfd)
        if p["gpu_count"] != len(devices):
            return None, ("rocm-smi --showpids says pid %d uses %d of the %d GPUs but not which "
                          "(install amd-smi to have GPU processes listed)" % (p["pid"], p["gpu_count"], len(devices)))
        procs.extend({"uuid": d["uuid"], "pid": p["pid"], "name": p["name"], "used_memory_mib": None}
                     for d in devices)  # its VRAM figure is over all of them
    return procs, None
