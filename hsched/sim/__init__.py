"""The trace-driven discrete-event simulator and trace loaders."""
