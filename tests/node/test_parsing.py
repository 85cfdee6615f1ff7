"""The node helper's readings of the kernel's and nvidia-smi's texts, on layouts this machine does not have."""

from __future__ import annotations

import pytest

from hsched.node import cgroups, gpucheck

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_SELF = """\
9:name=systemd:/
4:memory:/process_api/d45516e3
1:cpu:/
0::/
"""

SYSTEMD_V1 = """\
25 24 0:23 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
26 24 0:24 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
"""
SYSTEMD_V1_SELF = """\
4:cpu,cpuacct:/user.slice
3:memory:/user.slice/user-1000.slice/session-2.scope
"""

PURE_V2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec - cgroup2 cgroup2 rw,nsdelegate\n"
PURE_V2_SELF = "0::/user.slice/user-1000.slice/session-3.scope\n"

# a container without a cgroup namespace: only its own part of the hierarchy is mounted, at /sys/fs/cgroup
CONTAINER = "700 690 0:26 /docker/abc /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n"


@pytest.mark.parametrize(("mountinfo", "own", "want"), [
    (HYBRID, HYBRID_SELF, {
        "v2": {"mount": "/sys/fs/cgroup/unified", "own": "/sys/fs/cgroup/unified"},
        "memory": {"mount": "/sys/fs/cgroup/memory", "own": "/sys/fs/cgroup/memory/process_api/d45516e3"},
        "cpu": {"mount": "/sys/fs/cgroup/cpu", "own": "/sys/fs/cgroup/cpu"}}),
    (SYSTEMD_V1, SYSTEMD_V1_SELF, {
        "cpu": {"mount": "/sys/fs/cgroup/cpu,cpuacct", "own": "/sys/fs/cgroup/cpu,cpuacct/user.slice"},
        "memory": {"mount": "/sys/fs/cgroup/memory",
                   "own": "/sys/fs/cgroup/memory/user.slice/user-1000.slice/session-2.scope"}}),
    (PURE_V2, PURE_V2_SELF, {
        "v2": {"mount": "/sys/fs/cgroup", "own": "/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope"}}),
    (CONTAINER, "0::/docker/abc/app\n", {"v2": {"mount": "/sys/fs/cgroup", "own": "/sys/fs/cgroup/app"}}),
    (CONTAINER, "0::/elsewhere\n", {}),  # our cgroup is not in the part mounted here
    ("41 31 0:38 / /mnt/cg\\040v2 rw - cgroup2 cgroup2 rw\n", "0::/a b\n",
     {"v2": {"mount": "/mnt/cg v2", "own": "/mnt/cg v2/a b"}}),
    ("", "", {}),
])
def test_cgroup_places(mountinfo: str, own: str, want: dict) -> None:
    assert cgroups.cgroup_places(mountinfo, own) == want


def test_compute_apps_in_nvidia_smis_csv() -> None:
    text = ("GPU-1b7a3e2c-5f0d-4c6b-9a8e-2d1f0c3b4a59, 4242, /usr/bin/python3, 1024\n"
            "GPU-1b7a3e2c-5f0d-4c6b-9a8e-2d1f0c3b4a59, 4243, /opt/my app/serve,v2, [N/A]\n"
            "No running processes found\n"
            "\n")
    assert gpucheck.parse_compute_apps(text) == [
        {"uuid": "GPU-1b7a3e2c-5f0d-4c6b-9a8e-2d1f0c3b4a59", "pid": 4242, "name": "/usr/bin/python3",
         "used_memory_mib": 1024},
        {"uuid": "GPU-1b7a3e2c-5f0d-4c6b-9a8e-2d1f0c3b4a59", "pid": 4243, "name": "/opt/my app/serve,v2",
         "used_memory_mib": None},
    ]
