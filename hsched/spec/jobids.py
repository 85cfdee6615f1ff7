"""Job ids and array task indices as people type them (`12`, `12_3`, `afterok:12`, `--array 0-99`), bounded.

A job id is what the store keeps it as, a SQLite INTEGER: 1 to ID_MAX (2^63-1). A task index is at most
INDEX_MAX, Slurm's own ceiling (MaxArraySize is at most 4,000,001, so indices 0 to 4,000,000). Every parser
of ids checks these bounds as it reads the digits, so that a 20-digit id is one line naming the bound (exit
2), never an OverflowError in the store or a range too long to walk.
"""

from __future__ import annotations

ID_MAX = 2**63 - 1
INDEX_MAX = 4_000_000


def job_id(digits: str, what: str = "a job id") -> int:
    """The job id in `digits` (ASCII digits). ValueError saying what is expected ("a job id from 1 to ..."), for
    the caller to say what was found."""
    n = _number(digits, what, ID_MAX)
    if not 1 <= n <= ID_MAX:
        raise ValueError(f"{what} from 1 to {ID_MAX}")
    return n


def task_index(digits: str, what: str = "an array task index") -> int:
    """The array task index in `digits` (ASCII digits). ValueError naming the range."""
    n = _number(digits, what, INDEX_MAX)
    if n > INDEX_MAX:
        raise ValueError(f"{what} from 0 to {INDEX_MAX}")
    return n


def _number(digits: str, what: str, high: int) -> int:
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError(f"{what} in the digits 0-9")
    # the length first: int() of a huge string is slow (and refused past 4300 digits) before it is too large
    return int(digits) if len(digits) <= 20 else high + 1
