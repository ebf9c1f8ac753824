"""All Delta Lake reads and writes: snapshots, arrivals, idempotent slices, exactly-once batches.

A location is a Delta folder path or a metastore table name; every function takes either. The
change data feed gives each stream row its arrival (`_commit_version`, `_commit_timestamp`).
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import reduce
from urllib.parse import urlparse

from delta.tables import DeltaTable
from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, DataFrameReader, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamReader
from pyspark.sql.types import StructField, StructType, TimestampType

from streamjoin import hadoop_files
from streamjoin.delta_log import COMMIT_FILE, LocalLog, is_path, schema_string
from streamjoin.errors import HistoryNotRetainedError, JobError, StorageError, StreamJoinError
from streamjoin.frames import local_frame
from streamjoin.timeutil import from_spark

COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
CHANGE_TYPE = "_change_type"
_TIMESTAMP = TimestampType()


def _load(reader: DataFrameReader | DataStreamReader, location: str):
    return reader.load(location) if is_path(location) else reader.table(location)


# The schemes of S3, where Delta's default log store keeps a table's commits safe only while one
# Spark driver writes it (its put of a commit file is not exclusive), and the log store that
# makes several drivers safe there (each commit recorded in a DynamoDB table first).
_S3_SCHEMES = ("s3", "s3a", "s3n")
_MULTI_DRIVER_S3_STORE = "S3DynamoDBLogStore"


def single_driver_store(spark: SparkSession, location: str) -> bool:
    """Delta lets one Spark driver at a time write the tables at `location`: S3 with Delta's
    default log store (neither `spark.delta.logStore.<scheme>.impl` nor `spark.delta.logStore.class`
    names its DynamoDB log store). Local folders, HDFS, ABFS and GCS make a commit exclusive
    themselves, so concurrent writers there are safe (Delta refuses one of two conflicting commits)."""
    scheme = urlparse(location).scheme.lower()  # a catalog table's name has none: its store is the catalog's
    if scheme not in _S3_SCHEMES:
        return False
    store = spark.conf.get(f"spark.delta.logStore.{scheme}.impl", None) or spark.conf.get(
        "spark.delta.logStore.class", None
    )
    return _MULTI_DRIVER_S3_STORE not in (store or "")


def exists(spark: SparkSession, location: str) -> bool:
    """True when `location` holds a Delta table. A local folder does when its log holds a commit,
    and does not without a log (a listing, where asking Delta costs Py4J calls and a look at its
    cached log; every run asks of each table it touches); Delta answers for the rest."""
    log = LocalLog.of(location)
    if log is not None and log.versions():
        return True
    if log is not None and not log.exists():
        return False
    if is_path(location):
        return DeltaTable.isDeltaTable(spark, location)
    return spark.catalog.tableExists(location)


def _table(spark: SparkSession, location: str) -> DeltaTable:
    if not exists(spark, location):
        raise JobError(f"{location!r} is not a Delta table (no _delta_log there); create it or fix the path")
    return DeltaTable.forPath(spark, location) if is_path(location) else DeltaTable.forName(spark, location)


def delete_table(spark: SparkSession, location: str) -> bool:
    """Delete the Delta table at `location` (its folder on any Hadoop file system, or a metastore
    table); False when there was none."""
    if not exists(spark, location):
        return False
    if not is_path(location):
        spark.sql(f"DROP TABLE {location}")
        return True
    hadoop_files.remove(location, recursive=True)
    return True


def schema(spark: SparkSession, location: str) -> StructType:
    """The current schema of a Delta table."""
    return _table(spark, location).toDF().schema


# Operations that rewrite files without changing a row, or change only the table's metadata: the
# change feed holds nothing for them.
_ROWLESS = frozenset(
    {"OPTIMIZE", "VACUUM START", "VACUUM END", "SET TBLPROPERTIES", "UNSET TBLPROPERTIES", "ADD COLUMNS"}
)


@dataclass(frozen=True)
class Commit:
    """One entry of a table's history."""

    version: int
    timestamp: datetime
    operation: str
    mode: str | None = None  # a write's mode (Append, Overwrite), when the log records one
    enables_row_tracking: bool = False  # the commit turned on (or backfilled) row tracking
    output_rows: int | None = None  # Delta's `numOutputRows` metric, when the log records it

    @property
    def appended_rows(self) -> int | None:
        """How many rows the commit inserted, known from the log alone: a write in append mode (its
        `numOutputRows`), 0 for an operation that changes no row; None when only its change feed can
        tell (another operation, or a log without metrics)."""
        operation = self.operation.upper()
        if operation in _ROWLESS:
            return 0
        if operation in ("WRITE", "STREAMING UPDATE") and (self.mode or "").lower() == "append":
            return self.output_rows
        return self.output_rows if operation == "CREATE TABLE AS SELECT" else None

    @property
    def created_rows(self) -> int | None:
        """Of a table's first commit (version 0): how many rows it created the table with, known
        from the log alone (a table created empty by DDL holds none; one created by a write holds
        the `numOutputRows` it wrote); None when only its rows can tell."""
        operation = self.operation.upper()
        if operation == "CREATE TABLE":
            return 0
        if operation in ("WRITE", "CREATE TABLE AS SELECT"):
            return self.output_rows
        return self.appended_rows

    @property
    def rewrites_rows(self) -> bool:
        """The commit may update or delete rows: refused on an append-only stream source."""
        operation = self.operation.upper()
        if operation in ("DELETE", "UPDATE", "MERGE", "TRUNCATE", "RESTORE") or operation.startswith(
            "REPLACE"
        ):
            return True
        return operation in ("WRITE", "STREAMING UPDATE", "CREATE OR REPLACE TABLE AS SELECT") and (
            self.mode or ""
        ).lower() in ("overwrite", "complete")


def history(
    spark: SparkSession, location: str, since: int | None = None, upto: int | None = None
) -> list[Commit]:
    """The retained commits of a table, oldest first; with `since`, only those from that version on.

    A table in a local folder whose commits carry in-commit timestamps (streamjoin's session turns
    them on for the tables it creates) is read from its log files: the commit's first action is
    then its `commitInfo`, which holds what Delta's history reports, and Delta's own history costs
    a Spark query (80 ms in a warm driver, 200 ms in a busy one) that the runners would pay several
    times per micro-batch and replay. Any other table goes through Delta (`_history_by_delta`)."""
    logged = _history_in_log(location, since)
    return logged if logged is not None else _history_by_delta(spark, location, since, upto)


def _history_in_log(location: str, since: int | None) -> list[Commit] | None:
    """The commits from `since` on, read from a local table's log; None where Delta must answer: a
    table that is not a local folder, or a commit without an in-commit timestamp (Delta then takes
    its time from the file, adjusted to keep times increasing)."""
    log = LocalLog.of(location)
    versions = [] if log is None else log.versions()
    if log is None or not versions:
        return None  # not local, or not a Delta table: Delta's answer says so
    commits = []
    for version in versions if since is None else [v for v in versions if v >= since]:
        info = log.commit_info(version)  # None: cleaned up since the listing, or being written
        if info is None or info.get("inCommitTimestamp") is None:
            return None
        parameters, metrics = info.get("operationParameters") or {}, info.get("operationMetrics") or {}
        operation = info.get("operation") or ""
        commits.append(
            Commit(
                version,
                # as Spark hands a timestamp column back (naive, local time), which Delta's history is
                _TIMESTAMP.fromInternal(int(info["inCommitTimestamp"]) * 1000),
                operation,
                _mode(parameters),
                _enables_row_tracking(operation, parameters),
                _output_rows(metrics),
            )
        )
    return commits


def _history_by_delta(
    spark: SparkSession, location: str, since: int | None, upto: int | None
) -> list[Commit]:
    """`history` through Delta's DeltaTable.history, reading only the newest entries of the log
    when `since` is given. `upto`, when the caller knows the table's newest version, saves looking
    it up (if the table has moved on, it is looked up)."""
    table = _table(spark, location)

    def newest(count: int | None = None) -> list:
        entries = table.history() if count is None else table.history(count)
        return entries.select(
            "version", "timestamp", "operation", "operationParameters", "operationMetrics"
        ).collect()

    if since is None:
        rows = newest()
    else:
        rows = newest(max((upto if upto is not None else latest_version(spark, location)) - since + 1, 1))
        if upto is not None and min((r.version for r in rows), default=since) > since:
            rows = newest(max(latest_version(spark, location) - since + 1, 1))
    commits = (
        Commit(
            r.version,
            r.timestamp,
            r.operation,
            _mode(r.operationParameters or {}),
            _enables_row_tracking(r.operation, r.operationParameters or {}),
            _output_rows(r.operationMetrics or {}),
        )
        for r in rows
        if since is None or r.version >= since
    )
    return sorted(commits, key=lambda c: c.version)


def _mode(parameters: dict) -> str | None:
    """A write's mode: `mode` of a batch write, `outputMode` of a streaming one."""
    return parameters.get("mode") or parameters.get("outputMode")


def _output_rows(metrics: dict) -> int | None:
    written = metrics.get("numOutputRows")
    return int(written) if written is not None and written.isdigit() else None


def _enables_row_tracking(operation: str, parameters: dict) -> bool:
    return "ROW TRACKING" in operation.upper() or (
        operation.upper() in ("SET TBLPROPERTIES", "ALTER TABLE") and "enableRowTracking" in str(parameters)
    )


def latest_version(spark: SparkSession, location: str) -> int:
    """The newest version of a table, from a listing of its log folder: Delta's own history(1)
    runs a Spark job for it (0.15 s each, several times per run), a listing takes milliseconds."""
    return logged_versions(spark, location)[1]


def version_at(spark: SparkSession, location: str, when: datetime) -> int:
    """The newest version committed at or before `when` (Delta time travel by timestamp); a naive
    `when` is read as Spark hands timestamps back (timeutil.from_spark)."""
    when = from_spark(when)
    candidates = [c.version for c in history(spark, location) if from_spark(c.timestamp) <= when]
    if not candidates:
        raise HistoryNotRetainedError(f"{location!r} has no retained version at or before {when.isoformat()}")
    return candidates[-1]


def oldest_version(spark: SparkSession, location: str) -> int:
    """The oldest version whose log entry Delta still keeps (older ones were cleaned up)."""
    return logged_versions(spark, location)[0]


def logged_versions(spark: SparkSession, location: str) -> tuple[int, int]:
    """(oldest, newest) version whose log entry Delta keeps, from a listing of the log folder: no
    log entry is read."""
    root = _root(spark, location)
    log = LocalLog.of(root)
    if log is not None:
        versions = log.versions()
    else:
        jvm = spark.sparkContext._jvm
        assert jvm is not None  # set while the SparkContext is running, as it is for a live session
        path = jvm.org.apache.hadoop.fs.Path(f"{root.rstrip('/')}/_delta_log")
        fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        names = [status.getPath().getName() for status in fs.listStatus(path)] if fs.exists(path) else []
        versions = [int(m.group(1)) for m in map(COMMIT_FILE.match, names) if m]
    if not versions:
        raise JobError(
            f"{location!r} is not a Delta table (no commits in its _delta_log); create it or fix the path"
        )
    return min(versions), max(versions)


def oldest_retained(spark: SparkSession, location: str) -> Commit:
    """The oldest commit whose log entry Delta still keeps, with its time and operation."""
    return history(spark, location, since=oldest_version(spark, location))[0]


def _root(spark: SparkSession, location: str) -> str:
    """The folder of a table: the path itself, or where the metastore keeps a named table."""
    if is_path(location):
        return location
    detail = spark.sql(f"DESCRIBE DETAIL {location}").first()
    assert detail is not None  # DESCRIBE DETAIL returns exactly one row
    return detail.location


def damaged_commit(location: str, upto: int | None = None) -> tuple[int, str] | None:
    """The first commit of a local table's log, up to `upto`, that Delta reads as JSON (those
    after its newest checkpoint) and that does not parse, with what is wrong with it; None when
    they all parse, or the table is not in a local folder. A commit file is written whole (Delta
    renames it into place), so one that does not parse is damaged, not being written."""
    log = LocalLog.of(location)
    return None if log is None else log.damaged(upto)


def check_log(location: str, upto: int) -> None:
    """Refuse a local table whose log, up to version `upto`, holds a commit that does not parse,
    before Delta reads it: Delta fails on it deep inside a query, without naming the file, and
    what reads only the table's schema does not notice it."""
    found = damaged_commit(location, upto)
    if found is not None:
        raise damaged_log(location, *found)


def read_snapshot(spark: SparkSession, location: str, version: int | None = None) -> DataFrame:
    """The table as of `version` (time travel), or as it is now."""
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return _load(reader, location)


def read_own(spark: SparkSession, location: str, schema: StructType) -> DataFrame | None:
    """A table streamjoin keeps for itself (the arrival index: appended to, never partitioned, no
    row tracking) as it is now, in `schema` (columns it lacks read as NULL); None if there is none.

    A local table whose newest checksum lists its files (`LocalLog.files`) is read as those
    Parquet files: they are the table's current version, and Delta would first rebuild that
    version's state with a Spark job (after every append: the index is appended to by every run)
    and list its files with another. Any other table is read through Delta."""
    newest = newest_logged(location)
    if newest is None or newest == -1:
        if newest is not None or not exists(spark, location):
            return None
        return read_snapshot(spark, location)
    log = LocalLog.of(location)
    assert log is not None  # a table whose newest version was logged is a local one
    files = log.files(newest)
    if files is None or any(f.get("partitionValues") for f in files):
        return read_snapshot(spark, location)
    if not files:
        return local_frame(spark, [], schema)
    return spark.read.schema(schema).parquet(*log.paths(files))


def require_change_feed(spark: SparkSession, location: str) -> None:
    """Stream sources need their change data feed: it records each row's arrival."""
    if table_properties(spark, location).get("delta.enableChangeDataFeed", "false").lower() != "true":
        raise JobError(
            f"{location!r} does not record its change data feed, which streamjoin reads for each row's "
            f"commit version and time; run ALTER TABLE {_sql_name(location)} SET TBLPROPERTIES "
            "(delta.enableChangeDataFeed = true) before writing events (rows written earlier cannot be replayed)"
        )


def table_properties(spark: SparkSession, location: str) -> dict[str, str]:
    """The properties set on a table (`delta.enableChangeDataFeed`, ...). A local table's come from
    the checksum of its newest version, which holds its metadata (a file read, where `SHOW
    TBLPROPERTIES` is parsed, planned and run as a Spark job); without that checksum, from the
    statement."""
    log = LocalLog.of(location)
    configuration = None if log is None else log.properties()
    if configuration is not None:
        return configuration
    return {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES {_sql_name(location)}").collect()}


def set_table_property(spark: SparkSession, location: str, key: str, value: str) -> None:
    """Set one property of a table (a metadata-only commit)."""
    spark.sql(f"ALTER TABLE {_sql_name(location)} SET TBLPROPERTIES ('{key}' = '{value}')")


def _sql_name(location: str) -> str:
    return f"delta.`{location}`" if is_path(location) else location


def read_changes(spark: SparkSession, location: str, upto_version: int, from_version: int = 0) -> DataFrame:
    """Row changes of commits [from_version, upto_version] from the change data feed: inserts, update
    post-images and deletes, with `_change_type`, `_commit_version` and `_commit_timestamp`, in the
    columns of `upto_version`'s schema.

    Delta reads a change feed in one schema and refuses a range over which a column was dropped or
    renamed. So the range is read in runs of versions of one schema (`schema_spans`), each in its
    own, and each run's rows are put in the end version's columns (`_conform`): a column is found
    by its column-mapping id, so a renamed one keeps its values, and one a run lacks is NULL there."""
    with translated_errors(location, f"the schema of versions {from_version} to {upto_version}"):
        spans = schema_spans(spark, location, from_version, upto_version)
    ends = [span.first - 1 for span in spans[1:]] + [upto_version]
    parts = []
    for span, end in zip(spans, ends, strict=True):
        reader = (
            spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", span.first)
            .option("endingVersion", end)
        )
        with translated_errors(location, f"the change data feed of versions {span.first} to {end}"):
            part = _load(reader, location)
        parts.append(part if len(spans) == 1 else _conform(part, span.schema, spans[-1].schema))
    return reduce(DataFrame.unionByName, parts).where(F.col(CHANGE_TYPE) != "update_preimage")


@dataclass(frozen=True)
class SchemaSpan:
    """A table's schema from version `first` on, until the next span's first version. Its fields
    keep Delta's column-mapping metadata (`delta.columnMapping.id`) where the log holds it."""

    first: int
    schema: StructType


def schema_spans(spark: SparkSession, location: str, since: int, upto: int) -> list[SchemaSpan]:
    """The table's schemas over versions [since, upto], oldest first: the one in effect at `since`,
    then one for each later commit that changed it (a `metaData` action with another schema).
    Read from the log's commit files (`_logged_schema`)."""
    spans = [SchemaSpan(since, _schema_at(spark, location, since))]
    for version in range(since + 1, upto + 1):
        changed = _logged_schema(spark, location, version)
        if changed is not None and changed != spans[-1].schema:
            spans.append(SchemaSpan(version, changed))
    return spans


def column_id(field: StructField) -> int | None:
    """A column's column-mapping id (stable across renames); None without column mapping."""
    value = field.metadata.get("delta.columnMapping.id")
    return value if isinstance(value, int) else None


def _schema_at(spark: SparkSession, location: str, version: int) -> StructType:
    """The schema of `version`: from its checksum, else from the newest commit at or before it that
    set one, else (the log holds it only in a checkpoint) from Delta, without column-mapping ids."""
    log = LocalLog.of(location)
    logged = ((None if log is None else log.checksum(version)) or {}).get("metadata") or {}
    if isinstance(logged.get("schemaString"), str):
        return _parsed_schema(logged["schemaString"])
    oldest = logged_versions(spark, location)[0]
    for earlier in range(version, oldest - 1, -1):
        logged = _logged_schema(spark, location, earlier)
        if logged is not None:
            return logged
    return read_snapshot(spark, location, version).schema


def _logged_schema(spark: SparkSession, location: str, version: int) -> StructType | None:
    """The schema a commit set (its `metaData` action), or None if it set none or its file cannot
    be read (Delta's own read of the version then says why)."""
    log = LocalLog.of(location)
    try:
        if log is not None:
            text = log.schema_string(version)
        else:
            text = schema_string(_remote_commit_lines(spark, location, version))
    except (OSError, Py4JJavaError):
        return None
    return None if text is None else _parsed_schema(text)


def _remote_commit_lines(spark: SparkSession, location: str, version: int) -> list[str]:
    """The lines of a commit file on another file system, read through Hadoop."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # set while the SparkContext is running, as it is for a live session
    path = jvm.org.apache.hadoop.fs.Path(
        f"{_root(spark, location).rstrip('/')}/_delta_log/{version:020d}.json"
    )
    stream = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).open(path)
    try:
        return jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8").splitlines()
    finally:
        stream.close()


def _parsed_schema(schema_string: str) -> StructType:
    return StructType.fromJson(json.loads(schema_string))


def in_columns(frame: DataFrame, columns: StructType) -> DataFrame:
    """A source's rows in `columns` (the job's view of its schema), found by name: a column the rows
    were read without (one added since) is NULL, one the job does not know (dropped since) is left
    out; the change feed's own columns kept. Rows read over versions of different schemas so
    become one frame."""
    return _conform(frame, frame.schema, columns)


def _conform(frame: DataFrame, have: StructType, want: StructType) -> DataFrame:
    """Rows read in schema `have` put in the columns of `want`: each column found by its
    column-mapping id (by name without one), cast where its type was widened, NULL where `have`
    has no such column; the change feed's own columns kept."""
    by_id = {column_id(f): f for f in have.fields if column_id(f) is not None}
    by_name = {f.name.lower(): f for f in have.fields}
    columns = []
    for field in want.fields:
        key = column_id(field)
        found = by_id.get(key) if key is not None and by_id else by_name.get(field.name.lower())
        if found is None:
            columns.append(F.lit(None).cast(field.dataType).alias(field.name))
        elif found.dataType != field.dataType:
            columns.append(F.col(f"`{found.name}`").cast(field.dataType).alias(field.name))
        else:
            columns.append(F.col(f"`{found.name}`").alias(field.name))
    feed = [c for c in (CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP) if c in frame.columns]
    return frame.select(*columns, *feed)


def read_inserts(spark: SparkSession, location: str, upto_version: int, from_version: int = 0) -> DataFrame:
    """Rows inserted by commits [from_version, upto_version], with their commit version and time."""
    changes = read_changes(spark, location, upto_version, from_version)
    return changes.where(F.col(CHANGE_TYPE) == "insert").drop(CHANGE_TYPE)


def stream_changes(
    spark: SparkSession,
    location: str,
    max_files_per_trigger: int | None = None,
    starting_version: int = 0,
    schema_log: str | None = None,
    columns: StructType | None = None,
) -> DataFrame:
    """A streaming DataFrame of the change data feed (every change type, with `_change_type`,
    commit version and time), from `starting_version` on, which need not exist yet (Delta itself
    refuses a starting version newer than the table: the stream starts one earlier and filters).

    `schema_log`: a folder under the query's checkpoint where Delta tracks the schema it reads
    (`schemaTrackingLocation`). A stream then follows columns dropped or renamed in the table,
    where without it Delta refuses to read past the change: at each change the query stops
    (DELTA_STREAMING_METADATA_EVOLUTION, `schema_evolved`) and, started again, goes on in the new
    schema. Drops and renames are let through (the caller has checked, before each start, that
    the job uses no column they touch). `columns`: the columns to give, by name, NULL where the
    schema read at the time lacks one (a column added later)."""
    reader = (
        spark.readStream.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", max(starting_version - 1, 0))
    )
    if max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
    if schema_log:
        reader = reader.options(
            schemaTrackingLocation=schema_log,
            allowSourceColumnDrop="always",
            allowSourceColumnRename="always",
        )
    changes = _load(reader, location)
    if columns is not None:
        changes = in_columns(changes, columns)
    return changes.where(F.col(COMMIT_VERSION) >= starting_version) if starting_version else changes


def stream_inserts(
    spark: SparkSession,
    location: str,
    max_files_per_trigger: int | None = None,
    starting_version: int = 0,
    schema_log: str | None = None,
    columns: StructType | None = None,
) -> DataFrame:
    """A streaming DataFrame of inserted rows with their commit version and time, from
    `starting_version`; `schema_log` and `columns` as for `stream_changes`."""
    changes = stream_changes(spark, location, max_files_per_trigger, starting_version, schema_log, columns)
    return changes.where(F.col(CHANGE_TYPE) == "insert").drop(CHANGE_TYPE)


def schema_evolved(error: BaseException) -> bool:
    """The error a stream with a schema log stops with at a schema change, to be started again."""
    return "DELTA_STREAMING_METADATA_EVOLUTION" in str(error)


def check_retained(spark: SparkSession, location: str, version: int) -> None:
    """Fail before any data moves when the log entry or the data files of `version` are gone.

    Only the snapshot a run reads is checked (its log entry and its files), never the table's
    whole history: a run reads a pinned snapshot, not the commits before it.
    """
    oldest, newest = logged_versions(spark, location)
    if not 0 <= version <= newest:
        raise JobError(
            f"{location!r} has no version {version}: its versions run from {oldest} to {newest}; pin one of those"
        )
    if version < oldest:
        first = oldest_retained(spark, location)
        raise HistoryNotRetainedError(
            f"{location!r} no longer retains version {version} in its log (oldest retained: {first.version}, "
            f"committed {first.timestamp}); pin version {first.version} or newer, or keep the log longer "
            "with delta.logRetentionDuration"
        )
    log = LocalLog.of(location)
    logged = None if log is None else log.files(version)
    if log is not None and logged is not None:  # the files as the version's checksum lists them: no Spark job
        missing = [path for path in log.paths(logged) if not os.path.exists(path)]
    else:
        with translated_errors(location, f"version {version}"):
            files = read_snapshot(spark, location, version).inputFiles()
        missing = [f for f in files if not _file_exists(f)]
    if missing:
        vacuums = [
            c for c in history(spark, location, since=version) if c.operation.upper().startswith("VACUUM")
        ]
        when = f" (VACUUM ran at {vacuums[-1].timestamp})" if vacuums else ""
        raise HistoryNotRetainedError(
            f"{location!r} no longer retains {len(missing)} data file(s) of version {version}{when}, e.g. "
            f"{missing[0]}. Pin a newer version (a backfill pins the latest when it starts), or keep files "
            "longer with delta.deletedFileRetentionDuration and VACUUM ... RETAIN"
        )


_NOT_RETAINED = (
    "DELTA_UNSUPPORTED_TIME_TRAVEL_BEYOND_DELETED_FILE_RETENTION_DURATION",
    "DELTA_VERSION_NOT_FOUND",
    "DELTA_CHANGE_DATA_FILE_NOT_FOUND",
    "FILE_NOT_EXIST",
    "DELTA_FILE_NOT_FOUND",
    "DELTA_LOG_FILE_NOT_FOUND",
    "DELTA_CANNOT_TIME_TRAVEL_VIEWS",
    "VersionNotFoundException",
)


@contextmanager
def translated_errors(location: str, what: str, advice: str | None = None):
    """Turn Delta's refusals to read history it no longer keeps into a HistoryNotRetainedError that
    says what to change (Spark's own message is a page of Java frames); `advice` replaces the
    default of what to do."""
    try:
        yield
    except HistoryNotRetainedError:
        raise
    except Exception as exc:
        text = str(exc)
        reason = next((r for r in _NOT_RETAINED if r in text), None)
        if reason is None:
            raise
        raise HistoryNotRetainedError(
            f"{location!r} no longer retains {what} ({reason}). Delta removes data files older than "
            "delta.deletedFileRetentionDuration (7 days by default) and log entries older than "
            "delta.logRetentionDuration (30 days). "
            + (
                advice
                or "Read newer versions, start the job later (start_at), or enable row tracking on the source "
                "(ALTER TABLE ... SET TBLPROPERTIES (delta.enableRowTracking = true)) so that streamjoin reads "
                "rows from the latest snapshot instead of old change files"
            )
        ) from None


# ---------------------------------------------------------------------------- storage faults
#
# `storage_fault` turns what storage answers a failed read or write with (a full disk, a folder
# that cannot be written, a damaged Delta log entry: Java exceptions from Spark, Delta and Hadoop,
# or Python's OSError) into a StorageError: one paragraph naming the table, the file, what failed
# and what to do. The CLI applies it to whatever reaches it, the runners where they write.

# (markers in the message, errnos, what failed, what to do); the first that matches tells the fault.
_FAULTS: tuple[tuple[tuple[str, ...], frozenset[int], str, str], ...] = (
    (
        ("No space left on device", "ENOSPC", "DiskOutOfSpace", "Disk quota exceeded"),
        frozenset({errno.ENOSPC, errno.EDQUOT}),
        "the disk is full (no space left on device)",
        "free space on that disk, or move the table to one with room, then run the command again",
    ),
    (
        ("Read-only file system", "EROFS"),
        frozenset({errno.EROFS}),
        "the file system is read-only",
        "mount it writable, or point the job's output (or --checkpoint) at a writable folder, then run "
        "the command again",
    ),
    (
        ("AccessDeniedException", "Permission denied", "EACCES"),
        frozenset({errno.EACCES, errno.EPERM}),
        "permission denied",
        "give the user running streamjoin read and write access to that folder (chmod, chown), or "
        "point the job at a folder it may write, then run the command again",
    ),
    (
        ("Not a directory", "ParentNotDirectoryException", "ENOTDIR", "is not a directory"),
        frozenset({errno.ENOTDIR}),
        "a file stands where a folder must be",
        "move that file away or point the job at another folder, then run the command again",
    ),
)
_DAMAGED_LOG = (
    "JsonParseException",
    "JsonMappingException",
    "JsonEOFException",
    "DELTA_LOG_FILE_CORRUPT",
    "DELTA_INVALID_COMMIT",
)
_NOT_CREATED = ("DELTA_CANNOT_CREATE_LOG_PATH", "Mkdirs failed to create")
_PATH = re.compile(r"(?:file:)?(/[^\s'\"(),;\]\[]+)")
_COMMIT = re.compile(r"(.*)/_delta_log/(\d{20})\.(?:json|checkpoint[^/]*)$")


def storage_fault(exc: BaseException, tables: Iterable[str] = ()) -> StorageError | None:
    """`exc` as a StorageError when it is a storage fault (else None): which table (of `tables`,
    or the one a Delta log file named belongs to), which file, what failed, what to do."""
    if isinstance(exc, StorageError):
        return exc
    text = _fault_text(exc)
    path = getattr(exc, "filename", None) if isinstance(exc, OSError) else None
    path = str(path) if path else _named_path(text)
    code = exc.errno if isinstance(exc, OSError) else None
    if code is None and any(marker in text for marker in _NOT_CREATED):
        code = _why_not_created(path)  # Delta and Hadoop say only that the folder was not made
    for markers, codes, what, advice in _FAULTS:
        if code in codes or any(marker in text for marker in markers):
            return StorageError(f"{_where(path, tables)}: {what}. To go on, {advice}")
    marker = next((m for m in _DAMAGED_LOG if m in text), None)
    return None if marker is None else _damaged(path, list(tables), _line_with(text, marker))


def _why_not_created(path: str | None) -> int | None:
    """Why a local folder could not be made, as the errno its creation would have failed with: a
    file above it, a read-only file system, or a folder above it this user may not write."""
    if path is None or _file_above(path):
        return None if path is None else errno.ENOTDIR
    folder = os.path.dirname(path)
    while folder not in ("", "/") and not os.path.exists(folder):
        folder = os.path.dirname(folder)
    if not folder or not os.path.isdir(folder):
        return None
    if os.statvfs(folder).f_flag & os.ST_RDONLY:
        return errno.EROFS
    return None if os.access(folder, os.W_OK) else errno.EACCES


def _damaged(path: str | None, tables: list[str], detail: str) -> StorageError | None:
    """A damaged Delta log entry: the commit named, else the first damaged one among `tables`
    (local tables' logs are read to find it); None when neither tells (a JSON error elsewhere)."""
    logged = _COMMIT.match(path or "")
    if logged:
        return damaged_log(logged.group(1), int(logged.group(2)), detail)
    for table in tables:
        found = damaged_commit(table)
        if found is not None:
            return damaged_log(table, found[0], found[1])
    return None


def damaged_log(table: str, version: int, detail: str) -> StorageError:
    """The error for commit `version` of a table's Delta log, which cannot be parsed."""
    return StorageError(
        f"table {table}: commit {version} ({table}/_delta_log/{version:020d}.json) of its Delta log is damaged and cannot be read ({detail}); Delta cannot "
        "read the table past it. Restore that file from a copy (or have the table's writer commit it "
        "again), then run the command again; streamjoin reads nothing of the table until it parses"
    )


@contextmanager
def translated_storage_faults(tables: Iterable[str]) -> Iterator[None]:
    """Raise storage faults inside as a StorageError naming one of `tables` (others pass unchanged)."""
    try:
        yield
    except StreamJoinError:
        raise
    except Exception as exc:
        fault = storage_fault(exc, list(tables))
        if fault is None:
            raise
        raise fault from None


def _fault_text(exc: BaseException) -> str:
    """What an exception says, with the class and message of each Java exception it wraps and of
    the Python exceptions that caused it."""
    parts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(parts) < 10:
        parts.append(f"{type(seen).__name__}: {seen}")
        java = getattr(seen, "java_exception", None) or getattr(seen, "_origin", None)
        for _ in range(10):
            if java is None:
                break
            try:
                parts.append(f"{java.getClass().getName()}: {java.getMessage()}")
                java = java.getCause()
            except Exception:  # a Java object the gateway no longer answers for
                break
        seen = seen.__cause__ or seen.__context__
    return "\n".join(parts)


def _named_path(text: str) -> str | None:
    """The first file path a message names (a Delta log file first: it names the commit)."""
    paths = [p.rstrip(".:") for p in _PATH.findall(text)]
    logged = [p for p in paths if _COMMIT.match(p)]
    return (logged or paths or [None])[0]


def _table_of(path: str | None, tables: Iterable[str]) -> str | None:
    """The table a file belongs to: the one whose log it is, else the nearest folder at or above
    it holding a Delta log (local files), else the longest of `tables` (or of their side tables,
    `<table>_<side>`) holding it."""
    if path is None:
        return None
    if "/_delta_log" in path:
        return path.split("/_delta_log", 1)[0]
    folder = path
    while folder not in ("", "/"):
        if os.path.isdir(os.path.join(folder, "_delta_log")):
            return folder
        folder = os.path.dirname(folder)
    holding = [t for t in tables if path == t or path.startswith(t.rstrip("/") + "/")]
    sides = [m.group(0) for t in tables if (m := re.match(re.escape(t.rstrip("/")) + r"_[a-z]+\b", path))]
    return max(holding + sides, key=len) if holding or sides else None


def _where(path: str | None, tables: Iterable[str]) -> str:
    """Which table and which file: `table T, FILE` (a commit of a log by its number)."""
    table = _table_of(path, list(tables))
    logged = _COMMIT.match(path or "")
    file = f"commit {int(logged.group(2))} ({path})" if logged else (path or "a file it wrote or read")
    blocker = _file_above(path)
    file += f", under {blocker}, which is a file" if blocker else ""
    return f"table {table}" + ("" if file == table else f", {file}") if table else file


def _file_above(path: str | None) -> str | None:
    """The nearest existing folder above `path` that is a file (what stops a folder being made)."""
    folder = os.path.dirname(path or "")
    while folder not in ("", "/") and not os.path.exists(folder):
        folder = os.path.dirname(folder)
    return folder if folder not in ("", "/") and os.path.isfile(folder) else None


def _line_with(text: str, marker: str) -> str:
    """The line of a message that holds `marker`, without the exception's class, at most 200 characters."""
    line = next((part for part in text.splitlines() if marker in part), marker)
    return line.split(": ", 1)[-1].strip()[:200]


def file_retention(spark: SparkSession, location: str) -> timedelta:
    """How long VACUUM keeps files a table no longer references (delta.deletedFileRetentionDuration)."""
    text = table_properties(spark, location).get("delta.deletedFileRetentionDuration", "interval 7 days")
    match = re.match(r"^\s*interval\s+(\d+)\s+(\w+?)s?\s*$", text, re.IGNORECASE)
    units = {"week": 604_800, "day": 86_400, "hour": 3_600, "minute": 60, "second": 1}
    if not match or match.group(2).lower() not in units:
        return timedelta(days=7)
    return timedelta(seconds=int(match.group(1)) * units[match.group(2).lower()])


def change_files_kept(spark: SparkSession, location: str, since: int) -> bool:
    """Whether every file that the commits from version `since` on added can still be read: the log
    holds them, no OPTIMIZE or VACUUM ran since, and the oldest is younger than the file retention."""
    commits = history(spark, location, since=since)
    if not commits or commits[0].version != since:
        return False
    if any(c.operation.upper().startswith(("OPTIMIZE", "VACUUM", "REORG")) for c in commits):
        return False
    oldest = commits[0].timestamp
    oldest = oldest.astimezone(UTC) if oldest.tzinfo is None else oldest
    return oldest >= datetime.now(UTC) - file_retention(spark, location)


def vacuum_note(spark: SparkSession, locations: list[str]) -> str:
    """Where and when VACUUM last ran among `locations`, for an error about missing files ("" if never)."""
    notes = []
    for location in locations:
        vacuums = [
            c
            for c in history(spark, location, since=oldest_version(spark, location))
            if c.operation.upper().startswith("VACUUM")
        ]
        if vacuums:
            notes.append(f"VACUUM ran at {vacuums[-1].timestamp} on {location!r}")
    return f" ({'; '.join(notes)})" if notes else ""


def row_tracking(spark: SparkSession, location: str, version: int | None = None) -> bool:
    """Whether the table (as of `version`) gives each row the version that inserted it
    (`_metadata.row_commit_version`, Delta row tracking). Reads no data."""
    metadata = read_snapshot(spark, location, version).select("_metadata").schema["_metadata"].dataType
    assert isinstance(metadata, StructType)  # Delta's _metadata column is always a struct
    return "row_commit_version" in metadata.fieldNames()


def read_rows(spark: SparkSession, location: str, version: int | None = None) -> DataFrame:
    """The snapshot at `version` (default: as it is now, which needs no time travel), each row with
    the version that inserted it as `_commit_version` (row tracking; OPTIMIZE keeps it). Filters on
    the rows' columns skip files by their statistics."""
    with translated_errors(
        location, "its newest files" if version is None else f"the files of version {version}"
    ):
        snapshot = read_snapshot(spark, location, version)
    return snapshot.select("*", F.col("_metadata.row_commit_version").cast("long").alias(COMMIT_VERSION))


def _file_exists(uri: str) -> bool:
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return os.path.exists(parsed.path)
    return hadoop_files.exists(uri)


def write_slice(
    df: DataFrame,
    location: str,
    time_column: str,
    start: datetime,
    end: datetime,
    partition_by: tuple[str, ...] = (),
) -> None:
    """Replace the rows whose `time_column` lies in [start, end) with `df`: re-running a slice is safe.

    When every row the table holds lies in the slice (a replay of the whole range, or a first
    write), replacing the slice is replacing the table: a plain overwrite, which Delta does without
    reading the old files (replaceWhere reads them to find the rows to delete, and with the change
    data feed on writes them out again). An overwrite removes exactly the files it read, so rows
    another writer committed meanwhile stay (Delta may refuse one of the two commits instead).
    Which case applies is read from the files' min/max statistics in the log, not from the rows.
    """
    spark = df.sparkSession
    predicate = (
        f"`{time_column}` >= TIMESTAMP '{start.strftime('%Y-%m-%d %H:%M:%S.%f')}' AND "
        f"`{time_column}` < TIMESTAMP '{end.strftime('%Y-%m-%d %H:%M:%S.%f')}'"
    )
    writer = df.write.format("delta").mode("overwrite")
    if exists(spark, location) and not _inside(spark, location, time_column, start, end):
        writer = writer.option("replaceWhere", predicate)
    elif partition_by:
        writer = writer.partitionBy(*partition_by)
    _save(writer, location)


def _inside(spark: SparkSession, location: str, time_column: str, start: datetime, end: datetime) -> bool:
    """Every row of the table has its `time_column` in [start, end) (or the table is empty).

    Answered from the files' statistics in the table's checksum where it lists them
    (`_inside_by_checksum`: a file read); otherwise by MIN and MAX over the table: two Spark jobs
    that scan it (Delta does not answer them from the statistics, where it keeps timestamps cut to
    the millisecond). The column is never NULL in streamjoin's outputs.
    """
    known = _inside_by_checksum(location, time_column, from_spark(start), from_spark(end))
    if known is not None:
        return known
    column = F.col(f"`{time_column}`")
    bounds = read_snapshot(spark, location).agg(F.min(column), F.max(column)).first()
    assert bounds is not None  # an aggregate without grouping returns exactly one row
    low, high = bounds
    if low is None:
        return True
    return from_spark(start) <= from_spark(low) and from_spark(high) < from_spark(end)


def _inside_by_checksum(location: str, column: str, start: datetime, end: datetime) -> bool | None:
    """`_inside` told from the table's checksum (`_checksum_ranges`), or None when it cannot tell.
    Rows within 1 ms of either bound may count as not inside, which costs the slower replaceWhere,
    never a wrong answer."""
    ranges = _time_ranges(location, column)
    if ranges is None:
        return None
    return all(start <= low and high <= end for low, high in ranges)


def holds_rows(spark: SparkSession, location: str, column: str, start: datetime, end: datetime) -> bool:
    """Whether the table may hold rows whose `column` lies in [start, end): False when there is no
    table, or when the statistics in its checksum (`LocalLog.time_ranges`) put every file's rows outside
    the range; True otherwise, also when they cannot tell. A read of the log, no Spark job: the
    replay skips rewriting a side table's slice that was and stays empty."""
    if not exists(spark, location):
        return False
    ranges = _time_ranges(location, column)
    if ranges is None:
        return True
    start, end = from_spark(start), from_spark(end)
    return any(low < end and start < high for low, high in ranges)


def only_nulls(location: str, column: str) -> bool:
    """Whether every row of a local table holds NULL in `column`, told from the null counts of its
    newest checksum's files (a file read); False when it cannot tell."""
    log = LocalLog.of(location)
    return log is not None and log.only_nulls(column)


def _time_ranges(location: str, column: str) -> list[tuple[datetime, datetime]] | None:
    """`LocalLog.time_ranges` of a local table; None for any other."""
    log = LocalLog.of(location)
    return None if log is None else log.time_ranges(column)


def size_at(location: str, version: int) -> int | None:
    """The bytes of a local table's files at `version`, from Delta's checksum of that version (a
    file read, no Spark job); None when there is no such checksum."""
    log = LocalLog.of(location)
    return None if log is None else log.size(version)


def write_once(
    df: DataFrame,
    location: str,
    app_id: str,
    batch: int,
    after: int | None = None,
    partition_by: tuple[str, ...] = (),
    merge_schema: bool = False,
) -> None:
    """Append `df` exactly once per (app_id, batch): a batch run again after a failure skips the
    write if it committed. `merge_schema`: as for `append`.

    `after` is the table's newest version before the batch's first attempt wrote it (-1: no table
    yet; `newest_logged`). A local table given it has the write tagged in its commit
    (`userMetadata`), and the commits after `after` are searched for the tag: a listing and a few
    small files. Otherwise Delta's idempotent transactions decide (`txnAppId`, `txnVersion`); Delta
    rebuilds the table's whole state to look the transaction up, three Spark jobs per write (0.6 s
    of CPU in a warm driver, where the append itself costs 0.35 s)."""
    writer = df.write.format("delta").mode("append").option("mergeSchema", str(merge_schema).lower())
    log = None if after is None else LocalLog.of(location)
    if log is None:
        writer = writer.option("txnAppId", app_id).option("txnVersion", batch)
    else:
        assert after is not None  # a log is only looked for when `after` is given
        if (app_id, batch) in _tags_after(log, after, location):
            return
        writer = writer.option("userMetadata", json.dumps({_WRITE_TAG: {"app": app_id, "batch": batch}}))
    if partition_by and not exists(df.sparkSession, location):
        writer = writer.partitionBy(*partition_by)
    _save(writer, location)


_WRITE_TAG = "streamjoin_write"


def newest_logged(location: str) -> int | None:
    """A local table's newest version, from a listing of its log (-1 before the table exists), for
    `write_once`; None for a table that is not in a local folder (Delta's transactions keep it)."""
    log = LocalLog.of(location)
    return None if log is None else log.newest()


def _tags_after(log: LocalLog, after: int, location: str) -> set[tuple[str, int]]:
    """The (app, batch) tags of the commits after version `after` in a local log. Fails when some of
    those commits have left the log (cleaned up after the log's retention, 30 days by default):
    whether one of them was the write cannot be told."""
    infos = log.commits_after(after)
    if infos is None:
        raise JobError(
            f"the log entries of {location!r} after version {after} were cleaned up before a micro-batch that "
            "began writing then was run again, so whether its write committed cannot be told. Backfill the job "
            "up to a recent time T (`streamjoin backfill JOB --start ... --end T`), then continue live on a new "
            "checkpoint with `streamjoin handoff JOB --at T --checkpoint NEW`"
        )
    tags = (_write_tag(info.get("userMetadata")) for info in infos if info is not None)
    return {tag for tag in tags if tag is not None}


def _write_tag(metadata: str | None) -> tuple[str, int] | None:
    """The (app, batch) a commit's `userMetadata` names, if `write_once` wrote it."""
    try:
        tag = json.loads(metadata or "")[_WRITE_TAG]
        return str(tag["app"]), int(tag["batch"])
    except (ValueError, TypeError, KeyError):
        return None


def overwrite(df: DataFrame, location: str, partition_by: tuple[str, ...] = ()) -> None:
    """Replace the whole table with `df` (one commit; earlier versions stay readable by time travel)."""
    writer = df.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    _save(writer, location)


def upsert(df: DataFrame, location: str, key: tuple[str, ...]) -> None:
    """One MERGE commit: update the rows whose `key` matches, insert the others (creates the table)."""
    if not exists(df.sparkSession, location):
        _save(df.write.format("delta"), location, own=False)  # a source table: the session's defaults
        return
    condition = " AND ".join(f"t.`{k}` = s.`{k}`" for k in key)
    _table(df.sparkSession, location).alias("t").merge(
        df.alias("s"), condition
    ).whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()


def merge_latest(df: DataFrame, location: str, key: str, op: str) -> None:
    """Apply each key's latest change to a result table: `upsert` rows replace or insert, `delete`
    rows remove. Applying the same changes twice gives the same table (a retried batch is safe)."""
    columns = df.drop(op).columns
    if not exists(df.sparkSession, location):
        _save(df.where(F.col(op) == "upsert").drop(op).write.format("delta"), location)
        return
    (
        _table(df.sparkSession, location)
        .alias("t")
        .merge(df.alias("s"), f"t.`{key}` = s.`{key}`")
        .whenMatchedDelete(condition=f"s.`{op}` = 'delete'")
        .whenMatchedUpdate(condition=f"s.`{op}` = 'upsert'", set={c: f"s.`{c}`" for c in columns})
        .whenNotMatchedInsert(condition=f"s.`{op}` = 'upsert'", values={c: f"s.`{c}`" for c in columns})
        .execute()
    )


def append(
    df: DataFrame, location: str, properties: dict[str, str] | None = None, merge_schema: bool = False
) -> None:
    """A plain append (run logs, the arrival index); `properties` are set if it creates the table.
    `merge_schema`: columns added to a log since its table was created are added to it."""
    writer = df.write.format("delta").mode("append").options(**(properties or {}))
    _save(writer.option("mergeSchema", "true") if merge_schema else writer, location)


def replace_where(df: DataFrame, location: str, predicate: str) -> None:
    """Replace the rows of an existing table that satisfy `predicate` with `df` (one commit); columns
    of `df` the table lacks are added."""
    writer = df.write.format("delta").mode("overwrite").option("replaceWhere", predicate)
    _save(writer.option("mergeSchema", "true"), location)


def compact(spark: SparkSession, location: str) -> None:
    """Rewrite a table's small files into a few large ones (OPTIMIZE); its rows stay the same."""
    _table(spark, location).optimize().executeCompaction()


# Table properties of the tables streamjoin writes (outputs, side tables, its index), set when a
# write creates one and ignored by Delta on a table that exists. Row tracking, on by default in
# streamjoin's session for the sources it creates, costs three Spark jobs per commit and nothing
# reads these tables' rows by the version that wrote them. The change data feed stays on, so
# that a downstream consumer can follow a live output.
OWN_TABLE = {"delta.enableRowTracking": "false"}


def _save(writer, location: str, own: bool = True) -> None:
    if own:
        writer = writer.options(**OWN_TABLE)
    if is_path(location):
        writer.save(location)
    else:
        writer.saveAsTable(location)
