"""Run metrics as pure Python: micro-batches combined, the metrics row, the one-line summary."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from streamjoin.metrics import SCHEMA, RunMetrics, SourceCounts, Stopwatch, combine


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
    assert set(row) == {f.name for f in SCHEMA.fields}
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
