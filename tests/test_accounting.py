"""One `accounting.account` for both runners, and what a live runner keeps between steps, as pure
Python: a step's result accounted as a replay slice and as a live micro-batch gives the same counts,
links and counters; the live runner's own counts of the rows it kept replace the step's `open`."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from rich.console import Console

from streamjoin.accounting import Part, Run, account
from streamjoin.arrival import Slice
from streamjoin.backfill import Backfill, SliceOutcome
from streamjoin.joins.base import Counters, StepResult
from streamjoin.metrics import LinkCounts, RunMetrics, SourceCounts
from streamjoin.progress import outcome_table
from streamjoin.runners.live import Progress
from streamjoin.spec import spec_from_dict
from streamjoin.timeutil import from_micros

START = datetime(2026, 1, 1, tzinfo=UTC)
WATERMARK = 1_767_225_600_000_000  # 2026-01-01 UTC, in micros


def result(totals: dict[str, int]) -> StepResult:
    """A step over one slice: stream `s` joined with table `t`, through two links."""
    decided = {
        "s": SourceCounts(joined=3, unmatched_emitted=1, open=2),
        "t": SourceCounts(applied=4, late=1),
    }
    links = (LinkCounts("1. LEFT JOIN t", reached=4, matched=3, padded=1),)
    return StepResult(
        output=None,  # type: ignore[arg-type]  # account reads no rows
        late=None,  # type: ignore[arg-type]
        by_slice=[decided],
        state=None,
        max_event=None,
        watermark=WATERMARK,
        counters=[Counters(links=links, totals=totals)],
    )


def ran(runner: str, batch: int | None = None) -> Run:
    return Run("j", runner, "exact", "id", START, {"s": 3, "t": 1}, None, 1.5, {"join": 1.0}, batch)


READ = {"s": SourceCounts(rows_in=6), "t": SourceCounts(rows_in=5)}


def test_a_replay_slice_and_a_live_batch_are_accounted_alike():
    step = result({"lookups": 2})
    window = Slice.of(START, datetime(2026, 1, 2, tzinfo=UTC))
    (replayed,) = account(ran("replay"), step, [Part(READ, {"rows": 4}, window=window)])
    (live,) = account(ran("live", batch=7), step, [Part(READ, {"rows": 4})])
    for metrics in (replayed, live):
        assert metrics.sources == {
            "s": SourceCounts(rows_in=6, joined=3, unmatched_emitted=1, open=2),
            "t": SourceCounts(rows_in=5, applied=4, late=1),
        }
        assert metrics.balanced() and metrics.rows_out == 4 and metrics.totals["lookups"] == 2
        assert [link.matched for link in metrics.links] == [3]
        assert metrics.watermark == from_micros(WATERMARK)
    assert (replayed.slice_start, replayed.batch, live.slice_start, live.batch) == (START, None, None, 7)
    assert READ["s"] == SourceCounts(rows_in=6)  # the runner's counts are not changed in place


def test_the_rows_a_live_batch_kept_replace_the_steps_open_rows():
    (live,) = account(ran("live", 0), result({}), [Part(READ, {"rows": 4}, left={"s": (1, 1)})])
    assert (live.sources["s"].open, live.sources["s"].unsettled) == (1, 1)
    assert live.balanced()


def test_a_counter_no_metrics_field_holds_is_refused():
    with pytest.raises(ValueError, match="'fetched'"):
        account(ran("replay"), result({"fetched": 1}), [Part(READ, {})])


def test_a_progress_record_from_before_marks_keeps_its_bound():
    """A table-table checkpoint's record of 0.1.0 kept the bound it emitted up to as `bound`; it
    reads as the operator's mark, and a record written now keeps the marks as they are."""
    old = '{"batch": 4, "max_event": null, "carried": {}, "newest": {}, "tables": {"0": 3}, "bound": 17}'
    assert Progress.from_json(old).marks == {"bound": 17}
    again = Progress.from_json(Progress(5, None, {}, {}, marks={"bound": 20}).to_json())
    assert again.marks == {"bound": 20}
    assert Progress.from_json(old.replace('"bound": 17', '"bound": null')).marks == {}


def test_held_counts_every_row_not_yet_written_at_each_link(tmp_path):
    """Issue 81, item 4: a chain's stream-stream link emitted rows that wait at its table link; no
    source counts them (their sources' rows are joined), yet they are not written: `held` counts
    them beside the sources' open and unsettled rows, in a backfill's slice table too, and the
    summary says how many wait at which link. The first link's waiting rows are its sources' own."""
    metrics = RunMetrics(
        "j",
        "replay",
        "exact",
        "id",
        START,
        slice_start=START,
        slice_end=datetime(2026, 1, 2, tzinfo=UTC),
        sources={"l": SourceCounts(rows_in=9, joined=6, open=2, unsettled=1), "r": SourceCounts(rows_in=4)},
        links=[
            LinkCounts("1. INNER JOIN r", reached=8, matched=6, dropped=2, open=2),  # l's own open rows
            LinkCounts("2. LEFT JOIN t", reached=4, matched=4, carried_in=0, open=2100),
        ],
    )
    assert metrics.held() == 2 + 1 + 2100
    assert "2. LEFT JOIN t 4/4 matched (2100 waiting)" in metrics.summary()
    spec = spec_from_dict(
        {
            "name": "j",
            "sources": {
                "l": {"path": str(tmp_path / "l"), "time": "t"},
                "r": {"path": str(tmp_path / "r"), "time": "t"},
            },
            "from": "l",
            "joins": [{"join": "r", "on": "l.k = r.k", "within": "1h"}],
            "output": {"path": str(tmp_path / "out")},
        }
    )
    piece = Slice.of(START, datetime(2026, 1, 2, tzinfo=UTC))
    plan = Backfill(spec, "b", piece.start, piece.end, "1d", "UTC", "exact", {}, (piece,))
    table = outcome_table(plan, [SliceOutcome(piece, "succeeded", metrics)])
    console = Console(width=200, record=True)
    console.print(table)
    (row,) = [line for line in console.export_text().splitlines() if "succeeded" in line]
    assert "2103" in row.split()
