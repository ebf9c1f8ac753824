"""Delta I/O through the session factory: time travel, change feed arrivals, idempotent writes, retention."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from aging import age_table, vacuum, write_commits
from conftest import SHORT_LIVED_JVM, append, at
from delta.tables import DeltaTable
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from streamjoin import delta_io
from streamjoin.delta_log import LocalLog
from streamjoin.errors import HistoryNotRetainedError, JobError
from streamjoin.jars import ARCHIVE, archive_current, folder
from streamjoin.timeutil import from_spark

EVENTS = StructType(
    [StructField("id", StringType()), StructField("n", LongType()), StructField("ts", TimestampType())]
)
DDL = "id string, n long, ts timestamp"


def test_round_trip_time_travel_and_change_feed(spark, tmp_path):
    path = str(tmp_path / "events")
    append(spark, path, [("a", 1, at(1)), ("b", 2, at(2))], EVENTS)
    append(spark, path, [("c", 3, at(3))], EVENTS)
    assert delta_io.latest_version(spark, path) == 1
    assert sorted(r.id for r in delta_io.read_snapshot(spark, path, version=0).collect()) == ["a", "b"]
    assert delta_io.read_snapshot(spark, path).count() == 3
    delta_io.require_change_feed(spark, path)  # tables created here record their change feed
    changes = delta_io.read_inserts(spark, path, upto_version=1).collect()
    by_id = {r.id: r for r in changes}
    assert {k: v._commit_version for k, v in by_id.items()} == {"a": 0, "b": 0, "c": 1}
    history = delta_io.history(spark, path)
    assert [c.version for c in history] == [0, 1]
    assert by_id["c"]._commit_timestamp == history[1].timestamp
    assert history[0].timestamp <= history[1].timestamp
    assert delta_io.version_at(spark, path, history[0].timestamp) == 0


def test_the_log_says_how_many_rows_an_append_inserted_and_which_streaming_writes_rewrite(spark, tmp_path):
    """Issue 14: what the live runner's index takes from the log, read from real commits: a batch
    append's and a streaming append's inserted rows (`numOutputRows`), none for an OPTIMIZE, and a
    streaming write in complete mode (its `outputMode`) as a rewrite."""
    path, source = str(tmp_path / "events"), str(tmp_path / "feed")
    append(spark, path, [("a", 1, at(1)), ("b", 2, at(2))], EVENTS)
    append(spark, source, [("c", 3, at(3)), ("d", 4, at(4)), ("e", 5, at(5))], EVENTS)
    stream = spark.readStream.format("delta").load(source)
    for mode, checkpoint in (("append", "a"), ("complete", "c")):
        frame = stream if mode == "append" else stream.groupBy("id").count().select("id", "count")
        target = path if mode == "append" else str(tmp_path / "totals")
        query = (
            frame.writeStream.format("delta")
            .outputMode(mode)
            .option("checkpointLocation", str(tmp_path / checkpoint))
        )
        query.trigger(availableNow=True).start(target).awaitTermination()
    spark.sql(f"OPTIMIZE delta.`{path}`")
    history = delta_io.history(spark, path)
    assert [(c.operation, c.appended_rows, c.rewrites_rows) for c in history] == [
        ("WRITE", 2, False),
        ("STREAMING UPDATE", 3, False),
        ("OPTIMIZE", 0, False),
    ]
    (totals,) = delta_io.history(spark, str(tmp_path / "totals"))
    assert totals.mode == "Complete" and totals.rewrites_rows and totals.appended_rows is None


def test_slices_replace_and_batches_write_once(spark, tmp_path):
    path = str(tmp_path / "out")
    frame = spark.createDataFrame([("a", 1, at(10)), ("b", 2, at(20)), ("c", 3, at(30))], EVENTS)
    delta_io.write_slice(frame.where("n <= 2"), path, "ts", at(0), at(25))
    delta_io.write_slice(frame.where("n = 3"), path, "ts", at(25), at(40))
    delta_io.write_slice(frame.where("n <= 2"), path, "ts", at(0), at(25))  # re-run: replaced, not doubled
    assert sorted(r.id for r in delta_io.read_snapshot(spark, path).collect()) == ["a", "b", "c"]
    delta_io.write_slice(frame.where("n = 1"), path, "ts", at(0), at(25))  # a re-run that finds fewer rows
    assert sorted(r.id for r in delta_io.read_snapshot(spark, path).collect()) == ["a", "c"]

    batches = str(tmp_path / "batches")
    for _attempt in range(2):  # without a version to search from: Delta's transaction ids skip it
        delta_io.write_once(frame, batches, "app-1", 0)
    delta_io.write_once(frame.where("n = 1"), batches, "app-1", 1)
    assert delta_io.read_snapshot(spark, batches).count() == 4


def test_whether_a_table_lies_inside_a_slice_or_holds_rows_in_it_is_read_from_its_checksum(spark, tmp_path):
    """`write_slice` overwrites the whole table when every row lies in the slice, and the replay
    leaves a side table alone when it holds no row in the slice (`holds_rows`), both told from the
    file statistics in the table's checksum: never inside when a row is not, never empty when a row
    is in it (times to the microsecond, a millisecond around the bounds); inside, or empty, whenever
    the rows are so by more than the millisecond Delta cuts from timestamps in statistics; without
    the checksum, asked of Spark, or taken to hold rows."""
    rng = random.Random(19)
    path = str(tmp_path / "slices")
    assert delta_io._inside_by_checksum(path, "ts", at(0), at(1)) is None  # no table yet
    assert not delta_io.holds_rows(spark, path, "ts", at(0), at(1))
    spark.createDataFrame([], EVENTS).write.format("delta").save(path)
    assert delta_io._inside_by_checksum(path, "ts", at(0), at(1)) is True  # empty
    assert not delta_io.holds_rows(spark, path, "ts", at(0), at(1))
    checked, empty, held = 0, 0, 0
    for commit in range(4):
        rows = [(f"r{commit}_{i}", i, at(rng.uniform(0, 100))) for i in range(rng.randint(1, 4))]
        append(spark, path, rows, EVENTS)
        times = [r.ts for r in delta_io.read_snapshot(spark, path).select("ts").collect()]
        low, high = min(times), max(times)
        for n in range(90):  # a third around the table's own bounds, a third just outside them
            if n % 3 == 0:
                start, end = at(rng.uniform(-5, 105)), at(rng.uniform(-5, 105))
            elif n % 3 == 1:
                start, end = low, high
            else:
                start, end = (
                    (high, high + timedelta(seconds=10)) if n % 2 else (low - timedelta(seconds=10), low)
                )
            start += timedelta(microseconds=rng.randint(-1500, 1500))
            end += timedelta(microseconds=rng.randint(-1500, 1500))
            told = delta_io._inside_by_checksum(path, "ts", from_spark(start), from_spark(end))
            assert told is not None, "a table of a few files lists them in its checksum"
            exact = start <= low and high < end
            assert not told or exact, (start, end, low, high)
            if exact and start + timedelta(milliseconds=1) <= low and high + timedelta(milliseconds=1) <= end:
                assert told, (start, end, low, high)
            assert delta_io._inside(spark, path, "ts", start, end) == told
            holds = delta_io.holds_rows(spark, path, "ts", start, end)
            millisecond = timedelta(milliseconds=1)
            if any(start <= t < end for t in times):
                assert holds, (start, end, times)
                held += 1
            elif start < end and (high + millisecond <= start or end + millisecond <= low):
                assert not holds, (start, end, low, high)
                empty += 1
            checked += 1
    newest = delta_io.newest_logged(path)
    os.remove(os.path.join(path, "_delta_log", f"{newest:020d}.crc"))
    assert delta_io._inside_by_checksum(path, "ts", at(-10), at(200)) is None
    assert delta_io._inside(spark, path, "ts", at(-10), at(200)) and not delta_io._inside(
        spark, path, "ts", at(50), at(200)
    )
    assert delta_io.holds_rows(spark, path, "ts", at(500), at(600))  # cannot tell: may hold rows
    assert checked == 360 and empty >= 30 and held >= 100, (empty, held)


def test_a_table_of_its_own_is_read_from_the_files_its_checksum_lists(spark, tmp_path):
    """`read_own` (how the arrival index is read) gives the rows Delta gives, at every version:
    after appends, one that adds a column (older rows read it as NULL), an OPTIMIZE that replaces
    every file; with one Spark job where Delta first rebuilds the new version's state; through Delta
    when the newest checksum lists no files (a schema change) or is missing; None when there is no
    table."""
    path, wide = str(tmp_path / "own"), StructType([*EVENTS.fields, StructField("extra", LongType())])
    assert delta_io.read_own(spark, path, wide) is None
    rng, jobs = random.Random(7), spark.sparkContext.statusTracker()

    def rows(frame) -> list[tuple]:
        return sorted(tuple(r) for r in frame.select(*wide.fieldNames()).collect())

    for commit in range(6):
        n = rng.randint(0, 3)
        if commit < 4:
            frame = spark.createDataFrame([(f"r{commit}_{i}", i, at(i)) for i in range(n)], EVENTS)
        else:
            frame = spark.createDataFrame([(f"r{commit}_{i}", i, at(i), commit) for i in range(n)], wide)
        delta_io.append(frame, path, merge_schema=True)
        # An append lists the table's files in its checksum as it commits; the one that changes the
        # schema lists none, and the checksum after it comes when Delta has rebuilt the state.
        listed = LocalLog.of(path).files() is not None
        assert listed or commit >= 4, commit
        # The size a replay decides by (`replay.SMALL_SOURCE_BYTES`) is the one Delta reports.
        newest = delta_io.newest_logged(path)
        assert newest is not None
        size = delta_io.size_at(path, newest)
        assert size == DeltaTable.forPath(spark, path).detail().first()["sizeInBytes"], commit
        spark.sparkContext.setJobGroup(f"own{commit}", "read_own")
        own = rows(delta_io.read_own(spark, path, wide))
        if listed:
            assert len(jobs.getJobIdsForGroup(f"own{commit}")) == 1, f"commit {commit}: read through Delta"
        spark.sparkContext.setJobGroup("delta", "delta")
        snapshot = delta_io.read_snapshot(spark, path)
        if "extra" not in snapshot.columns:
            snapshot = snapshot.selectExpr("*", "CAST(NULL AS long) AS extra")
        assert own == rows(snapshot), commit
    spark.sql(f"OPTIMIZE delta.`{path}`")
    assert rows(delta_io.read_own(spark, path, wide)) == rows(delta_io.read_snapshot(spark, path))
    os.remove(os.path.join(path, "_delta_log", f"{delta_io.newest_logged(path):020d}.crc"))
    assert delta_io.size_at(path, delta_io.newest_logged(path) or 0) is None  # unknown, so not small
    spark.sparkContext.setJobGroup("fallback", "read_own")
    assert rows(delta_io.read_own(spark, path, wide)) == rows(delta_io.read_snapshot(spark, path))
    assert len(jobs.getJobIdsForGroup("fallback")) > 1, "no checksum: Delta lists the files"
    spark.sparkContext._jsc.clearJobGroup()


def test_a_tagged_batch_write_is_found_after_the_version_it_began_at_and_not_written_twice(spark, tmp_path):
    """What the live runner does: the table's newest version before a batch's first attempt, then
    writes tagged with (app, batch). A batch run again finds its own commit among those after that
    version, whatever else committed since; another batch, or another app's same batch, is written."""
    path = str(tmp_path / "out")
    frame = spark.createDataFrame([("a", 1, at(10)), ("b", 2, at(20)), ("c", 3, at(30))], EVENTS)
    before_0 = delta_io.newest_logged(path)
    assert before_0 == -1  # no table yet
    for _attempt in range(2):
        delta_io.write_once(frame, path, "app-1", 0, after=before_0)
    assert delta_io.read_snapshot(spark, path).count() == 3

    before_1 = delta_io.newest_logged(path)
    delta_io.write_once(frame.where("n = 1"), path, "app-1", 1, after=before_1)
    append(spark, path, [("d", 4, at(40))], EVENTS)  # another writer, then a compaction, after it
    spark.sql(f"OPTIMIZE delta.`{path}`")
    delta_io.write_once(frame.where("n = 1"), path, "app-1", 1, after=before_1)  # run again: skipped
    delta_io.write_once(frame.where("n = 1"), path, "app-2", 1, after=before_1)  # not its write
    delta_io.write_once(frame.where("n = 2"), path, "app-1", 2, after=delta_io.newest_logged(path))
    assert sorted(r.id for r in delta_io.read_snapshot(spark, path).collect()) == [
        "a", "a", "a", "b", "b", "c", "d",
    ]  # fmt: skip
    assert delta_io.newest_logged("some_schema.some_table") is None  # a metastore name: Delta's transactions


def test_a_batch_run_again_after_its_commits_left_the_log_is_refused(spark, tmp_path):
    """A batch that began writing at a version whose later log entries were cleaned up (a run again
    more than the log's retention later) cannot tell whether its write committed: it says so."""
    path = str(tmp_path / "old")
    day = datetime.now(UTC).replace(tzinfo=None) - timedelta(days=40)
    write_commits(spark, path, [(day + timedelta(hours=h), [("x", h, day)]) for h in range(3)], DDL)
    age_table(spark, path)
    assert delta_io.oldest_version(spark, path) > 1
    frame = spark.createDataFrame([("a", 1, at(10))], EVENTS)
    with pytest.raises(JobError, match=r"after version 0 were cleaned up .*`streamjoin handoff"):
        delta_io.write_once(frame, path, "app-1", 3, after=0)
    assert delta_io.read_snapshot(spark, path).count() == 3


def test_history_read_from_the_log_equals_deltas_own(spark, tmp_path):
    """A local table with in-commit timestamps has its history read from its log files; every field
    the runners use equals what Delta's history reports, from every version on, over appends, a
    MERGE, a DELETE, a schema change, OPTIMIZE, VACUUM, table properties and a row-tracking
    backfill. A table without in-commit timestamps is answered by Delta, as before."""
    path = str(tmp_path / "events")
    append(spark, path, [("a", 1, at(1)), ("b", 2, at(2))], EVENTS)
    append(spark, path, [("c", 3, at(3))], EVENTS)
    delta_io.upsert(spark.createDataFrame([("a", 9, at(4))], EVENTS), path, ("id",))
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 'b'")
    wider = spark.createDataFrame([("d", 4, at(5), "x")], "id string, n long, ts timestamp, note string")
    wider.write.format("delta").mode("append").option("mergeSchema", "true").save(path)
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableRowTracking' = 'false')")
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableRowTracking' = 'true')")
    spark.sql(f"OPTIMIZE delta.`{path}`")
    vacuum(spark, path)
    newest = delta_io.latest_version(spark, path)
    assert newest >= 9
    for since in (None, *range(newest + 2)):
        read = delta_io._history_in_log(path, since)
        assert read is not None, since
        assert read == delta_io._history_by_delta(spark, path, since, None), since
        assert delta_io.history(spark, path, since=since) == read
    operations = [c.operation for c in delta_io.history(spark, path)]
    assert {"MERGE", "DELETE", "OPTIMIZE", "VACUUM END", "SET TBLPROPERTIES"} <= set(operations), operations
    assert any(c.enables_row_tracking for c in delta_io.history(spark, path))

    plain = str(tmp_path / "plain")
    spark.createDataFrame([("a", 1, at(1))], EVENTS).write.format("delta").option(
        "delta.enableInCommitTimestamps", "false"
    ).save(plain)
    append(spark, plain, [("b", 2, at(2))], EVENTS)
    assert delta_io._history_in_log(plain, None) is None
    assert [c.version for c in delta_io.history(spark, plain)] == [0, 1]
    with pytest.raises(JobError, match="not a Delta table"):
        delta_io.history(spark, str(tmp_path / "nothing"))


def test_missing_change_feed_is_a_clear_error(spark, tmp_path):
    path = str(tmp_path / "no_cdf")
    spark.createDataFrame([("a", 1, at(1))], EVENTS).write.format("delta").option(
        "delta.enableChangeDataFeed", "false"
    ).save(path)
    with pytest.raises(JobError, match="does not record its change data feed"):
        delta_io.require_change_feed(spark, path)


def test_whether_a_table_exists_and_its_properties_are_read_from_its_log_as_delta_tells_them(spark, tmp_path):
    """`exists` (a listing of the log) and `table_properties` (the newest checksum's metadata)
    answer what Delta answers, after creation, appends and property changes; without the
    checksum the properties come from Delta."""
    path = str(tmp_path / "props")
    (tmp_path / "empty" / "_delta_log").mkdir(parents=True)
    for nothing in (path, str(tmp_path / "empty"), str(tmp_path)):
        assert not delta_io.exists(spark, nothing) and not DeltaTable.isDeltaTable(spark, nothing)

    def set_on_table(shown: dict[str, str]) -> dict[str, str]:
        """Without the protocol's entries, which SHOW TBLPROPERTIES adds to the table's own."""
        protocol = ("delta.minReader", "delta.minWriter", "delta.feature.")
        return {k: v for k, v in shown.items() if not k.startswith(protocol)}

    def delta_says() -> dict[str, str]:
        return set_on_table(
            {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()}
        )

    spark.createDataFrame([], EVENTS).write.format("delta").option(
        "delta.enableChangeDataFeed", "false"
    ).save(path)
    assert delta_io.exists(spark, path) and DeltaTable.isDeltaTable(spark, path)
    assert delta_io.table_properties(spark, path) == delta_says()
    with pytest.raises(JobError, match="does not record its change data feed"):
        delta_io.require_change_feed(spark, path)
    spark.sql(
        f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
        "(delta.enableChangeDataFeed = true, delta.deletedFileRetentionDuration = 'interval 3 days')"
    )
    append(spark, path, [("a", 1, at(1))], EVENTS)
    assert delta_io.table_properties(spark, path) == delta_says()
    delta_io.require_change_feed(spark, path)
    assert delta_io.file_retention(spark, path) == timedelta(days=3)
    os.remove(os.path.join(path, "_delta_log", f"{delta_io.newest_logged(path):020d}.crc"))
    assert set_on_table(delta_io.table_properties(spark, path)) == delta_says()  # from Delta


def test_vacuumed_history_is_reported_before_reading(spark, tmp_path):
    path = str(tmp_path / "vacuumed")
    append(spark, path, [("a", 1, at(1))], EVENTS)
    append(spark, path, [("b", 2, at(2))], EVENTS)
    delta_io.check_retained(spark, path, 1)  # all there
    spark.sql(f"OPTIMIZE delta.`{path}`")
    vacuum(spark, path)
    # The files of version 1 as its checksum lists them, then (that checksum gone) as Delta does.
    for files_from in ("the checksum", "Delta"):
        assert (LocalLog.of(path).files(1) is None) == (files_from == "Delta")
        with pytest.raises(HistoryNotRetainedError) as error:
            delta_io.check_retained(spark, path, 1)
        assert "no longer retains 2 data file(s) of version 1" in str(error.value), files_from
        assert "VACUUM ran at" in str(error.value)
        assert "deletedFileRetentionDuration" in str(error.value)
        if files_from == "the checksum":
            os.remove(os.path.join(path, "_delta_log", f"{1:020d}.crc"))

    # Partition folders whose names Delta escapes in the log (a space, a colon) are found as they are.
    partitioned = str(tmp_path / "partitioned")
    spark.createDataFrame([("a b:c", 1, at(1))], EVENTS).write.format("delta").partitionBy("id").save(
        partitioned
    )
    assert any("%" in f["path"] for f in LocalLog.of(partitioned).files(0) or [])
    delta_io.check_retained(spark, partitioned, 0)


def test_set_up_made_the_driver_class_archive_and_drivers_map_it(spark):
    """The class archive `setup-jars` made beside the jars is current for this Java and these
    jars, the tests' driver was told to map it, and a driver that must map it (-Xshare:on: Java
    refuses to start otherwise) starts and runs a query."""
    assert archive_current(folder()), f"no current driver class archive in {folder()}: run `make setup`"
    options = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions")
    assert f"-XX:SharedArchiveFile={folder() / ARCHIVE}" in options.split()
    script = "from streamjoin.session import get_spark; print('rows', get_spark().range(3).count())"
    env = {**os.environ, "STREAMJOIN_JAVA_OPTIONS": f"-Xshare:on {SHORT_LIVED_JVM}"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "rows 3", done.stderr[-3000:]


def test_set_up_put_exactly_the_fetched_jars_on_the_classpath(spark):
    """Nothing is resolved at run time: the session uses the jars `setup-jars` fetched once."""
    jars = spark.sparkContext.getConf().get("spark.jars").split(",")
    assert any(os.path.basename(j).startswith("delta-spark_4.2_2.13-") for j in jars)
    assert sorted(jars) == sorted(str(p) for p in folder().glob("*.jar"))
    assert spark.sparkContext.getConf().get("spark.jars.packages", "") == ""
    spark_jars = {
        name.rsplit("-", 1)[0]
        for name in os.listdir(os.path.join(os.path.dirname(__import__("pyspark").__file__), "jars"))
    }
    assert not [
        j for j in jars if os.path.basename(j).rsplit("-", 1)[0] in spark_jars
    ]  # no second copy of Spark's own
