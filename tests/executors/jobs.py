"""Small job scripts the executor tests run (the containment and the conformance tests share them)."""

TRAINER = """
import signal, sys, time
def save(signum, frame):
    print("saving", flush=True)
    time.sleep(0.5)  # the shell in front of us is long dead by now
    sys.exit(85)
signal.signal(signal.SIGUSR1, save)
print("ready", flush=True)
while True:
    time.sleep(1)
"""
"""A trainer that saves on SIGUSR1 and exits 85, even when the shell in front of it died of the signal."""

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
