"""Policies by name: the built-in ones, and any a caller registers.

The list is explicit rather than filled by import side effects: the policy modules import the contract
(hsched.sched.policies.base) and this module imports them, so nothing imports back up.
"""

from __future__ import annotations

from collections.abc import Callable

from hsched.sched.policies.backfill import Backfill
from hsched.sched.policies.base import AnyPolicy, OraclePolicy, Policy
from hsched.sched.policies.fifo import Fifo, FifoHetero
from hsched.sched.policies.ftf import FinishTimeFairness
from hsched.sched.policies.hsched import Hsched
from hsched.sched.policies.las import Las, LasHetero
from hsched.sched.policies.oracle import SrtfOracle

_REGISTRY: dict[str, Callable[[], AnyPolicy]] = {}


def register(cls: type[Policy] | type[OraclePolicy]) -> type:
    """Add a policy under its `name` (usable as a class decorator). Clairvoyance and the `-oracle` suffix go
    together: a policy that reads remaining times must say so in its name."""
    if cls.clairvoyant != cls.name.endswith("-oracle"):
        raise TypeError(f"policy {cls.name!r}: only policies named '*-oracle' may be clairvoyant")
    _REGISTRY[cls.name] = cls
    return cls


for _builtin in (Hsched, Fifo, FifoHetero, Las, LasHetero, FinishTimeFairness, SrtfOracle, Backfill):
    register(_builtin)


def policy_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def make_policy(name: str) -> AnyPolicy:
    """A fresh policy by name; KeyError lists the known names."""
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(_REGISTRY)}") from None
