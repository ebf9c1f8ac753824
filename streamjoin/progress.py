"""What a person watching a backfill in a terminal sees: a progress bar, one line per slice, a final table."""

from __future__ import annotations

from rich.console import Console, JustifyMethod
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from streamjoin.backfill import Backfill, SliceOutcome
from streamjoin.metrics import RunMetrics

_STYLE = {"succeeded": "green", "failed": "bold red", "invalid": "bold yellow"}


class _RowsPerSecond(ProgressColumn):
    """Input rows replayed per second of wall time so far."""

    def render(self, task) -> Text:
        rows, elapsed = task.fields.get("rows", 0), task.elapsed or 0
        return Text(f"{rows / elapsed:,.0f} rows/s" if elapsed and rows else "- rows/s", style="cyan")


class BackfillProgress:
    """A progress bar over a backfill's slices on stderr, with a line per finished slice."""

    def __init__(self, backfill: Backfill, total: int, console: Console | None = None) -> None:
        self.backfill = backfill
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("slices"),
            _RowsPerSecond(),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.task = self.progress.add_task(f"backfill {backfill.job.name}", total=total, rows=0)

    def __enter__(self) -> BackfillProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def advance(self, outcome: SliceOutcome) -> None:
        rows = outcome.metrics.total("rows_in") if outcome.metrics else 0
        self.progress.console.print(
            f"[{_STYLE[outcome.status]}]{outcome.status:>9}[/] {outcome.slice.label(self.backfill.timezone)}  "
            f"in {rows}, out {outcome.metrics.rows_out if outcome.metrics else '-'}  {outcome.duration_s:.1f}s"
            + (f"  {outcome.error}" if outcome.error else ""),
            highlight=False,
        )
        task = self.progress.tasks[self.task]
        self.progress.update(self.task, advance=1, rows=task.fields["rows"] + rows)


def outcome_table(backfill: Backfill, outcomes: list[SliceOutcome]) -> Table:
    """One row per slice: interval, status, counts, validation, time."""
    table = Table(
        title=f"backfill {backfill.id} of {backfill.job.name} ({backfill.mode}, {backfill.timezone})"
    )
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("slice", "left"),
        ("status", "left"),
        ("rows in", "right"),
        ("rows out", "right"),
        ("joined", "right"),
        ("late", "right"),
        ("rejected", "right"),
        ("validation", "left"),
        ("seconds", "right"),
    )
    for name, justify in columns:
        table.add_column(name, justify=justify)
    for o in outcomes:
        m = o.metrics
        if o.validation is None:
            checked = "not run" if o.error is None else o.error
        elif o.validation.success:
            checked = f"passed ({o.validation.evaluated} expectations)"
        else:
            checked = "FAILED: " + "; ".join(o.validation.failed)
        table.add_row(
            o.slice.label(backfill.timezone),
            Text(o.status, style=_STYLE[o.status]),
            _count(m, "rows_in"),
            str(m.rows_out) if m else "-",
            _count(m, "joined"),
            _count(m, "late"),
            _count(m, "rejected"),
            checked,
            f"{o.duration_s:.1f}",
        )
    return table


def _count(metrics: RunMetrics | None, bucket: str) -> str:
    """A bucket's total over the sources for the table, or "-" without metrics."""
    return str(metrics.total(bucket)) if metrics else "-"
