"""The log reader (`streamjoin.delta_log`) against Delta's own answers, on a table aged like a
production one: weeks of backdated appends, a MERGE, a schema change, OPTIMIZE, VACUUM at Delta's
default retention, checkpoints and the expired-log clean-up. Every answer the reader gives must be
Delta's; where it cannot answer it says so (None) and the caller asks Delta."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from urllib.parse import unquote, urlparse

import pytest
from aging import (
    ENFORCE_TIME_TRAVEL_RETENTION,
    clean_log,
    commit_at,
    session_conf,
    vacuum_default,
    write_commits,
)
from pyspark.sql import functions as F

from streamjoin import delta_io
from streamjoin.delta_log import LocalLog

SCHEMA = "id string, n long, ts timestamp"
ROW_TRACKING = {"delta.enableRowTracking": "true", "delta.enableChangeDataFeed": "true"}


def _local(uri: str) -> str:
    return unquote(urlparse(uri).path) if uri.startswith("file:") else uri


@pytest.fixture(scope="module")
def aged(spark, tmp_path_factory) -> str:
    """Appends over 40 days (before and after a MERGE and a column added on day 6), OPTIMIZE on
    day 33, VACUUM at the default 7 days and the log cleaned at Delta's 30 days' retention."""
    path = str(tmp_path_factory.mktemp("log") / "events")
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(days=40)
    day = [start + timedelta(days=d) for d in range(40)]

    def rows(d: int) -> list[tuple]:
        return [(f"k{d}-{i}", i if d % 5 else None, day[d] + timedelta(minutes=i)) for i in range(4)]

    write_commits(spark, path, [(day[d], rows(d)) for d in (0, 2, 4)], SCHEMA, ROW_TRACKING)
    update = spark.createDataFrame([("k2-1", 99, day[2])], SCHEMA)
    commit_at(spark, path, day[6], lambda: delta_io.upsert(update, path, ("id",)))
    wider = spark.createDataFrame([("k6-0", 1, day[6] + timedelta(hours=1), "x")], f"{SCHEMA}, note string")
    commit_at(
        spark,
        path,
        day[6] + timedelta(hours=2),
        lambda: wider.write.format("delta").mode("append").option("mergeSchema", "true").save(path),
    )
    write_commits(spark, path, [(day[d], rows(d)) for d in (8, 20, 31)], SCHEMA)
    commit_at(spark, path, day[33], lambda: spark.sql(f"OPTIMIZE delta.`{path}`"))
    write_commits(spark, path, [(day[d], rows(d)) for d in (35, 37, 39)], SCHEMA)
    vacuum_default(spark, path)
    clean_log(spark, path)
    return path


def test_the_aged_table_is_shaped_as_the_comparison_needs(spark, aged):
    """The log lost its first versions, VACUUM removed files, and a schema changed on the way:
    otherwise the comparisons below would prove less."""
    log = LocalLog.of(aged)
    assert log is not None
    history = spark.sql(f"DESCRIBE HISTORY delta.`{aged}`").select("version").collect()
    assert log.versions() == sorted(r.version for r in history)
    assert log.versions()[0] > 0  # the expired log entries are gone
    assert log.newest() == max(log.versions())
    assert any("checkpoint" in name for name in os.listdir(log.folder))
    assert log.damaged() is None


def test_each_version_s_files_schema_and_size_are_delta_s(spark, aged):
    """For every retained version whose checksum lists its files: the same files as Delta's
    snapshot, the schema Delta reads, and the size Delta reports for the newest."""
    log = LocalLog.of(aged)
    assert log is not None
    listed = 0
    for version in log.versions():
        with session_conf(spark, {ENFORCE_TIME_TRAVEL_RETENTION: "false"}):  # vacuumed versions' lists too
            snapshot = delta_io.read_snapshot(spark, aged, version)
        files = log.files(version)
        if files is not None:
            listed += 1
            assert sorted(log.paths(files)) == sorted(map(_local, snapshot.inputFiles())), version
            assert log.size(version) == sum(f["size"] for f in files), version
            if all(map(os.path.exists, log.paths(files))):  # not vacuumed
                assert log.size(version) == sum(map(os.path.getsize, log.paths(files))), version
        assert delta_io._schema_at(spark, aged, version).simpleString() == snapshot.schema.simpleString()
    assert listed >= 5
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{aged}`").first()
    assert log.size(log.newest()) == detail.sizeInBytes


def test_properties_history_and_statistics_are_delta_s(spark, aged):
    """Table properties, the history the runners use, each file's time range and the null count
    of a column agree with Delta's answers and the rows themselves."""
    log = LocalLog.of(aged)
    assert log is not None
    shown = {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES delta.`{aged}`").collect()}
    own = {
        k: v
        for k, v in shown.items()
        if not k.startswith(("delta.minReader", "delta.minWriter", "delta.feature."))
    }
    assert log.properties() == own
    oldest = log.versions()[0]
    assert delta_io._history_in_log(aged, oldest) == delta_io._history_by_delta(spark, aged, oldest, None)

    rows = delta_io.read_snapshot(spark, aged).withColumn("file", F.input_file_name())
    per_file = rows.groupBy("file").agg(F.min("ts").alias("low"), F.max("ts").alias("high")).collect()
    ranges = log.time_ranges("ts")
    assert ranges is not None and len(ranges) == len(per_file)
    for r in per_file:  # each file's rows inside the range told for it
        low, high = r.low.replace(tzinfo=UTC), r.high.replace(tzinfo=UTC)
        assert any(lo <= low and high < hi for lo, hi in ranges), r.file
    assert not log.only_nulls("n")  # some rows hold n
    assert log.only_nulls("note") == (rows.where(F.col("note").isNotNull()).count() == 0)


def test_what_the_log_cannot_answer_is_left_to_delta(spark, aged, tmp_path):
    """No reader for a metastore name or another file system; None for a version whose checksum
    is gone; a write tag search refused once the commits after its version left the log."""
    assert LocalLog.of("db.events") is None and LocalLog.of("s3a://bucket/events") is None
    log = LocalLog.of(aged)
    assert log is not None
    assert log.commits_after(log.versions()[0] - 2) is None  # cleaned up: unknown
    assert len(log.commits_after(log.newest() - 3) or []) == 3
    copy = tmp_path / "copy"
    os.system(f"cp -a {aged} {copy}")
    copied = LocalLog.of(str(copy))
    assert copied is not None
    os.remove(os.path.join(copied.folder, f"{copied.newest():020d}.crc"))
    assert copied.files() is None and copied.properties() is None and copied.size(copied.newest()) is None
    assert delta_io.table_properties(spark, str(copy))["delta.enableRowTracking"] == "true"  # from Delta
