"""Test helpers that make Delta tables look like production tables that are weeks or months old.

`write_commits` writes real Spark commits and then backdates them: Delta 4.4 takes a commit's time
from its in-commit timestamp (`commitInfo.inCommitTimestamp`, also cached as
`inCommitTimestampOpt` in the `<version>.crc` checksum) for DESCRIBE HISTORY, the change feed's
`_commit_timestamp`, time travel by timestamp and the time-travel retention check, and from file
modification times when it decides which log files have expired. Both are rewritten.

`age_table` then does what months of production do to such a table: OPTIMIZE, VACUUM, a short
`delta.logRetentionDuration`, a checkpoint and the log clean-up that drops the early versions.

Local paths only (the log is rewritten with ordinary file I/O).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from urllib.parse import unquote

from pyspark.sql import SparkSession

from streamjoin.frames import local_frame

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")
# Session flag: when true (the default), time travel and change-feed reads of versions older than
# delta.deletedFileRetentionDuration fail with DELTA_UNSUPPORTED_TIME_TRAVEL_BEYOND_DELETED_FILE_RETENTION_DURATION.
ENFORCE_TIME_TRAVEL_RETENTION = (
    "spark.databricks.delta.vacuum.enforceTimeTravelWithinDeletedFileRetentionDuration"
)


def to_millis(when: datetime) -> int:
    """Epoch milliseconds of `when`; a naive datetime is taken as UTC."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - _EPOCH) // timedelta(milliseconds=1)


def _local_dir(path: str | os.PathLike[str]) -> Path:
    """The folder of a local path or file: URI."""
    text = str(path)
    if text.startswith("file:"):
        return Path(unquote(text.removeprefix("file://").removeprefix("file:")))
    return Path(text)


def _latest_version(log_dir: Path) -> int | None:
    """The newest commit in `log_dir`, None when there is no table there."""
    if not log_dir.is_dir():
        return None
    return max(_versions(log_dir), default=None)


def _commit_path(log_dir: Path, version: int, suffix: str = "json") -> Path:
    return log_dir / f"{version:020d}.{suffix}"


def commit_millis(path: str | os.PathLike[str], version: int) -> int:
    """The time of a commit as Delta sees it: its in-commit timestamp, else its file's mtime."""
    commit = _commit_path(_local_dir(path) / "_delta_log", version)
    for line in commit.read_text().splitlines():
        info = json.loads(line).get("commitInfo") if line.strip() else None
        if info is not None and "inCommitTimestamp" in info:
            return int(info["inCommitTimestamp"])
    return int(commit.stat().st_mtime_ns // 1_000_000)


def _rewrite(path: Path, text: str, millis: int) -> None:
    """Replace a file's content and mtime; drops Hadoop's `.<name>.crc` sidecar, now stale."""
    path.write_text(text)
    (path.parent / f".{path.name}.crc").unlink(missing_ok=True)
    _set_mtime(path, millis)


def _set_mtime(path: Path, millis: int) -> None:
    os.utime(path, ns=(millis * 1_000_000, millis * 1_000_000))


def _backdate(table_dir: Path, version: int, millis: int) -> None:
    """Make commit `version` look as if it had been written at `millis`."""
    log_dir = table_dir / "_delta_log"
    commit = _commit_path(log_dir, version)
    actions = [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]
    written: list[str] = []
    for action in actions:
        if "commitInfo" in action:
            info = action["commitInfo"]
            info["timestamp"] = millis
            if "inCommitTimestamp" in info:
                info["inCommitTimestamp"] = millis
        for kind in ("add", "cdc"):
            if kind in action:
                written.append(action[kind]["path"])
    _rewrite(commit, "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions), millis)

    checksum = _commit_path(log_dir, version, "crc")
    if checksum.exists():
        state = json.loads(checksum.read_text())
        if state.get("inCommitTimestampOpt") is not None:
            state["inCommitTimestampOpt"] = millis
        _rewrite(checksum, json.dumps(state, separators=(",", ":")), millis)

    for relative in written:
        data_file = table_dir / unquote(relative)
        if "://" not in relative and data_file.exists():
            _set_mtime(data_file, millis)


def forget_snapshots(spark: SparkSession, path: str | os.PathLike[str]) -> None:
    """Drop the table state Delta caches per path in the JVM, so that readers see the log on disk."""
    jvm = spark._jvm
    jvm.org.apache.spark.sql.delta.DeltaLog.invalidateCache(
        spark._jsparkSession, jvm.org.apache.hadoop.fs.Path(str(_local_dir(path)))
    )


def write_commits(
    spark: SparkSession,
    path: str,
    commits: list[tuple[datetime, list[tuple]]],
    schema: str,
    properties: dict[str, str] | None = None,
) -> list[int]:
    """Write each `(when, rows)` as one Delta commit dated `when` (naive = UTC); return the versions.

    Each element is a real Spark append of `rows` (tuples matching the DDL `schema`), in one file
    (a commit of a few rows, as a small writer makes it: two tasks and files cost more per append
    and every later read opens both); the first
    one creates the table when there is none, with `properties` as its TBLPROPERTIES. The commits
    are then backdated: in-commit timestamp (and `timestamp`) in the commit file and in its
    `.crc`, and the modification times of the commit file, its `.crc` and the data and change
    files it added. The times must be strictly increasing, in the past, and after the table's
    latest commit when the table already exists (else ValueError, before anything is written).
    Later ordinary writes get ordinary commit times: Delta takes max(now, previous + 1 ms).

    The log entries' own fields are left as written (`add.modificationTime`, which Spark shows as
    `_metadata.file_modification_time`, and `metaData.createdTime`), as is any checkpoint Delta
    wrote meanwhile (every `delta.checkpointInterval` commits; checkpoints hold no commit times).
    """
    if not commits:
        return []
    table_dir = _local_dir(path)
    log_dir = table_dir / "_delta_log"
    times = [to_millis(when) for when, _ in commits]
    for (earlier, later), (when, _) in zip(pairwise(times), commits[1:], strict=False):
        if later <= earlier:
            raise ValueError(
                f"commit times must be strictly increasing; {when.isoformat()} is not after its predecessor"
            )
    now = to_millis(datetime.now(UTC))
    if times[-1] >= now:
        raise ValueError(f"commit times must be in the past; {commits[-1][0].isoformat()} is not")
    latest = _latest_version(log_dir)
    if latest is not None:
        if properties:
            raise ValueError(
                f"{path} already holds a Delta table; properties are only applied when creating one"
            )
        existing = commit_millis(table_dir, latest)
        if times[0] <= existing:
            last = datetime.fromtimestamp(existing / 1000, UTC).isoformat()
            raise ValueError(
                f"{path} already has version {latest} committed at {last}; the commits to write "
                f"must come after it, and {commits[0][0].isoformat()} does not"
            )

    versions: list[int] = []
    for index, (_, rows) in enumerate(commits):
        frame = local_frame(spark, list(rows), schema).coalesce(1)
        if latest is None and index == 0:
            writer = frame.writeTo(f"delta.`{table_dir}`").using("delta")
            for key, value in (properties or {}).items():
                writer = writer.tableProperty(key, value)
            writer.create()
        else:
            frame.write.format("delta").mode("append").save(str(table_dir))
        versions.append(_latest_version(log_dir))  # nobody else writes to a test table

    for version, millis in zip(versions, times, strict=False):
        _backdate(table_dir, version, millis)
    forget_snapshots(spark, table_dir)
    return versions


@contextmanager
def session_conf(spark: SparkSession, settings: dict[str, str]) -> Iterator[None]:
    """Set session configurations for the duration of a block, then restore what they were."""
    previous = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def vacuum(spark: SparkSession, path: str | os.PathLike[str]) -> None:
    """VACUUM RETAIN 0 HOURS: every file no longer in the latest snapshot is deleted now. Delta's
    retention check is off for this call only, and VACUUM lists the table's files with as many
    tasks as the session has shuffle partitions (its default of 10,000 tasks takes about a minute
    on a small machine)."""
    _vacuum(spark, path, "RETAIN 0 HOURS", {"spark.databricks.delta.retentionDurationCheck.enabled": "false"})


def _vacuum(spark: SparkSession, path: str | os.PathLike[str], retain: str, settings: dict[str, str]) -> None:
    """VACUUM with `retain` ("" for the table's own retention) under `settings`, listing the files
    with as many tasks as the session has shuffle partitions."""
    parallelism = {
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": spark.conf.get(
            "spark.sql.shuffle.partitions"
        )
    }
    with session_conf(spark, settings | parallelism):
        spark.sql(f"VACUUM delta.`{_local_dir(path)}` {retain}")


def age_table(spark: SparkSession, path: str, log_retention: str = "interval 1 days") -> None:
    """Do to a table what months of production do: compaction, vacuum and log clean-up.

    OPTIMIZE (row tracking keeps each row's id and commit version), VACUUM RETAIN 0 HOURS (the
    retention check is disabled for that call only), `delta.logRetentionDuration` set to
    `log_retention` (and `delta.deletedFileRetentionDuration` lowered to it when longer: Delta
    4.4 refuses a log retention shorter than the deleted-file retention), then Delta's own
    expired-log clean-up, made deterministic:

    Delta deletes log files only in whole runs that end right before a checkpoint, when the last
    file of the run has a modification time at or before midnight UTC of (now - log retention),
    and only below the latest checkpoint. So this writes a checkpoint at the first version that
    is not expired (the boundary), then a checkpoint of the latest version followed by the
    clean-up (`DeltaLog.checkpointAndCleanUpDeltaLog`, what Delta runs after a commit whose
    version is a multiple of `delta.checkpointInterval`). The versions before the boundary
    disappear from DESCRIBE HISTORY and cannot be read any more.
    """
    table_dir = _local_dir(path)
    spark.sql(f"OPTIMIZE delta.`{table_dir}`")
    vacuum(spark, table_dir)
    clean_log(spark, path, log_retention)


def clean_log(spark: SparkSession, path: str, log_retention: str = "interval 30 days") -> None:
    """Delta's expired-log clean-up with `delta.logRetentionDuration` = `log_retention` (default:
    Delta's own 30 days), made deterministic (see `age_table`); turns on
    `delta.enableExpiredLogCleanup` too, for a table that had it off."""
    table_dir = _local_dir(path)
    table = f"delta.`{table_dir}`"
    # Delta's own commits kept its cached state of the table current.
    delta_log = _delta_log(spark, table_dir)
    configs = spark._jvm.org.apache.spark.sql.delta.DeltaConfigs
    retention = {"delta.logRetentionDuration": log_retention, "delta.enableExpiredLogCleanup": "true"}
    log_millis = configs.getMilliSeconds(configs.parseCalendarInterval(log_retention))
    metadata = delta_log.unsafeVolatileSnapshot().metadata()
    if log_millis < configs.getMilliSeconds(configs.TOMBSTONE_RETENTION().fromMetaData(metadata)):
        retention["delta.deletedFileRetentionDuration"] = log_retention
    settings = ", ".join(f"'{key}' = '{value}'" for key, value in retention.items())
    spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ({settings})")

    # The boundary, with Delta's own cut-off: commit files older than it are expired.
    snapshot = delta_log.unsafeVolatileSnapshot()
    now = delta_log.clock().getTimeMillis()
    cutoff = delta_log.truncateDay(
        now - delta_log.deltaRetentionMillis(snapshot.metadata())
    ).getTimeInMillis()
    log_dir = table_dir / "_delta_log"
    versions = _versions(log_dir)
    boundary = next(  # the latest commit (the ALTER above) is never expired
        v for v in versions if _commit_path(log_dir, v).stat().st_mtime_ns // 1_000_000 > cutoff
    )
    if versions[0] < boundary < snapshot.version():
        # Delta refuses to load versions older than the deleted-file retention; this is no read.
        with session_conf(spark, {ENFORCE_TIME_TRAVEL_RETENTION: "false"}):
            delta_log.createCheckpointAtVersion(boundary)
    delta_log.checkpointAndCleanUpDeltaLog(snapshot, spark._jvm.scala.Option.empty())
    forget_snapshots(spark, table_dir)  # its cached log segment names deleted files


def _versions(log_dir: Path) -> list[int]:
    """The versions whose commit files are in `log_dir`, oldest first."""
    return sorted(int(m.group(1)) for m in map(_COMMIT_FILE.match, os.listdir(log_dir)) if m)


def _delta_log(spark: SparkSession, table_dir: Path):
    """Delta's JVM handle on a table (org.apache.spark.sql.delta.DeltaLog), loaded from disk."""
    return spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(table_dir))


def commit_at(spark: SparkSession, path: str, when: datetime, write: Callable[[], object]) -> list[int]:
    """Run `write` (Spark commits to the local table at `path`: a MERGE, a DELETE, OPTIMIZE) and date
    the commits it made at `when` (naive = UTC; one millisecond apart), as `write_commits` dates its
    appends, and the files they removed as removed then (`remove.deletionTimestamp`, which VACUUM
    compares with its retention). `when` must be in the past and after the table's latest commit."""
    table_dir = _local_dir(path)
    log_dir = table_dir / "_delta_log"
    before = _latest_version(log_dir)
    if before is None:
        raise ValueError(f"{path} holds no Delta table; create it with write_commits")
    millis = to_millis(when)
    if not commit_millis(table_dir, before) < millis < to_millis(datetime.now(UTC)):
        raise ValueError(f"{when.isoformat()} is not between the table's latest commit and now")
    write()
    versions = list(range(before + 1, (_latest_version(log_dir) or before) + 1))
    for offset, version in enumerate(versions):
        _backdate(table_dir, version, millis + offset)
        _date_removals(table_dir, version, millis + offset)
    forget_snapshots(spark, table_dir)
    return versions


def _date_removals(table_dir: Path, version: int, millis: int) -> None:
    """Give the `remove` actions of commit `version` the deletion time `millis`."""
    commit = _commit_path(table_dir / "_delta_log", version)
    actions = [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]
    if not any("remove" in a for a in actions):
        return
    for action in actions:
        if "remove" in action:
            action["remove"]["deletionTimestamp"] = millis
    _rewrite(commit, "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions), millis)


def vacuum_default(spark: SparkSession, path: str | os.PathLike[str]) -> None:
    """VACUUM at the table's own retention (Delta's default: 168 hours), as its owners run it: the
    files removed more than that long ago (by their removal's `deletionTimestamp`) and the change
    files older than that (by modification time) are deleted. VACUUM's own log entries are off for
    the call, so that later backdated commits can still follow."""
    _vacuum(spark, path, "", {"spark.databricks.delta.vacuum.logging.enabled": "false"})
    forget_snapshots(spark, path)
