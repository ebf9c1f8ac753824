"""All Delta Lake reads and writes: snapshots, arrivals, idempotent slices, exactly-once batches.

A location is a Delta folder path or a metastore table name; every function takes either. The
change data feed gives each stream row its arrival (`_commit_version`, `_commit_timestamp`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import unquote, urlparse

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, DataFrameReader, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamReader
from pyspark.sql.types import StructType

from streamjoin.errors import HistoryNotRetainedError, JobError

COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
CHANGE_TYPE = "_change_type"


def _is_path(location: str) -> bool:
    return "/" in location or "\\" in location or "://" in location


def _load(reader: DataFrameReader | DataStreamReader, location: str):
    return reader.load(location) if _is_path(location) else reader.table(location)


def exists(spark: SparkSession, location: str) -> bool:
    """True when `location` holds a Delta table."""
    if _is_path(location):
        return DeltaTable.isDeltaTable(spark, location)
    return spark.catalog.tableExists(location)


def _table(spark: SparkSession, location: str) -> DeltaTable:
    if not exists(spark, location):
        raise JobError(f"{location!r} is not a Delta table (no _delta_log there); create it or fix the path")
    return DeltaTable.forPath(spark, location) if _is_path(location) else DeltaTable.forName(spark, location)


def schema(spark: SparkSession, location: str) -> StructType:
    """The current schema of a Delta table."""
    return _table(spark, location).toDF().schema


@dataclass(frozen=True)
class Commit:
    """One entry of a table's history."""

    version: int
    timestamp: datetime
    operation: str


def history(spark: SparkSession, location: str) -> list[Commit]:
    """The retained commits of a table, oldest first."""
    rows = _table(spark, location).history().select("version", "timestamp", "operation").collect()
    return sorted((Commit(r.version, r.timestamp, r.operation) for r in rows), key=lambda c: c.version)


def latest_version(spark: SparkSession, location: str) -> int:
    """The newest version of a table."""
    return _table(spark, location).history(1).select("version").first().version


def version_at(spark: SparkSession, location: str, when: datetime) -> int:
    """The newest version committed at or before `when` (Delta time travel by timestamp)."""
    candidates = [c.version for c in history(spark, location) if c.timestamp <= when.replace(tzinfo=None)]
    if not candidates:
        raise HistoryNotRetainedError(f"{location!r} has no retained version at or before {when.isoformat()}")
    return candidates[-1]


def read_snapshot(spark: SparkSession, location: str, version: int | None = None) -> DataFrame:
    """The table as of `version` (time travel), or as it is now."""
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return _load(reader, location)


def require_change_feed(spark: SparkSession, location: str) -> None:
    """Stream sources need their change data feed: it records each row's arrival."""
    properties = {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES {_sql_name(location)}").collect()}
    if properties.get("delta.enableChangeDataFeed", "false").lower() != "true":
        raise JobError(
            f"{location!r} does not record its change data feed, which streamjoin reads for each row's "
            f"commit version and time; run ALTER TABLE {_sql_name(location)} SET TBLPROPERTIES "
            "(delta.enableChangeDataFeed = true) before writing events (rows written earlier cannot be replayed)"
        )


def _sql_name(location: str) -> str:
    return f"delta.`{location}`" if _is_path(location) else location


def read_changes(spark: SparkSession, location: str, upto_version: int, from_version: int = 0) -> DataFrame:
    """Row changes of commits [from_version, upto_version] from the change data feed: inserts, update
    post-images and deletes, with `_change_type`, `_commit_version` and `_commit_timestamp`."""
    reader = (
        spark.read.format("delta").option("readChangeFeed", "true")
        .option("startingVersion", from_version).option("endingVersion", upto_version)
    )
    return _load(reader, location).where(F.col(CHANGE_TYPE) != "update_preimage")


def read_inserts(spark: SparkSession, location: str, upto_version: int, from_version: int = 0) -> DataFrame:
    """Rows inserted by commits [from_version, upto_version], with their commit version and time."""
    changes = read_changes(spark, location, upto_version, from_version)
    return changes.where(F.col(CHANGE_TYPE) == "insert").drop(CHANGE_TYPE)


def stream_changes(spark: SparkSession, location: str, max_files_per_trigger: int | None = None,
                   starting_version: int = 0) -> DataFrame:
    """A streaming DataFrame of the change data feed (every change type, with `_change_type`,
    commit version and time), from `starting_version` on, which need not exist yet (Delta itself
    refuses a starting version newer than the table: the stream starts one earlier and filters)."""
    reader = (
        spark.readStream.format("delta").option("readChangeFeed", "true")
        .option("startingVersion", max(starting_version - 1, 0))
    )
    if max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
    changes = _load(reader, location)
    return changes.where(F.col(COMMIT_VERSION) >= starting_version) if starting_version else changes


def stream_inserts(spark: SparkSession, location: str, max_files_per_trigger: int | None = None,
                   starting_version: int = 0) -> DataFrame:
    """A streaming DataFrame of inserted rows with their commit version and time, from `starting_version`."""
    changes = stream_changes(spark, location, max_files_per_trigger, starting_version)
    return changes.where(F.col(CHANGE_TYPE) == "insert").drop(CHANGE_TYPE)


def check_retained(spark: SparkSession, location: str, upto_version: int) -> None:
    """Fail before any data moves when the log or the files a replay needs are gone."""
    retained = history(spark, location)
    if not retained or retained[0].version > 0:
        first = retained[0].version if retained else "none"
        raise HistoryNotRetainedError(
            f"{location!r} no longer retains its log from version 0 (oldest retained: {first}); a replay "
            "needs every commit since the first to know each row's arrival. Raise "
            "delta.logRetentionDuration on the source, or replay from a copy that kept its history"
        )
    files = _data_files(spark, location, upto_version)
    missing = [f for f in files if not _file_exists(spark, f)]
    if missing:
        vacuums = [c for c in retained if c.operation.upper().startswith("VACUUM")]
        when = f" (VACUUM ran at {vacuums[-1].timestamp})" if vacuums else ""
        raise HistoryNotRetainedError(
            f"{location!r} no longer retains {len(missing)} data file(s) that a replay up to version "
            f"{upto_version} needs{when}, e.g. {missing[0]}. Replay only a range whose files are retained, "
            "or keep files longer with delta.deletedFileRetentionDuration and VACUUM ... RETAIN"
        )


def _data_files(spark: SparkSession, location: str, upto_version: int) -> list[str]:
    """The data and change files that commits 0..upto_version added (read from the log's JSON)."""
    root = location if _is_path(location) else spark.sql(f"DESCRIBE DETAIL {location}").first().location
    root = root.rstrip("/")
    log = spark.read.schema(
        "add struct<path:string, dataChange:boolean>, cdc struct<path:string>"
    ).json(f"{root}/_delta_log/*.json").withColumn("file", F.input_file_name())
    version = F.regexp_extract(F.col("file"), r"(\d+)\.json$", 1).cast("long")
    needed = log.where(version <= upto_version).select(
        F.coalesce(F.when(F.col("add.dataChange"), F.col("add.path")), F.col("cdc.path")).alias("path")
    ).where(F.col("path").isNotNull())
    return [p if "://" in p else f"{root}/{unquote(p)}" for p in (r.path for r in needed.collect())]


def _file_exists(spark: SparkSession, uri: str) -> bool:
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return os.path.exists(parsed.path)
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(uri)
    return path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).exists(path)


def write_slice(
    df: DataFrame, location: str, time_column: str, start: datetime, end: datetime,
    partition_by: tuple[str, ...] = (),
) -> None:
    """Replace the rows whose `time_column` lies in [start, end) with `df`: re-running a slice is safe.

    When every row the table holds lies in the slice (a replay of the whole range, or a first
    write), replacing the slice is replacing the table: a plain overwrite, which Delta does without
    reading the old files (replaceWhere reads them to find the rows to delete, and with the change
    data feed on writes them out again). An overwrite removes exactly the files it read, so rows
    another writer committed meanwhile stay (Delta may refuse one of the two commits instead).
    """
    spark = df.sparkSession
    predicate = (
        f"`{time_column}` >= TIMESTAMP '{start.strftime('%Y-%m-%d %H:%M:%S.%f')}' AND "
        f"`{time_column}` < TIMESTAMP '{end.strftime('%Y-%m-%d %H:%M:%S.%f')}'"
    )
    writer = df.write.format("delta").mode("overwrite")
    outside = f"NOT ({predicate}) OR `{time_column}` IS NULL"
    if exists(spark, location) and not read_snapshot(spark, location).where(outside).isEmpty():
        writer = writer.option("replaceWhere", predicate)
    elif partition_by:
        writer = writer.partitionBy(*partition_by)
    _save(writer, location)


def write_once(df: DataFrame, location: str, app_id: str, batch: int, overwrite: bool = False,
               partition_by: tuple[str, ...] = ()) -> None:
    """Append (or overwrite) exactly once per (app_id, batch): a retried batch's write is skipped."""
    writer = (
        df.write.format("delta").mode("overwrite" if overwrite else "append")
        .option("txnAppId", app_id).option("txnVersion", batch)
    )
    if partition_by and not exists(df.sparkSession, location):
        writer = writer.partitionBy(*partition_by)
    _save(writer, location)


def overwrite(df: DataFrame, location: str, partition_by: tuple[str, ...] = ()) -> None:
    """Replace the whole table with `df` (one commit; earlier versions stay readable by time travel)."""
    writer = df.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    _save(writer, location)


def upsert(df: DataFrame, location: str, key: tuple[str, ...]) -> None:
    """One MERGE commit: update the rows whose `key` matches, insert the others (creates the table)."""
    if not exists(df.sparkSession, location):
        _save(df.write.format("delta"), location)
        return
    condition = " AND ".join(f"t.`{k}` = s.`{k}`" for k in key)
    _table(df.sparkSession, location).alias("t").merge(df.alias("s"), condition) \
        .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()


def merge_latest(df: DataFrame, location: str, key: str, op: str) -> None:
    """Apply each key's latest change to a result table: `upsert` rows replace or insert, `delete`
    rows remove. Applying the same changes twice gives the same table (a retried batch is safe)."""
    columns = df.drop(op).columns
    if not exists(df.sparkSession, location):
        df.where(F.col(op) == "upsert").drop(op).write.format("delta").save(location)
        return
    (_table(df.sparkSession, location).alias("t").merge(df.alias("s"), f"t.`{key}` = s.`{key}`")
     .whenMatchedDelete(condition=f"s.`{op}` = 'delete'")
     .whenMatchedUpdate(condition=f"s.`{op}` = 'upsert'", set={c: f"s.`{c}`" for c in columns})
     .whenNotMatchedInsert(condition=f"s.`{op}` = 'upsert'", values={c: f"s.`{c}`" for c in columns})
     .execute())


def append(df: DataFrame, location: str) -> None:
    """A plain append (run logs)."""
    _save(df.write.format("delta").mode("append"), location)


def _save(writer, location: str) -> None:
    if _is_path(location):
        writer.save(location)
    else:
        writer.saveAsTable(location)
