"""Example fleets, job specs and checkpointing trainers (installed as hsched.examples)."""
