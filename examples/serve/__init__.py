"""The inference stand-in replica (standin.py) for `hsched serve` tests and benchmarks."""
