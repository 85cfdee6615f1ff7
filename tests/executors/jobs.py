"""Small job scripts the containment tests run (the trainer is the conformance check's)."""

from __future__ import annotations

from hsched.testing.conformance import TRAINER as TRAINER  # the conformance check's own trainer

RECORDER = """
import os, signal, sys, time
out = sys.argv[1]
def note(signum, frame):
    with open(out, "a") as f:
        f.write(signal.Signals(signum).name + "\\n")
for s in (signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, note)
open(out + ".ready", "w").close()
while True:
    time.sleep(1)
"""
"""Records every SIGUSR1/SIGUSR2 it gets in the file named by its argument; touches FILE.ready when set."""
