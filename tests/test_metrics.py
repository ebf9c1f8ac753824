"""Run metrics as pure Python: micro-batches combined, the metrics row, the one-line summary."""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime, timedelta

from harness import SCHEMA as ROWS
from harness import create_tables, job
from pyspark.sql.types import StructType

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
    told_superseded,
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


# docs/backfills.md's query of the current replay rows, of mode 'exact'.
CURRENT = """SELECT m.* FROM delta.`{0}` m
WHERE m.runner = 'replay' AND m.mode = 'exact' AND m.superseded_by IS NULL AND NOT EXISTS (
  SELECT 1 FROM delta.`{0}` l
  WHERE l.runner = 'replay' AND l.mode = m.mode
    AND l.slice_start < m.slice_end AND l.slice_end > m.slice_start
    AND (coalesce(l.recorded_at, l.started_at), l.run_id)
      > (coalesce(m.recorded_at, m.started_at), m.run_id))"""


def told(spark, location: str) -> list[dict]:
    """The metrics table's rows as its readers see them, `superseded_by` told."""
    return told_superseded([r.asDict() for r in delta_io.read_snapshot(spark, location).collect()])


def test_a_slice_replayed_again_supersedes_the_earlier_rows_it_replaced(spark, tmp_path):
    """A killed group of a backfill re-run, then a range replayed in another cut: the metrics table
    keeps every run, readers see the replaced ones marked, and its current rows show each slice once."""
    location = str(tmp_path / "out_metrics")
    live = RunMetrics(
        job="j", runner="live", mode="exact", run_id="live", started_at=datetime.now(UTC), batch=0
    )
    first, complete = replayed("exact", 0, 6, 12, 18, 24), replayed("complete", 0, 6)
    earlier = to_frame(spark, [live, *complete, *first]).drop("superseded_by", "recorded_at")
    earlier.write.format("delta").save(location)  # written before either column
    again = replayed("exact", 6, 12, 18)  # the killed group's two slices, re-run
    record_replays(spark, again, location)
    assert delta_io.history(spark, location)[-1].rewrites_rows is False  # an append: no earlier row rewritten

    def table() -> dict[str, str | None]:
        return {r["run_id"]: r["superseded_by"] for r in told(spark, location)}

    marked = table()
    assert len(marked) == 1 + 4 + 2 + 1  # every run kept
    assert [marked[run.run_id] for run in first] == [None, again[0].run_id, again[1].run_id, None]
    assert marked["live"] is None and marked[complete[0].run_id] is None  # other runners and modes untouched
    current = {
        (r["slice_start"], r["slice_end"])
        for r in told(spark, location)
        if r["runner"] == "replay" and r["mode"] == "exact" and r["superseded_by"] is None
    }
    assert len(current) == 4  # four slices, each once
    in_sql = {(r.slice_start, r.slice_end) for r in spark.sql(CURRENT.format(location)).collect()}
    assert in_sql == current  # docs/backfills.md's SQL finds the same rows

    wider = replayed("exact", 3, 15)  # another cut over the same day
    record_replays(spark, wider, location)
    marked = table()
    assert marked[first[0].run_id] == marked[again[0].run_id] == marked[again[1].run_id] == wider[0].run_id
    assert (
        marked[first[3].run_id] is None and marked[first[1].run_id] == again[0].run_id
    )  # kept its first mark

    shown = {
        (s.start.hour, s.end.hour or 24): {mode: run.runs for mode, run in s.runs.items()}
        for s in collect_slices([r.asDict() for r in delta_io.read_snapshot(spark, location).collect()], [])
    }
    assert shown == {(0, 6): {"complete": 1}, (3, 15): {"exact": 1}, (18, 24): {"exact": 1}}


def test_a_table_whose_rows_hold_their_marks_reads_the_same_and_a_rerun_still_supersedes(spark, tmp_path):
    """A metrics table recorded when a re-run rewrote the earlier rows' `superseded_by` (no
    `recorded_at` column): its marks read as stored, its current rows stay current, and a replay
    recorded now supersedes the current rows its slice overlaps, not those already marked."""
    location = str(tmp_path / "out_metrics")
    hourly, daily = replayed("exact", 0, 1, 2, 3), replayed("exact", 0, 24)
    rows = [run.row() | {"superseded_by": daily[0].run_id} for run in hourly] + [daily[0].row()]
    columns = [f for f in schema().fields if f.name != "recorded_at"]
    local_frame(
        spark, [tuple(row[f.name] for f in columns) for row in rows], StructType(columns)
    ).write.format("delta").save(location)
    stored = {r["run_id"]: r["superseded_by"] for r in told(spark, location)}
    assert stored == {**{run.run_id: daily[0].run_id for run in hourly}, daily[0].run_id: None}

    again = replayed("exact", 1, 2)
    record_replays(spark, again, location)
    marked = {r["run_id"]: r["superseded_by"] for r in told(spark, location)}
    assert marked == {**stored, daily[0].run_id: again[0].run_id, again[0].run_id: None}


def brute_force_marks(rows: list[dict]) -> dict[str, str | None]:
    """The rule `told_superseded` implements, row by row: the first replay of the same mode recorded
    after a row whose slice overlaps its own."""
    marks = {}
    for row in rows:
        later = [
            other
            for other in rows
            if other["mode"] == row["mode"]
            and other["recorded_at"] > row["recorded_at"]
            and other["slice_start"] < row["slice_end"]
            and other["slice_end"] > row["slice_start"]
        ]
        marks[row["run_id"]] = min(later, key=lambda r: r["recorded_at"])["run_id"] if later else None
    return marks


def test_the_superseding_run_told_at_read_time_is_the_first_later_overlapping_one():
    """Many replays of random cuts in two modes, recorded one after another: each row's mark is the
    first row of its mode recorded after it whose slice overlaps its own (checked row by row)."""
    generator = random.Random(79)
    rows = []
    for n in range(400):
        start = generator.randrange(0, 200)
        rows.append(
            {
                "runner": "replay",
                "mode": generator.choice(["exact", "complete"]),
                "run_id": f"run{n:03d}",
                "started_at": DAY,
                "recorded_at": DAY + timedelta(seconds=n),
                "slice_start": DAY + timedelta(hours=start),
                "slice_end": DAY + timedelta(hours=start + generator.choice([1, 1, 2, 6, 24, 100])),
            }
        )
    generator.shuffle(rows)
    assert {r["run_id"]: r["superseded_by"] for r in told_superseded(rows)} == brute_force_marks(rows)


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
