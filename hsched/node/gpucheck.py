"""What the wrapper checks about GPUs when a run ends: whether its log says a GPU ran out of memory, and which
processes still hold its GPUs (nvidia-smi; on AMD GPUs amd-smi or rocm-smi, amdprocs.py)."""

import os
import shutil

from .amd import probe_amd
from .amdprocs import amd_gpu_processes
from .children import run_bounded

GPU_CHECK_TIMEOUT_S = 10.0


# what CUDA, PyTorch, TensorFlow and JAX print when a GPU runs out of memory
GPU_OOM_PATTERNS = ("CUDA out of memory", "CUDA error: out of memory", "OutOfMemoryError", "CUDA_ERROR_OUT_OF_MEMORY",
                    "cudaErrorMemoryAllocation", "RESOURCE_EXHAUSTED: Out of memory",
                    "HIP out of memory", "hipErrorOutOfMemory")
GPU_OOM_TAIL = 64 * 1024


def gpu_oom_line(path):
    """The last line of the log's tail that says a GPU ran out of memory, or None. Read without following a
    link (a lab user's log is theirs)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - GPU_OOM_TAIL), os.SEEK_SET)
        tail = os.read(fd, GPU_OOM_TAIL).decode("utf-8", "replace")
    finally:
        os.close(fd)
    for line in reversed(tail.splitlines()):
        low = line.lower()
        if any(p.lower() in low for p in GPU_OOM_PATTERNS) and ("memory" in low or "allocate" in low):
            return line.strip()[:300]
    return None


_COMPUTE_APPS = "--query-compute-apps=gpu_uuid,pid,process_name,used_memory"


def parse_compute_apps(text):
    """[{uuid, pid, name, used_memory_mib}] from `nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,
    used_memory --format=csv,noheader,nounits` (a process name may hold commas: it is what lies between)."""
    out = []
    for line in text.splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) < 3 or not f[1].isdigit():
            continue  # "No running processes found" and the like
        name = ",".join(f[2:-1]).strip() if len(f) >= 4 else f[2]
        try:
            used = int(float(f[-1])) if len(f) >= 4 else None
        except ValueError:
            used = None  # "[N/A]"
        out.append({"uuid": f[0], "pid": int(f[1]), "name": name, "used_memory_mib": used})
    return out


def gpu_holders(devices, timeout_s=GPU_CHECK_TIMEOUT_S):
    """The processes that hold any of `devices` (GPU UUIDs) now, and why the check failed if it did."""
    if not devices:
        return [], None
    if all(str(d).startswith("AMD-") for d in devices):
        return _amd_holders(devices, timeout_s)
    exe = shutil.which("nvidia-smi")
    if not exe:
        return [], None
    r = run_bounded([exe, _COMPUTE_APPS, "--format=csv,noheader,nounits"], timeout_s, "nvidia-smi",
                    new_session=False)
    if r["error"] is not None:
        return [], r["error"]
    if r["rc"] != 0:
        return [], "nvidia-smi failed (exit status %s): %s" % (r["rc"], r["err"] or "no output")
    wanted = set(devices)
    apps = parse_compute_apps(r["out"].decode("utf-8", "replace"))
    return [{"uuid": a["uuid"], "pid": a["pid"], "name": a["name"]} for a in apps if a["uuid"] in wanted], None


def _amd_holders(devices, timeout_s):
    """gpu_holders for hsched/node/amd.py's devices: the tool's GPU indices mapped to UUIDs by the same probe
    that named them."""
    found = probe_amd(timeout_s, topology=False)
    if found is None or not found["devices"]:
        return [], "the GPU process check found no AMD GPU: %s" % ((found or {}).get("error") or "no amd-smi/rocm-smi")
    procs, error = amd_gpu_processes(found["devices"], timeout_s)
    if procs is None:
        return [], "the GPU process check is unavailable here: %s" % error
    wanted = set(devices)
    return [{"uuid": p["uuid"], "pid": p["pid"], "name": p["name"]} for p in procs if p["uuid"] in wanted], None
