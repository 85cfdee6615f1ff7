"""Executors: how the controller probes nodes and runs jobs on them (installed as hsched.executors)."""
