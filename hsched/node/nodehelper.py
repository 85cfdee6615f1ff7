#!/usr/bin/env python3
"""hsched's node helper as a node runs it: `python3 nodehelper.py [--confine ROOT [--min-uid N]] COMMAND`, the
request as JSON on stdin and the reply as JSON on stdout (the commands: main.py).

This folder is the whole helper, and it is what the controller ships to a node as one bundle (executors/ssh.py
`helper_bundle`) or installs there (`hsched node helper-script`). A node has no hsched package, and a launcher
that isolates Python from its environment (`-E -s`) puts nothing of ours on sys.path but this script's folder,
so the script loads its folder by path as a package of its own name and runs that package's main. Here, as
`python -m hsched.node.nodehelper`, it is hsched.node's.
"""

import os
import sys

PACKAGE = "hsched_node"
"""The name this folder's modules have in a helper run as a script (they import one another relatively)."""


def _package_main():
    import importlib
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(PACKAGE, os.path.join(here, "__init__.py"),
                                                  submodule_search_locations=[here])
    package = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = package
    spec.loader.exec_module(package)
    return importlib.import_module(PACKAGE + ".main").main


if __name__ == "__main__":
    if __package__:
        from .main import main
    else:
        main = _package_main()
    sys.exit(main(sys.argv))
