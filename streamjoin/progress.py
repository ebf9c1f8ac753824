"""What a person watching a backfill sees: a progress bar naming the stage, one line per slice, a
final table that fits 100 columns (every count is in `--json` and on the data-quality page)."""

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

    def stage(self, text: str) -> None:
        """What the backfill does now (replaying, validating, recording): the bar's label; in a log
        (not a terminal, where no bar is drawn) a line of its own."""
        self.progress.update(self.task, description=f"{self.backfill.job.name}: {text}")
        if not self.console.is_terminal:
            self.console.print(f"  {text} ...", highlight=False)

    def __enter__(self) -> BackfillProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def advance(self, outcome: SliceOutcome) -> None:
        rows = outcome.metrics.total("rows_in") if outcome.metrics else 0
        self.progress.console.print(
            f"[{_STYLE[outcome.status]}]{outcome.status:>9}[/] {outcome.slice.short_label(self.backfill.timezone)}  "
            f"in {rows}, out {outcome.metrics.rows_out if outcome.metrics else '-'}  {outcome.duration_s:.1f}s"
            + (f"  {outcome.error}" if outcome.error else ""),
            highlight=False,
        )
        task = self.progress.tasks[self.task]
        self.progress.update(self.task, advance=1, rows=task.fields["rows"] + rows)


def outcome_table(backfill: Backfill, outcomes: list[SliceOutcome]) -> Table:
    """One row per slice: interval, status, rows in and out, late, rejected, held (every row still
    waiting, not lost: `RunMetrics.held`), validation in short, seconds."""
    table = Table(
        title=f"backfill {backfill.id} of {backfill.job.name} ({backfill.mode}, {backfill.timezone})"
    )
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("slice", "left"),
        ("status", "left"),
        ("in", "right"),
        ("out", "right"),
        ("late", "right"),
        ("rejected", "right"),
        ("held", "right"),
        ("validation", "left"),
        ("s", "right"),
    )
    for name, justify in columns:
        table.add_column(name, justify=justify)
    for o in outcomes:
        m = o.metrics
        table.add_row(
            o.slice.short_label(backfill.timezone),
            Text(o.status, style=_STYLE[o.status]),
            _count(m, "rows_in"),
            str(m.rows_out) if m else "-",
            _count(m, "late"),
            _count(m, "rejected"),
            str(m.held()) if m else "-",
            _checked(o),
            f"{o.duration_s:.0f}",
        )
    table.caption = (
        "held: rows still waiting (window open, arrived after the frontier, or at a chain's link), not lost"
    )
    return table


def problems(backfill: Backfill, outcomes: list[SliceOutcome]) -> list[str]:
    """A line for each failed expectation and each error of the slices that did not succeed,
    printed whole under the table (whose cells say only how many)."""
    lines = []
    for o in outcomes:
        where = o.slice.short_label(backfill.timezone)
        if o.validation is not None:
            lines += [f"{where} FAILED {failed}" for failed in o.validation.failed]
        if o.error:
            lines.append(f"{where} ERROR {o.error}")
    return lines


def _checked(outcome: SliceOutcome) -> str:
    """The validation in a few words: the expectations passed, how many failed, or the error."""
    result = outcome.validation
    if result is None:
        return "not run" if outcome.error is None else _cut(outcome.error)
    if result.success:
        return f"{result.evaluated} passed"
    return f"{len(result.failed)} of {result.evaluated} failed"


def _cut(text: str, width: int = 24) -> str:
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def _count(metrics: RunMetrics | None, bucket: str) -> str:
    """A bucket's total over the sources for the table, or "-" without metrics."""
    return str(metrics.total(bucket)) if metrics else "-"
