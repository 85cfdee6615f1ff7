"""Topology: parsers for real tool output, the topology graph, and device placement (pure code)."""
