"""The per-host report of ``mcf deploy``: a rich table (host, python, pynq, overlay, node ID,
status) and one line per failed host."""

from __future__ import annotations

from collections.abc import Sequence

from .spec import HostResult

__all__ = ["COLUMNS", "rows", "print_report"]

COLUMNS = ("host", "python", "pynq", "overlay", "node ID", "status")


def rows(results: Sequence[HostResult]) -> list[tuple[str, ...]]:
    """The table's cells, one tuple of :data:`COLUMNS` per host (``-`` for a step not reached)."""
    return [(r.host, r.python or "-", r.pynq or "-", r.overlay or "-", r.node_id or "-",
             "ok" if r.ok else "FAILED") for r in results]


def print_report(results: Sequence[HostResult], file=None) -> None:
    """Print the table, then ``<host>: <error>`` for each failed host, to ``file`` (stdout)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file, width=160, soft_wrap=False, highlight=False)
    table = Table(title="mcf deploy")
    for col in COLUMNS:
        table.add_column(col, overflow="fold")
    for row in rows(results):
        table.add_row(*row, style=None if row[-1] == "ok" else "red")
    console.print(table)
    for r in results:
        if not r.ok:
            console.print(f"{r.host}: {r.error}", markup=False)
    done = sum(r.ok for r in results)
    console.print(f"{done} of {len(results)} hosts deployed", markup=False)
