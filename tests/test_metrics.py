"""Run metrics as pure Python: micro-batches combined, the metrics row, the one-line summary."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

from harness import SCHEMA as ROWS
from harness import create_tables, job

from streamjoin import delta_io
from streamjoin.frames import local_frame
from streamjoin.metrics import (
    RunMetrics,
    SourceCounts,
    Stopwatch,
    combine,
    record_replays,
    schema,
    to_frame,
)
from streamjoin.report import collect_slices
from streamjoin.runners.replay import replay

DAY = datetime(2026, 3, 2, tzinfo=UTC)


def batch(number: int, rows_in: int, joined: int, open_: int, phases: dict[str, float]) -> RunMetrics:
    carried = 0 if number == 0 else 1
    return RunMetrics(
        job="j",
        runner="live",
        mode="exact",
        run_id="r",
        started_at=datetime(2026, 1, 1, tzinfo=UTC),
        batch=number,
        sources={"s": SourceCounts(rows_in=rows_in, carried_in=carried, joined=joined, open=open_)},
        rows_out=joined,
        duration_s=sum(phases.values()) + 0.5,
        phases=phases,
    )


def test_combined_batches_add_inflows_and_phases_and_keep_the_last_open_rows():
    runs = [
        batch(0, 3, 2, 1, {"read": 0.25, "join": 1.0, "write": 0.5}),
        batch(1, 2, 3, 0, {"read": 0.5, "join": 2.0, "write": 0.25}),
    ]
    total = combine(runs)
    assert total.sources["s"] == SourceCounts(rows_in=5, carried_in=0, joined=5, open=0)
    assert total.balanced() and total.rows_out == 5
    assert total.phases == {"read": 0.75, "join": 3.0, "write": 0.75}
    assert total.summary().endswith("| time: read 0.8s, join 3.0s, write 0.8s")


def test_the_metrics_row_holds_every_column_and_the_phases_as_json():
    run = batch(0, 3, 2, 1, {"read": 0.25, "join": 1.0})
    row = run.row()
    assert set(row) == {f.name for f in schema().fields} and row["lookups"] == 0  # a family's total
    assert json.loads(row["by_phase"]) == {"read": 0.25, "join": 1.0}
    assert row["rows_in"] == 3 and row["open"] == 1
    assert batch(0, 1, 1, 0, {}).summary().endswith("| adds up: yes")  # no phases, no time note


def test_a_stopwatch_charges_each_lap_to_its_phase_and_splits_shared_time():
    watch = Stopwatch()
    watch.lap("read")
    watch.lap("join")
    watch.lap("read")
    assert list(watch.phases) == ["read", "join"] and min(watch.phases.values()) >= 0
    watch.phases = {"read": 3.0, "join": 1.5}
    assert watch.shares(3) == {"read": 1.0, "join": 0.5}


def replayed(mode: str, *hours: int) -> list[RunMetrics]:
    """A replay's metrics rows for the consecutive slices between `hours` (after midnight)."""
    return [
        RunMetrics(
            job="j",
            runner="replay",
            mode=mode,
            run_id=f"{mode}-{a}-{b}-{uuid.uuid4().hex[:6]}",
            started_at=datetime.now(UTC),
            slice_start=DAY + timedelta(hours=a),
            slice_end=DAY + timedelta(hours=b),
            sources={"s": SourceCounts(rows_in=b - a, joined=b - a)},
            rows_out=b - a,
        )
        for a, b in zip(hours, hours[1:], strict=False)
    ]


def test_a_slice_replayed_again_supersedes_the_earlier_rows_it_replaced(spark, tmp_path):
    """A killed group of a backfill re-run, then a range replayed in another cut: the metrics table
    keeps every run, marks the replaced ones, and its current rows show each slice once."""
    location = str(tmp_path / "out_metrics")
    live = RunMetrics(
        job="j", runner="live", mode="exact", run_id="live", started_at=datetime.now(UTC), batch=0
    )
    first, complete = replayed("exact", 0, 6, 12, 18, 24), replayed("complete", 0, 6)
    earlier = to_frame(spark, [live, *complete, *first]).drop("superseded_by")  # written before the column
    earlier.write.format("delta").save(location)
    again = replayed("exact", 6, 12, 18)  # the killed group's two slices, re-run
    record_replays(spark, again, location)

    def table() -> dict[str, str | None]:
        return {r.run_id: r.superseded_by for r in delta_io.read_snapshot(spark, location).collect()}

    marked = table()
    assert len(marked) == 1 + 4 + 2 + 1  # every run kept
    assert [marked[run.run_id] for run in first] == [None, again[0].run_id, again[1].run_id, None]
    assert marked["live"] is None and marked[complete[0].run_id] is None  # other runners and modes untouched
    current = {
        (r.slice_start, r.slice_end)
        for r in delta_io.read_snapshot(spark, location)
        .where("runner = 'replay' AND mode = 'exact'")
        .where("superseded_by IS NULL")
        .collect()
    }
    assert len(current) == 4  # four slices, each once

    wider = replayed("exact", 3, 15)  # another cut over the same day
    record_replays(spark, wider, location)
    marked = table()
    assert marked[first[0].run_id] == marked[again[0].run_id] == marked[again[1].run_id] == wider[0].run_id
    assert (
        marked[first[3].run_id] is None and marked[first[1].run_id] == again[0].run_id
    )  # kept its first mark

    rows = [r.asDict() for r in delta_io.read_snapshot(spark, location).collect()]
    shown = {
        (s.start.hour, s.end.hour or 24): {mode: run.runs for mode, run in s.runs.items()}
        for s in collect_slices(rows, [])
    }
    assert shown == {(0, 6): {"complete": 1}, (3, 15): {"exact": 1}, (18, 24): {"exact": 1}}


def test_many_late_rows_name_the_row_that_lifted_the_watermark(spark, tmp_path):
    """A row two hours ahead of the others (inside max_future) lifts the watermark, and every row
    after it is late: the summary names that row (source, event time, commit), not grace."""
    now = datetime.now(UTC).replace(microsecond=0, tzinfo=None) - timedelta(minutes=30)
    paths = create_tables(spark, tmp_path)

    def commit(side: int, *rows: tuple[str, str, int]) -> None:
        data = [(i, k, now + timedelta(seconds=s), 1) for i, k, s in rows]
        local_frame(spark, data, ROWS).write.format("delta").mode("append").save(paths[side])

    commit(0, ("a1", "k1", 0), ("a2", "k2", 10))  # l version 1
    commit(1, ("b1", "k1", 5))
    commit(0, ("a3", "k3", 7200))  # l version 2: two hours ahead of every other row
    commit(1, ("b2", "k2", 15), ("b3", "k3", 20))
    commit(0, ("a4", "k4", 30))
    commit(1, ("b4", "k4", 35))
    commit(0, ("a5", "k5", 40))
    commit(1, ("b5", "k5", 45))  # after the frontier: unsettled
    spec = job(tmp_path, paths, "inner", -60, 60, 5)
    run = replay(spark, spec, now - timedelta(hours=1), now + timedelta(hours=3))
    assert run.total("late") == 5  # b2, b3, a4, b4, a5
    lifted = (now + timedelta(hours=2)).replace(tzinfo=UTC).isoformat()
    (note,) = [part for part in run.summary().split(" | ") if "arrived late" in part]
    assert note.startswith("50% of the rows arrived late: 5 of them missed the watermark")
    assert f"behind the row of source 'l' at event time {lifted} (its commit version 2" in note
    assert "ahead of its commit" in note and "grace shorter" not in note
