"""A node's discovery plugin (the fleet file's `discover = "/path"`): run in the probe instead of the GPU tools,
with the same hard time limit; its stdout goes to the controller as printed, which validates it
(hsched/topo/plugin.py), so one reading of the schema serves every node. Standard library only (Python 3.8)."""

import os
import stat

from . import confine
from .children import run_bounded

CONFINED_PLUGIN_DIR = "/etc/hsched/discover"
"""Under --confine (a service account's helper, root through sudo) a plugin runs only from here: the request
names the path, and the account must not be able to make root run whatever it likes (`/sbin/reboot` takes no
arguments either). The folder, the ones above it and the plugin must be root's and writable by no one else."""

PLUGIN_OUTPUT_MAX = 1 << 20
"""More than this much output is not a device list."""


def run_plugin(path, timeout_s):
    """{"source": "plugin", "plugin": path, "output": its stdout} or {"source": None, "devices": [], "error": one
    line naming the plugin and what went wrong}."""
    what = "discovery plugin %s" % path

    def failed(why):
        return {"source": None, "devices": [], "plugin": path, "error": "%s: %s" % (what, why)}

    if confine.CONFINE is not None:
        why = _confined_problem(path)
        if why is not None:
            return failed(why)
    if not os.path.isabs(path) or not os.path.isfile(path):
        return failed("no such file on this node")
    if not os.access(path, os.X_OK):
        return failed("not executable (chmod +x it)")
    r = run_bounded([path], timeout_s, what)
    if r["error"] is not None:
        return {"source": None, "devices": [], "plugin": path, "error": r["error"]}
    if r["rc"] != 0:
        return failed("exit status %s: %s" % (r["rc"], (r["err"] or "no message").splitlines()[-1][:200]))
    if len(r["out"]) > PLUGIN_OUTPUT_MAX:
        return failed("printed more than %d bytes" % PLUGIN_OUTPUT_MAX)
    return {"source": "plugin", "plugin": path, "output": r["out"].decode("utf-8", "replace"), "devices": []}


def _confined_problem(path):
    """Why a confined helper will not run `path`, or None."""
    p = os.path.normpath(path)
    if not p.startswith(CONFINED_PLUGIN_DIR + "/"):
        return "a confined helper runs discovery plugins only from %s (root's, written by no one else)" % (
            CONFINED_PLUGIN_DIR)
    walked = ""
    for part in p.strip("/").split("/"):
        walked += "/" + part
        try:
            st = os.lstat(walked)
        except OSError as e:
            return "%s: %s" % (walked, e.strerror)
        if stat.S_ISLNK(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            return "%s must be root's, no symbolic link, and writable by no one else" % walked
    return None
