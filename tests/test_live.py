"""The live runner as an operator runs it: a processing-time trigger, and state that stays bounded."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import append, at
from harness import create_tables, job, read, write_commit
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

from streamjoin import delta_io
from streamjoin.joins.interval import IntervalLink, TimeBounds
from streamjoin.lease import CheckpointInUseError
from streamjoin.runners.hooks import after_write
from streamjoin.runners.live import LiveRunner
from streamjoin.spec import JoinSpec, Output, Source

EVENTS = StructType(
    [StructField("k", StringType()), StructField("v", StringType()), StructField("t", TimestampType())]
)


def spec(root) -> JoinSpec:
    return JoinSpec(
        name="live",
        sources=(
            Source("l", "stream", path=f"{root}/l", time="t"),
            Source("r", "stream", path=f"{root}/r", time="t"),
        ),
        start="l",
        joins=(
            IntervalLink(
                "r",
                type="left",
                on="l.k = r.k",
                bounds=TimeBounds(-timedelta(seconds=10), timedelta(seconds=10)),
                grace=timedelta(seconds=5),
            ),
        ),
        select=("l.v AS lv", "r.v AS rv"),
        output=Output(path=f"{root}/out"),
    )


def test_processing_time_trigger_picks_up_new_commits(spark, tmp_path):
    """A query left running picks up commits as they land; a second runner on its checkpoint is
    refused with one line naming the holder, and the first goes on unharmed."""
    append(spark, tmp_path / "l", [("a", "A", at(0))], EVENTS)
    append(spark, tmp_path / "r", [("a", "a", at(3))], EVENTS)
    runner = LiveRunner(spark, spec(tmp_path), str(tmp_path / "ck"), trigger="processing-time:1s")
    query = runner.start()
    try:
        deadline = time.monotonic() + 120
        while not runner.runs and time.monotonic() < deadline:
            time.sleep(1)
        with pytest.raises(CheckpointInUseError, match=rf"in use by process {os.getpid()} on .* since "):
            LiveRunner(spark, spec(tmp_path), str(tmp_path / "ck")).run()
        # Commits made while the query runs: a partner for nobody, and rows that close A's window.
        append(spark, tmp_path / "l", [("b", "B", at(40))], EVENTS)
        append(spark, tmp_path / "r", [("c", "c", at(41))], EVENTS)
        while sum(r.total("rows_in") for r in runner.runs) < 4 and time.monotonic() < deadline:
            time.sleep(1)
    finally:
        query.stop()
    assert query.exception() is None
    assert sum(r.total("rows_in") for r in runner.runs) == 4
    rows = sorted((r.lv, r.rv) for r in delta_io.read_snapshot(spark, str(tmp_path / "out")).collect())
    assert rows == [("A", "a")]  # B is open (window not closed); A joined a, so never padded
    assert all(r.balanced() for r in runner.runs)
    for run in runner.runs:  # where each batch's time went (issue 14, item 3)
        assert list(run.phases) == ["read", "join", "write"] and min(run.phases.values()) >= 0
        assert sum(run.phases.values()) <= run.duration_s + 0.01
    # Once the query has stopped, its lease is free: another runner goes on from its checkpoint.
    assert LiveRunner(spark, spec(tmp_path), str(tmp_path / "ck")).run() == []


def test_state_stays_bounded_as_history_grows(spark, tmp_path):
    """A steady stream over a long history: the state holds about (window + grace) x rate rows."""
    runner = None
    sizes = []
    for block in range(6):
        start = block * 100  # 10 rows per side per block, one every 10 s, 100 s per block
        append(
            spark,
            tmp_path / "l",
            [(f"k{i % 3}", f"L{start + i}", at(start + 10 * i)) for i in range(10)],
            EVENTS,
        )
        append(
            spark,
            tmp_path / "r",
            [(f"k{i % 3}", f"R{start + i}", at(start + 10 * i + 2)) for i in range(10)],
            EVENTS,
        )
        runner = runner or LiveRunner(spark, spec(tmp_path), str(tmp_path / "ck"))
        runner.run()
        state = spark.read.parquet(runner._state_path(runner.runs[-1].batch))
        sizes.append(state.count())
    # Rows stay while t + 10 s >= watermark (newest time - 5 s): the newest ~25 s, about 3 rows per side,
    # plus the right side's last commit, which is past the frontier until the left commits again.
    assert max(sizes) <= 20, sizes
    assert sizes[-1] <= sizes[1] + 2, sizes  # flat, not growing with history
    total_in = sum(r.total("rows_in") for r in runner.runs)
    assert total_in == 120


def test_a_micro_batch_commits_its_output_and_metrics_only_and_its_index_entries_outlive_a_failure(
    spark, tmp_path
):
    """Each micro-batch with output rows makes two Delta commits (its output, its metrics row); the
    index entries of its commits are kept in the checkpoint and appended together. A run whose
    query fails leaves them in its last progress record: the next run appends them before it reads
    the index, so the index ends with one entry for every commit read, none lost."""
    paths = create_tables(spark, tmp_path)
    for n in range(3):
        write_commit(spark, paths[0], [(f"l{n}", "a", 10 * n, 0)])
        write_commit(spark, paths[1], [(f"r{n}", "a", 10 * n + 1, 0)])
    job_spec = job(tmp_path, paths, "inner", -5, 5, 0)
    tables = [
        job_spec.output.location,
        *(job_spec.output.side(s) for s in ("late", "rejected", "metrics", "index")),
    ]

    def commits() -> int:
        return sum(len(list(Path(t, "_delta_log").glob("*.json"))) for t in tables if Path(t).exists())

    made: dict[int, int] = {}  # batch -> commits of the job's tables once its metrics row is written
    failed: list[int] = []

    def watch(table: str, batch: int | None) -> None:
        if table == "metrics" and batch is not None and batch not in made:
            made[batch] = commits()
            if batch == 2 and not failed:  # the query fails after batch 2's writes, before its record
                failed.append(batch)
                raise RuntimeError("injected failure after batch 2's metrics row")

    checkpoint = str(tmp_path / "ck")
    with after_write(watch):
        with pytest.raises(Exception, match="injected failure"):
            LiveRunner(spark, job_spec, checkpoint, max_files_per_trigger=1).run(600)
        LiveRunner(spark, job_spec, checkpoint, max_files_per_trigger=1).run(600)
    assert sorted(made) == [0, 1, 2] and failed == [2]
    assert [made[1] - made[0], made[2] - made[1]] == [2, 2]
    entries = spark.read.format("delta").load(job_spec.output.side("index")).select("source", "version")
    assert {tuple(r) for r in entries.distinct().collect()} == {(s, v) for s in ("l", "r") for v in range(4)}
    lids = [r["lid"] for r in read(spark, job_spec.output.location)]
    assert {"l0", "l1"} <= set(lids) and len(lids) == len(set(lids))  # each pair once, across the failure
