"""Policies by name: the built-in ones, and any a caller registers.

The list is explicit rather than filled by import side effects: the policy modules import the contract
(hsched.sched.policy) and this module imports them, so nothing imports back up.
"""

from __future__ import annotations

from collections.abc import Callable

from hsched.sched.hsched_policy import Hsched
from hsched.sched.policies import (
    Backfill,
    Fifo,
    FifoHetero,
    FinishTimeFairness,
    Las,
    LasHetero,
    SrtfOracle,
)
from hsched.sched.policy import AnyPolicy, OraclePolicy, Policy

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
