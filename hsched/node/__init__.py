"""hsched's node helper: probe a machine, launch contained runs, report on them and signal them, move
checkpoints and datasets. Standard library only and Python >= 3.8: the controller runs this folder on every node
(a subprocess here, over SSH elsewhere; `nodehelper.py` is the script), so nothing but python3 needs to be
installed there. The executors (hsched/executors) import its public names in-process too.

    nodehelper.py  the script a node runs              main.py       the commands, one-shot and `serve`
    version.py     the protocol's number               confine.py    --confine: what a lab's helper may touch
    records.py     durable JSON records of a run       libc.py       prctl and renameat2 through ctypes
    procfs.py      processes as /proc shows them       children.py   the helper's own children, time-limited
    probe.py       machine facts and GPU discovery     cgroups.py    a run's cgroups
    processes.py   a run's processes, and ending them  owners.py     lab mode: the accounts runs start as
    launch.py      `launch`                            wrap.py       the wrapper that owns a run
    outputs.py     output.log and sbatch's -o/-e       gpucheck.py   GPU out-of-memory and GPU holders
    mps.py         CUDA MPS for shared GPUs            status.py     `status`
    signals.py     `signal` and signals.log            files.py      `read`, `newest`, checkpoint transfer
    watch.py       the monitoring stream               usage.py      the processes on the GPUs
    samplers.py    which GPU sampler a watch uses      nvmlsampler.py, smisampler.py  the samplers
    progress.py    runs' progress reports              safefiles.py  copies as data only (also the controller's)
    datapaths.py   dataset paths, no link followed     dataread.py, datawrite.py  the dataset requests
    cgroupstats.py a run's CPU time and memory peak, from its cgroup (hsched eff)
    amd.py         AMD GPUs: amd-smi, rocm-smi             plugin.py     a node's discovery plugin, run
    amdprocs.py    the processes on AMD GPUs (amd-smi process, rocm-smi --showpids)

This file imports nothing: callers import the modules they use (hsched.node.records, hsched.node.main, ...).
"""
