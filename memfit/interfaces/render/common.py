"""What every terminal table shares: GiB formatting, verdict colours, the console (rich)."""
from __future__ import annotations

GiB = 2**30
VERDICT_STYLE = {"fits": "bold green", "tight": "bold yellow", "oom": "bold red", "host_oom": "bold red"}


def gib(n: int | float) -> str:
    return f"{n / GiB:,.2f}"


def console():
    from rich.console import Console

    return Console()


def print_table(title: str, header: tuple[str, ...], rows) -> None:
    from rich.table import Table

    table = Table(title=title)
    for h in header:
        table.add_column(h)
    for r in rows:
        table.add_row(*map(str, r))
    console().print(table)
