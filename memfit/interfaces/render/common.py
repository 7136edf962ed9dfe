"""What every terminal table shares: GiB formatting, verdict colours, the console (rich), and `show`, which keeps a
table readable in a narrow terminal."""
from __future__ import annotations

GiB = 2**30
VERDICT_STYLE = {"fits": "bold green", "tight": "bold yellow", "oom": "bold red", "host_oom": "bold red"}


def gib(n: int | float) -> str:
    return f"{n / GiB:,.2f}"


def console():
    from rich.console import Console

    return Console()


def show(con, table) -> None:
    """A table when it fits the terminal; else one block per row, its first cell as the heading and each other
    cell as `column: value` (wrapped under the value). A table squeezed below its natural width folds each cell into
    a sliver of a word per line and cuts names short ("report-qw…"); a block per row keeps every word whole."""
    natural = con.measure(table, options=con.options.update_width(2**20)).maximum  # rich caps it at the width
    if natural <= con.width:
        con.print(table)
        return
    from rich.padding import Padding
    from rich.table import Table

    if table.title:
        con.print(table.title, style="italic")
    columns = table.columns
    for cells in zip(*(list(c.cells) for c in columns)):
        con.print(cells[0], style="bold")
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True, style="dim")
        grid.add_column(overflow="fold")
        for column, cell in zip(columns[1:], cells[1:]):
            grid.add_row(f"{column.header}:", cell)
        con.print(Padding(grid, (0, 0, 0, 2)))


def print_table(title: str, header: tuple[str, ...], rows) -> None:
    from rich.table import Table

    table = Table(title=title)
    for h in header:
        table.add_column(h)
    for r in rows:
        table.add_row(*map(str, r))
    show(console(), table)
