"""Shell completion of job ids, node names and QoS classes (`hsched --install-completion`).

Completion runs on every TAB, so it must be quick and must never start a controller: it reads the store
read-only (SQLite's `mode=ro`), the fleet file and the settings, and on any trouble offers nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hsched.paths import Home


def _home() -> Home:
    from hsched.paths import Home

    return Home.from_env()


def job_ids(incomplete: str) -> list[str]:
    """Ids of the jobs that are not over (with `12_3` for array tasks), newest first."""
    import sqlite3  # here: every command's registration imports this module, only a TAB needs the store

    home = _home()
    try:
        db = sqlite3.connect(f"file:{home.db}?mode=ro", uri=True, timeout=0.5)
        try:
            rows = db.execute(
                "SELECT id, array_id, array_task FROM jobs WHERE state NOT IN "
                "('COMPLETED','FAILED','CANCELLED','TIMEOUT','LOST') ORDER BY id DESC LIMIT 500").fetchall()
        finally:
            db.close()
    except sqlite3.Error:
        return []
    out: list[str] = []
    for job_id, array_id, task in rows:
        out.append(f"{array_id}_{task}" if array_id is not None else str(job_id))
        if array_id is not None and str(array_id) not in out:
            out.append(str(array_id))
    return [i for i in out if i.startswith(incomplete)]


def node_names(incomplete: str) -> list[str]:
    try:
        from hsched.config import load_fleet

        fleet = load_fleet(_home().fleet_file())
    except Exception:  # a broken fleet file must not break the shell's TAB
        return []
    return [n.name for n in fleet.nodes if n.name.startswith(incomplete)]


def qos_names(incomplete: str) -> list[str]:
    try:
        from hsched.config import load_settings

        names = load_settings(_home().settings).qos_names
    except Exception:  # a broken settings file must not break the shell's TAB
        return []
    return [q for q in names if q.startswith(incomplete)]
