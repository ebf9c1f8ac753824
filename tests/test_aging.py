"""The aging helpers make real Delta tables look weeks old, and then months old, to Delta itself."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aging import ENFORCE_TIME_TRAVEL_RETENTION, age_table, session_conf, to_millis, write_commits
from conftest import append
from py4j.protocol import Py4JJavaError
from pyspark.errors import AnalysisException, PySparkException

SCHEMA = "id int, v string"
ROWS = [[(1, "a"), (2, "b")], [(3, "c")], [(4, "d")]]
ROW_TRACKING = {"delta.enableRowTracking": "true"}
RETENTION_ERROR = "DELTA_UNSUPPORTED_TIME_TRAVEL_BEYOND_DELETED_FILE_RETENTION_DURATION"


def days_ago(*days: int) -> list[datetime]:
    """Naive UTC datetimes, whole seconds, `days` before now."""
    now = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
    return [now - timedelta(days=d) for d in days]


def now_millis() -> int:
    return to_millis(datetime.now(UTC))


def history(spark, path: str) -> list[tuple[int, int, str]]:
    """(version, commit time in epoch ms, operation) of the retained commits, oldest first."""
    rows = (
        spark.sql(f"DESCRIBE HISTORY delta.`{path}`")
        .selectExpr("version", "unix_millis(timestamp) AS ms", "operation")
        .collect()
    )
    return sorted((r.version, r.ms, r.operation) for r in rows)


def row_versions(spark, path: str) -> dict[tuple[int, str], int]:
    """Each row of the latest snapshot with its row tracking commit version."""
    rows = (
        spark.read.format("delta")
        .load(path)
        .selectExpr("id", "v", "_metadata.row_commit_version AS rcv")
        .collect()
    )
    return {(r.id, r.v): r.rcv for r in rows}


def change_feed(spark, path: str, start: int = 0):
    return (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", start)
        .load(path)
    )


def condition(error: BaseException) -> str | None:
    """The Spark error class of a failure, whether PySpark converted it or not."""
    if isinstance(error, PySparkException):
        return error.getCondition()
    if isinstance(error, Py4JJavaError):
        return error.java_exception.getCondition()
    return None


@pytest.fixture(scope="module")
def weeks_old(spark, tmp_path_factory) -> tuple[Path, list[datetime]]:
    """A row-tracked table of three commits dated 40, 39 and 38 days ago, and their times."""
    # Written once per module (Spark writes are the slow part); tests work on copies of it.
    path = tmp_path_factory.mktemp("aging") / "events"
    t40, t39, t38 = days_ago(40, 39, 38)
    assert write_commits(spark, str(path), [(t40, ROWS[0]), (t39, ROWS[1])], SCHEMA, ROW_TRACKING) == [0, 1]
    assert write_commits(spark, str(path), [(t38, ROWS[2])], SCHEMA) == [2]  # appends to the table
    return path, [t40, t39, t38]


def copy_of(table: Path, target: Path) -> str:
    """A copy of a Delta table folder, file modification times included (the log is relative)."""
    shutil.copytree(table, target)  # copy2: keeps mtimes
    return str(target)


def test_write_commits_dates_history_change_feed_and_retention(spark, tmp_path, weeks_old):
    table, times = weeks_old
    millis = [to_millis(t) for t in times]
    path = copy_of(table, tmp_path / "events")

    assert history(spark, path) == [
        (0, millis[0], "CREATE TABLE AS SELECT"),
        (1, millis[1], "WRITE"),
        (2, millis[2], "WRITE"),
    ]
    # The change feed dates each row by its commit's (in-commit) timestamp, and time travel by
    # timestamp finds the commits at those times...
    with session_conf(spark, {ENFORCE_TIME_TRAVEL_RETENTION: "false"}):
        changes = (
            change_feed(spark, path)
            .selectExpr("id", "_change_type", "_commit_version", "unix_millis(_commit_timestamp) AS ms")
            .collect()
        )
        an_hour_after_v1 = (times[1] + timedelta(hours=1)).isoformat(sep=" ")
        as_of = spark.read.format("delta").option("timestampAsOf", an_hour_after_v1).load(path).collect()
    assert sorted(r.id for r in as_of) == [1, 2, 3]
    assert sorted(tuple(r) for r in changes) == [
        (1, "insert", 0, millis[0]),
        (2, "insert", 0, millis[0]),
        (3, "insert", 1, millis[1]),
        (4, "insert", 2, millis[2]),
    ]
    # ... and, as on a table really written 40 days ago, Delta refuses to read it from version 0
    # (older than delta.deletedFileRetentionDuration, 7 days by default), or to time travel there.
    with pytest.raises(AnalysisException) as feed_refused:
        change_feed(spark, path).collect()
    assert feed_refused.value.getCondition() == RETENTION_ERROR
    with pytest.raises(AnalysisException) as travel_refused:
        spark.read.format("delta").option("versionAsOf", 0).load(path).collect()
    assert travel_refused.value.getCondition() == RETENTION_ERROR

    # The latest snapshot is whole, each row carrying the version that wrote it.
    assert row_versions(spark, path) == {(1, "a"): 0, (2, "b"): 0, (3, "c"): 1, (4, "d"): 2}

    # An ordinary write afterwards works and is dated now.
    before = now_millis()
    append(spark, path, [(5, "e")], SCHEMA)
    version, ms, operation = history(spark, path)[-1]
    assert (version, operation) == (3, "WRITE")
    assert before <= ms <= now_millis()
    assert row_versions(spark, path)[(5, "e")] == 3

    # Backdated commits can only follow the table's latest commit, now today's.
    with pytest.raises(ValueError, match="already has version 3"):
        write_commits(spark, path, [(days_ago(37)[0], [(6, "f")])], SCHEMA)
    assert history(spark, path)[-1][0] == 3


def test_write_commits_refuses_times_out_of_order_or_to_come(spark, tmp_path):
    path = str(tmp_path / "never")
    (earlier, later) = days_ago(2, 1)
    with pytest.raises(ValueError, match="strictly increasing"):
        write_commits(spark, path, [(later, ROWS[0]), (earlier, ROWS[1])], SCHEMA)
    with pytest.raises(ValueError, match="in the past"):
        write_commits(spark, path, [(earlier, ROWS[0]), (later + timedelta(days=2), ROWS[1])], SCHEMA)
    assert not (tmp_path / "never").exists()


def test_age_table_drops_early_versions_and_keeps_every_row(spark, tmp_path, weeks_old):
    table_dir = tmp_path / "aged"
    path = copy_of(weeks_old[0], table_dir)
    append(spark, path, [(5, "e")], SCHEMA)  # version 3, today
    rows_before = row_versions(spark, path)
    assert rows_before == {(1, "a"): 0, (2, "b"): 0, (3, "c"): 1, (4, "d"): 2, (5, "e"): 3}

    age_table(spark, path)

    # Every row survives compaction, vacuum and clean-up, with the commit version it had.
    assert row_versions(spark, path) == rows_before
    assert len(list(table_dir.glob("*.parquet"))) == 1  # OPTIMIZE compacted, VACUUM removed the rest

    # The versions of 38 to 40 days ago are gone; today's remain.
    assert [(v, op) for v, _, op in history(spark, path)] == [
        (3, "WRITE"),
        (4, "OPTIMIZE"),
        (5, "VACUUM START"),
        (6, "VACUUM END"),
        (7, "SET TBLPROPERTIES"),
    ]
    log = table_dir / "_delta_log"
    assert sorted(p.name for p in log.glob("*.json")) == [f"{v:020d}.json" for v in range(3, 8)]
    assert sorted(p.name for p in log.glob("*.checkpoint.parquet")) == [
        f"{v:020d}.checkpoint.parquet" for v in (3, 7)
    ]
    with pytest.raises(AnalysisException) as travel:
        spark.read.format("delta").option("versionAsOf", 0).load(path).collect()
    assert travel.value.getCondition() == "DELTA_VERSION_NOT_FOUND"
    assert "Available versions: [3, 7]" in str(travel.value)
    with pytest.raises((PySparkException, Py4JJavaError)) as feed:
        change_feed(spark, path).collect()
    assert condition(feed.value) == "DELTA_LOG_FILE_NOT_FOUND"

    properties = {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()}
    assert properties["delta.logRetentionDuration"] == "interval 1 days"
    assert (
        properties["delta.deletedFileRetentionDuration"] == "interval 1 days"
    )  # Delta requires <= log retention

    # The aged table still takes ordinary writes.
    append(spark, path, [(6, "f")], SCHEMA)
    assert row_versions(spark, path) == {**rows_before, (6, "f"): 8}
