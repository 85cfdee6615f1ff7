"""An elastic job's size range: `--gpus 2-8`, `--nodes 2-4`, `gpus = "2-8"` in a spec file, `#SBATCH --nodes=2-4`.

    size_range("4", "--gpus")     -> (4, None)        a rigid request
    size_range("2-8", "--gpus")   -> (2, 8)           elastic: at least 2, at most 8
    size_range("8-2", "--gpus")   -> ValueError("--gpus '8-2': MAX 2 is below MIN 8; write 2-8")

The job asks its MIN (`Resources.gpus`/`nodes`); the MAX is `Resources.gpus_max`/`nodes_max` (None: rigid). Pure.
"""

from __future__ import annotations


def size_range(text: object, what: str, *, minimum: int = 0) -> tuple[int, int | None]:
    """(MIN, MAX or None) from `N`, `MIN-MAX` (an int is N); ValueError with one line naming `what` and the fix."""
    if isinstance(text, bool):
        raise ValueError(f"{what} {text!r}: expected a count N or a range MIN-MAX such as 2-8")
    if isinstance(text, int):
        if text < minimum:
            raise ValueError(f"{what} {text}: expected at least {minimum}")
        return text, None
    raw = str(text).strip()
    lo_s, sep, hi_s = raw.partition("-")
    if not lo_s.strip().isdigit() or (sep and not hi_s.strip().isdigit()):
        raise ValueError(f"{what} {raw!r}: expected a count N or a range MIN-MAX such as 2-8")
    lo = int(lo_s)
    if lo < minimum:
        raise ValueError(f"{what} {raw!r}: expected at least {minimum}")
    if not sep:
        return lo, None
    hi = int(hi_s)
    if lo == 0 or hi == 0:
        raise ValueError(f"{what} {raw!r}: an elastic range starts at 1 or more; write 1-{max(hi, 1)}")
    if hi < lo:
        raise ValueError(f"{what} {raw!r}: MAX {hi} is below MIN {lo}; write {hi}-{lo}")
    return lo, (hi if hi > lo else None)


def per_node(lo: int, hi: int | None, nodes: int, what: str) -> tuple[int, int | None]:
    """sbatch's `--gpus` is the job's total; hsched's request is per node: both ends divided by `nodes`."""
    for v in (lo, hi):
        if v is not None and v % nodes:
            raise ValueError(f"{what} {lo}{'' if hi is None else f'-{hi}'}: not a multiple of --nodes {nodes}; "
                             "give --gpus-per-node instead")
    return lo // nodes, None if hi is None else hi // nodes
