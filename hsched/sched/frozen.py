"""Frozen slotted dataclasses made without their generated __init__, for the few a replay makes every round or every
start (`Start`, `RoundDecision`, `PolicyInput`, `Plan`): a frozen dataclass's __init__ sets each field through
`object.__setattr__`, a lookup of the field on the class each time; the slot's own descriptor sets it directly, in
about half the time (a `Start`: 0.27 us against 0.48 us). These __init__ calls were ~4 % of py-spy's samples of an
ed69ec 8:8:8 las-hetero replay.

Only for classes with no __post_init__ and no field made by a default factory the caller leaves out: the maker
takes every field's value, in order."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any


def slot_setters(cls: type, *names: str) -> tuple[Callable[[Any, Any], None], ...]:
    """The setters of `cls`'s slots `names`, which must be all its dataclass fields, in order (checked here, at import:
    a field added to the class fails the import, not a round) on a slotted class without __post_init__."""
    have = tuple(f.name for f in fields(cls))
    if have != names or not hasattr(cls, "__slots__") or hasattr(cls, "__post_init__"):
        raise RuntimeError(f"{cls.__name__}: fields {have}, expected {names} on a slotted class without __post_init__")
    return tuple(cls.__dict__[n].__set__ for n in names)
