"""The fault matrix (issue 12): controller kills, host loss, partitions, reboots, hung probes, PID reuse, torn exit
records, leftovers, retries, socket abuse and a randomized fault history, each ending with the global invariants
(tests/faults/invariants.py). Everything here is slow (real sshd hosts, controllers and runs)."""
