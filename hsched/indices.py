"""Job array task indices as squeue writes them: pure, standard library only, so that a listing imports them without
hsched.model (its dataclasses were ~30 ms of `hsched queue`'s start with an array pending)."""

from __future__ import annotations

from collections.abc import Sequence


def compress_indices(indices: Sequence[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8' (squeue's way of listing array tasks)."""
    out: list[str] = []
    ordered = sorted(set(indices))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def pending_label(array_id: int, tasks: Sequence[int], max_running: int | None) -> str:
    """'12_[3-99%8]': an array's pending tasks in one queue row, as squeue shows them."""
    return f"{array_id}_[{compress_indices(tasks)}{f'%{max_running}' if max_running else ''}]"
