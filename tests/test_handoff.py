"""Hand-off: a backfill up to T, then live from T over more commits, together equal one replay."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from streamjoin import delta_io, lease
from streamjoin.arrival import Slice
from streamjoin.backfill import hand_off, plan_backfill, run_backfill
from streamjoin.cli import main
from streamjoin.demo import DAY, demo_job, generate, job_file, write_tables
from streamjoin.errors import JobError
from streamjoin.runners.live import LiveRunner
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import replay


def rows(spark, location: str) -> Counter:
    return Counter(tuple(r) for r in delta_io.read_snapshot(spark, location).collect())


@pytest.mark.parametrize("name", ["orders_payments", "orders_rates"])
def test_backfill_then_live_equals_one_replay(spark, tmp_path, name, capsys):
    root = tmp_path
    data = generate()
    half = len(data.commits) // 2
    spec = demo_job(name, str(root / "demo"))
    job_tables = tuple(Path(source.location).name for source in spec.sources)  # the job's, only
    write_tables(spark, str(root / "demo"), data, slice(0, half), only=job_tables)
    start, at, end = DAY - timedelta(days=1), DAY + timedelta(hours=10), DAY + timedelta(days=2)

    with pytest.raises(JobError, match="no exact backfill .* ending at"):
        hand_off(spark, spec, at, str(root / "unused_checkpoint"))
    backfill = plan_backfill(spark, spec, Slice(start, at), every="1d")
    assert [o.status for o in run_backfill(spark, backfill, options=RunOptions(validate=False))] == [
        "succeeded"
    ] * 2
    # A live runner on a new checkpoint would write the backfilled rows again: refused, output untouched.
    backfilled = rows(spark, spec.output.location)
    with pytest.raises(
        JobError, match="already holds rows that checkpoint .* did not write.*streamjoin handoff"
    ):
        LiveRunner(spark, spec, str(root / "fresh_checkpoint")).run()
    assert rows(spark, spec.output.location) == backfilled
    assert not (root / "fresh_checkpoint").exists()  # the refused run left nothing behind

    checkpoint = str(root / "checkpoint")
    # A live runner holding the checkpoint: the hand-off is refused before its replay writes anything.
    held = Path(LiveRunner(spark, spec, checkpoint).home, "lease.json")
    recorded = delta_io.read_snapshot(spark, spec.output.side("metrics")).count()
    token = lease.acquire(held, lambda: True)
    with pytest.raises(lease.CheckpointInUseError):
        hand_off(spark, spec, at, checkpoint)
    lease.release(held, token)
    assert rows(spark, spec.output.location) == backfilled
    assert delta_io.read_snapshot(spark, spec.output.side("metrics")).count() == recorded  # no replay ran
    args = [
        "--root",
        str(root),
        "handoff",
        str(job_file(name)),
        "--at",
        at.isoformat(),
        "--checkpoint",
        checkpoint,
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "live continues from the next versions" in out
    # Issue 18, item 4: each stage is said as it starts, before the long replay.
    assert (
        out.index(f"job {name}: replaying from ")
        < out.index(f"job {name}: seeding the live state")
        < out.index("live continues")
    )
    assert "nothing new yet" in out or ": in 0, out 0" in out  # no commit after the backfill's versions yet
    with pytest.raises(JobError, match="has already run"):
        hand_off(spark, spec, at, checkpoint)

    write_tables(spark, str(root / "demo"), data, slice(half, None), only=job_tables)
    runs = LiveRunner(spark, spec, checkpoint).run()
    assert runs and all(r.balanced() for r in runs)

    whole = replace(spec, output=replace(spec.output, path=str(root / "whole")))
    replay(spark, whole, start, end)
    expected, got = rows(spark, whole.output.location), rows(spark, spec.output.location)
    assert sum(expected.values()) >= 100
    assert got == expected, (got - expected, expected - got)
    # Rows before T that only the later commits decided came from live, after the backfill.
    live_written = sum(r.rows_out for r in runs)
    assert live_written > 0


def test_writing_demo_tables_that_do_not_exist_is_refused_before_anything_is_written(spark, tmp_path):
    # A table path given where a demo table's name belongs once made write_tables write nothing,
    # and a live run over the sources found nothing new, as if the stream had lost the commits.
    data, root = generate(), tmp_path / "demo"
    with pytest.raises(JobError, match=r"no demo table named .*out/orders_payments.*; the demo's tables: "):
        write_tables(spark, str(root), data, only=("orders", str(root / "out" / "orders_payments")))
    assert not root.exists()
