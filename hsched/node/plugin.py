"""A node's discovery plugin (the fleet file's `discover = "/path"`): run in the probe instead of the GPU tools,
with the same hard time limit; its stdout goes to the controller as printed, which validates it
(hsched/topo/plugin.py), so one reading of the schema serves every node. Standard library only (Python 3.8)."""

import os

from .children import run_bounded

PLUGIN_OUTPUT_MAX = 1 << 20
"""More than this much output is not a device list."""


def run_plugin(path, timeout_s):
    """{"source": "plugin", "plugin": path, "output": its stdout} or {"source": None, "devices": [], "error": one
    line naming the plugin and what went wrong}."""
    what = "discovery plugin %s" % path

    def failed(why):
        return {"source": None, "devices": [], "plugin": path, "error": "%s: %s" % (what, why)}

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
