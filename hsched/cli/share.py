"""`hsched share`: fair share by user, as sshare shows it (account, shares, usage, the fair-share factor)."""

from __future__ import annotations

from typing import Any

import typer

from hsched.cli._common import handle_errors, print_json


def _hours(h: float) -> str:
    return f"{h:.2f}"


def render_share(reply: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(box=None, header_style="bold", pad_edge=False)
    # sshare's columns, short enough for 80 columns: NORM = normalised shares, EFFECTV = effective usage
    for col in ("ACCOUNT", "USER", "SHARES", "NORM", "RAW_GPU_H", "DECAYED_GPU_H", "EFFECTV", "FAIRSHARE"):
        table.add_column(col, justify="left" if col in ("ACCOUNT", "USER") else "right")
    for r in reply["users"]:
        # user and account names are the lab's text: shown as written, never read as rich markup
        table.add_row(escape(r["account"]), escape(r["user"]), str(r["shares"]), f"{r['norm_shares']:.3f}",
                      _hours(r["raw_usage_gpu_hours"]), _hours(r["decayed_usage_gpu_hours"]),
                      f"{r['effective_usage']:.3f}", f"{r['fairshare']:.3f}")
    con = Console(highlight=False)
    con.print(table)
    half = reply.get("half_life_s") or 0
    con.print(f"usage decays with a half-life of {half / 86400:g} days" if half else "usage does not decay",
              style="dim")
    jobs = reply.get("jobs")
    if jobs:
        con.print()
        con.print(priority_table(jobs, reply.get("weights") or {}))


def priority_table(jobs: list[dict[str, Any]], weights: dict[str, Any]) -> Any:
    """sprio's table: each waiting job's factors weighted, and the total (the order between users inside a QoS
    class; a user's own jobs follow their --priority, then least attained service)."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(box=None, header_style="bold", pad_edge=False,
                  title=f"waiting jobs' priority (weights: fairshare {weights.get('weight_fairshare', 0):g}, "
                        f"age {weights.get('weight_age', 0):g}, size {weights.get('weight_size', 0):g})",
                  title_justify="left", title_style="dim")
    for col in ("JOBID", "USER", "QOS", "PRIORITY", "FAIRSHARE", "AGE", "JOBSIZE", "ADMIN", "USERPRIO"):
        table.add_column(col, justify="left" if col in ("USER", "QOS") else "right")
    for j in jobs:
        table.add_row(str(j["job_id"]), escape(j["user"]), escape(j["qos"]), f"{j['total']:.0f}",
                      f"{j['fairshare'] * j['weight_fairshare']:.0f}", f"{j['age'] * j['weight_age']:.0f}",
                      f"{j['size'] * j['weight_size']:.0f}",
                      "-" if j.get("admin_priority") is None else str(j["admin_priority"]), str(j["priority"]))
    return table


def register(app: typer.Typer) -> None:
    @app.command()
    @handle_errors
    def share(
        users: str | None = typer.Option(None, "--user", "-u", help="Only these users (comma-separated)."),
        accounts: str | None = typer.Option(None, "--account", "-A",
                                            help="Only these accounts (comma-separated)."),
        as_json: bool = typer.Option(False, "--json", help="The half-life and one object per user, as JSON."),
    ) -> None:
        """Fair share by user (sshare's role): shares, raw and decayed GPU-hours, the fair-share factor; then each
        waiting job's multifactor priority, factor by factor (sprio's)."""
        from hsched.cli.jobs import _client

        with _client() as c:
            reply = c.call("share")
        if users:
            wanted = {u.strip() for u in users.split(",") if u.strip()}
            reply["users"] = [r for r in reply["users"] if r["user"] in wanted]
            reply["jobs"] = [j for j in reply.get("jobs", []) if j["user"] in wanted]
        if accounts:
            wanted = {a.strip() for a in accounts.split(",") if a.strip()}
            reply["users"] = [r for r in reply["users"] if r["account"] in wanted]
            mine = {r["user"] for r in reply["users"]}
            reply["jobs"] = [j for j in reply.get("jobs", []) if j["user"] in mine]
        if as_json:
            print_json(reply)
        else:
            render_share(reply)
