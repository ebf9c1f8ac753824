"""Table sources: a keyed relation that changes over time, read as one changelog of versions.

A `table` source comes in one of two physical forms, and both become the same changelog:

- **in place** (default): a Delta table changed by INSERT, UPDATE, MERGE and DELETE. Its change
  data feed gives every insert, update post-image and delete with the commit that made it.
- **changelog** (`changelog: true`): an append-only Delta table in which each row is the new
  value of its key, like a compacted topic. A row is a tombstone (deletes its key) when its
  `deleted` column is true or, without one, when every value column (neither key nor time) is
  NULL (ksqlDB).

Each change carries its *version time* `_sj_t`: the declared `time` column, or the commit
timestamp when the table declares none (a delete of an in-place table has no time of its own and
takes the table's event-time clock at its commit, `_on_the_table_clock`); its arrival position
(`_sj_ts`, `_sj_src`, `_sj_v`); `_sj_del` for a tombstone; and a rejection reason (NULL primary
key, NULL or unparseable version time).

`versions` turns accepted changes into validity intervals per primary key, ordered either by
arrival (what the table held when a row arrived) or by version time (what was valid at an event
time): the versioned table that the temporal join family (`joins/temporal/`) looks up.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import overload

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType, TimestampType

from streamjoin import delta_io, drift, journal
from streamjoin.arrival import (
    BAD_TIME,
    FUTURE_TIME,
    NULL_KEY,
    NULL_TIME,
    REJECT,
    SRC,
    TS,
    CommitStats,
    T,
    V,
    too_far_ahead,
    user_columns,
)
from streamjoin.delta_io import CHANGE_TYPE, COMMIT_TIMESTAMP, COMMIT_VERSION
from streamjoin.errors import HistoryNotRetainedError
from streamjoin.frames import local_frame
from streamjoin.plan import BoundSource
from streamjoin.timeutil import from_spark

DELETED = "_sj_del"  # the change deletes its key (a tombstone)
VALID_FROM = "_sj_from"  # a version is valid for  from <= x < to  (to NULL: still valid)
VALID_TO = "_sj_to"


@dataclass(frozen=True)
class TableInput:
    """What a step knows of one table source: every change committed up to `version`, which of them
    this run counts in its metrics and in which slice (`owner`: the slice number, NULL for a change
    counted by an earlier run or another slice), the table's commits, and the newest commit
    timestamp among the job's stream sources (`stream_clock`), which bounds what the table can
    still add before it (docs/semantics.md, clock skew)."""

    changes: DataFrame
    commits: list[CommitStats]
    version: int
    owner: Column
    stream_clock: int | None
    # The earliest time the table can be told at (UTC micros; docs/backfills.md): a row looked up
    # before it is looked up at it instead, in the table's earliest known state, and counted as
    # assumed. Set only by a backfill run with --assume-earliest-known; None: every lookup as is.
    known_from: int | None = None

    @property
    def newest_ts(self) -> int | None:
        return max((c.position.time for c in self.commits), default=None)


@overload
def known_until(table_newest: int | None, clock: int, clock_skew: int) -> int: ...
@overload
def known_until(table_newest: int | None, clock: int | None, clock_skew: int) -> int | None: ...
def known_until(table_newest: int | None, clock: int | None, clock_skew: int) -> int | None:
    """The commit timestamp up to which a table's log is complete: its newest commit, or the
    newest commit of another source (`clock`) minus the table's clock skew, whichever is later
    (docs/semantics.md); None while neither exists. A commit made later carries a later timestamp."""
    bounds = [b for b in (table_newest, None if clock is None else clock - clock_skew) if b is not None]
    return max(bounds, default=None)


def read(
    spark: SparkSession,
    source: BoundSource,
    upto_version: int,
    start: int = 0,
    start_time: datetime | None = None,
    journal_at: str | None = None,
) -> DataFrame:
    """The table's changes up to `upto_version` since its start, tagged (see module docstring).

    From version 0, every change. From a later start S (committed at `start_time`), the rows the
    table held at S, as inserts of commit S (its history), then the changes of the commits after
    S. Where they come from (docs/semantics.md, "Where a job starts"): an append-only changelog
    with row tracking, from its newest snapshot, each row at the version that wrote it; any other
    table, from the job's journal (`journal_at`, streamjoin/journal.py) for the versions it holds,
    and from Delta (time travel to S, the change feed) for the rest.
    """
    drift.check_source(spark, source, start, upto_version)
    if journal.served_by_rows(spark, source, start):
        raw = _from_rows(spark, source, upto_version, start, journal_at)
    else:
        raw = _from_journal_or_delta(spark, source, upto_version, start, journal_at)
    if start > 0:  # the history arrives at the start
        at_start = F.col(COMMIT_VERSION) == start
        raw = raw.withColumn(
            COMMIT_TIMESTAMP,
            F.when(at_start, F.lit(start_time).cast("timestamp")).otherwise(F.col(COMMIT_TIMESTAMP)),
        )
    return tag(raw, source)


def _from_journal_or_delta(
    spark: SparkSession, source: BoundSource, upto_version: int, start: int, journal_at: str | None
) -> DataFrame:
    """The changes of versions [start, upto_version] (at S > 0: the table at S as inserts of S): the
    journal's for the versions it holds, Delta's for the newer ones. While Delta still serves the
    start, all of them are Delta's: the same changes, without a read of the journal."""
    where = source.spec.location
    held = None
    if journal_at is not None and not journal.retained_since(spark, where, start):
        held = journal.read(spark, journal_at, source, start, upto_version)
    if held is not None:
        raw, after = held
    elif start == 0:
        return delta_io.read_changes(spark, where, upto_version, 0)
    else:
        advice = (
            f"Table source {source.name!r} is updated in place, and only the job's journal keeps such a table's "
            "versions once Delta no longer does: start the job later, at a version Delta still serves, and run "
            "`streamjoin index JOB` more often than the file retention"
        )
        with delta_io.translated_errors(where, f"its start version {start}", advice):
            history = delta_io.read_snapshot(spark, where, start)
        raw = history.select(
            "*",
            F.lit("insert").alias(CHANGE_TYPE),
            F.lit(start).cast("long").alias(COMMIT_VERSION),
            F.lit(None).cast("timestamp").alias(COMMIT_TIMESTAMP),  # the start's time (`read`)
        )
        after = start
    if upto_version > after:
        # allowMissingColumns: the table at the start may have had columns that it lost since, or lacked
        # some added since; `tag` keeps the job's own (a change of one of them is refused: drift.py)
        changes = delta_io.read_changes(spark, where, upto_version, after + 1)
        raw = raw.unionByName(changes, allowMissingColumns=True)
    return raw


def _from_rows(
    spark: SparkSession, source: BoundSource, upto_version: int, start: int, journal_at: str | None
) -> DataFrame:
    """An append-only changelog with row tracking at `upto_version`: its newest snapshot's rows
    written by then, each an insert of the version that wrote it (`_metadata.row_commit_version`;
    at S > 0, those written at or before S are the history, inserts of S). Their commit times come
    from the table's log and, for entries the log has dropped (after 30 days), from the journal."""
    where = source.spec.location
    rows = delta_io.read_rows(spark, where)
    rows = rows.where(F.col(COMMIT_VERSION) <= upto_version).withColumn(
        COMMIT_VERSION, F.greatest(F.col(COMMIT_VERSION), F.lit(start).cast("long"))
    )
    first = start + 1 if start > 0 else 0
    times = _commit_times(spark, source, first, upto_version, journal_at)
    unknown = sorted(set(range(first, upto_version + 1)) - set(times))
    if unknown:
        written = rows.where(F.col(COMMIT_VERSION).isin(unknown)).select(COMMIT_VERSION).distinct().collect()
        if written:
            versions = sorted(r[0] for r in written)
            raise HistoryNotRetainedError(
                f"table source {source.name!r} ({where}) holds rows of version(s) {versions[:5]} whose commit times "
                "neither its log (entries older than delta.logRetentionDuration, 30 days by default, are dropped) "
                "nor the job's journal keeps. Start the job at a later version, or keep the log longer"
            )
    known = local_frame(spark, sorted(times.items()), _TIMES)
    return rows.join(F.broadcast(known), COMMIT_VERSION, "left").select(
        *[F.col(f"`{c}`") for c in source.schema.fieldNames()],
        F.lit("insert").alias(CHANGE_TYPE),
        F.col(COMMIT_VERSION),
        F.col(COMMIT_TIMESTAMP),
    )


_TIMES = StructType([StructField(COMMIT_VERSION, LongType()), StructField(COMMIT_TIMESTAMP, TimestampType())])


def _commit_times(
    spark: SparkSession, source: BoundSource, first: int, upto: int, journal_at: str | None
) -> dict[int, datetime]:
    """The commit times of versions [first, upto] that the table's log or the journal keeps."""
    if first > upto:
        return {}
    where = source.spec.location
    oldest = delta_io.oldest_version(spark, where)
    logged = delta_io.history(spark, where, since=max(first, oldest), upto=upto)
    times = {c.version: from_spark(c.timestamp) for c in logged if c.version <= upto}
    if first < oldest and journal_at is not None:
        times = journal.commit_times(spark, journal_at, source, first, oldest - 1) | times
    return times


def tag(raw: DataFrame, source: BoundSource) -> DataFrame:
    """Change-feed rows of a table source (its columns, `_change_type`, `_commit_version`,
    `_commit_timestamp`) tagged with version time, position, tombstone flag and rejection reason."""
    spec = source.spec
    commit_time = F.unix_micros(F.col(COMMIT_TIMESTAMP))
    deleted = F.col(CHANGE_TYPE) == "delete"
    if spec.changelog:
        if spec.deleted:
            deleted = F.coalesce(F.col(f"`{spec.deleted}`"), F.lit(False))
        else:
            values = [c for c in source.schema.fieldNames() if c not in spec.key and c != spec.time]
            deleted = F.lit(bool(values))
            for column in values:
                deleted = deleted & F.col(f"`{column}`").isNull()
    if spec.time:  # an in-place delete brings the deleted row's time; `_on_the_table_clock` moves it
        raw_time, version_time = source.raw_time(), source.event_time()
    else:
        raw_time, version_time = F.col(COMMIT_TIMESTAMP), commit_time
    in_place_delete = F.lit(False) if spec.changelog else deleted
    null_key = F.lit(False)
    for column in spec.key:
        null_key = null_key | F.col(f"`{column}`").isNull()
    reason = (
        F.when(null_key, F.lit(NULL_KEY))
        .when(raw_time.isNull(), F.lit(NULL_TIME))
        .when(version_time.isNull(), F.lit(BAD_TIME))
        .when(in_place_delete, F.lit(None))  # its time is the table's clock (`_on_the_table_clock`)
        .when(too_far_ahead(version_time, commit_time, source.max_future()), F.lit(FUTURE_TIME))
    )
    tagged = raw.select(
        *[F.col(f"`{c}`") for c in source.schema.fieldNames()],
        version_time.alias(T),
        commit_time.alias(TS),
        F.lit(source.index).alias(SRC),
        F.col(COMMIT_VERSION).cast("long").alias(V),
        deleted.alias(DELETED),
        reason.alias(REJECT),
    )
    return _on_the_table_clock(tagged) if spec.time and not spec.changelog else tagged


def _on_the_table_clock(changes: DataFrame) -> DataFrame:
    """A DELETE of a table updated in place has no version time of its own (the change feed brings
    the deleted row). It takes the table's event-time clock at its commit: the largest version time
    of the accepted changes committed before it, or the deleted row's own while there is none. So
    it is never late and never moves the table's watermark, whatever its wall-clock commit time
    (docs/semantics.md); a changelog's tombstone carries its own time instead."""
    top = F.max(F.when(F.col(REJECT).isNull() & ~F.col(DELETED), F.col(T)))
    per_commit = changes.groupBy(TS, V).agg(top.alias("_sj_top"))
    earlier = Window.orderBy(TS, V).rowsBetween(Window.unboundedPreceding, -1)
    clock = per_commit.select(
        F.col(TS).alias("_sj_cts"),
        F.col(V).alias("_sj_cv"),
        F.max("_sj_top").over(earlier).alias("_sj_clock"),
    )
    joined = changes.join(
        F.broadcast(clock), (F.col(TS) == F.col("_sj_cts")) & (F.col(V) == F.col("_sj_cv")), "left"
    )
    on_clock = F.when(F.col(DELETED) & F.col(REJECT).isNull(), F.greatest(F.col(T), F.col("_sj_clock")))
    return joined.withColumn(T, on_clock.otherwise(F.col(T))).drop("_sj_cts", "_sj_cv", "_sj_clock")


def versions(changes: DataFrame, key: tuple[str, ...], order: str) -> DataFrame:
    """Accepted changes as versions valid over [_sj_from, _sj_to), one at a time per primary key.

    `arrival`: a change is valid from its commit timestamp until the key's next change; several
    changes of a key in one commit are ordered by version time (then by their content, so the
    choice is deterministic) and only the last is ever visible. `position`: the same, over arrival
    positions (commit timestamp, source, version), so that two tables' commits of one instant are
    still ordered. `event_time`: a change is valid from its version time until the key's next
    version time (a later commit wins a tie).
    """
    tie = F.to_json(F.struct(*[F.col(f"`{c}`") for c in user_columns(changes)]))
    if order == "arrival":
        start, sequence = F.col(TS), [F.col(TS), F.col(V), F.col(T), tie]
    elif order == "position":
        start = F.struct(F.col(TS).alias("ts"), F.col(SRC).alias("src"), F.col(V).alias("v"))
        sequence = [F.col(TS), F.col(V), F.col(T), tie]
    else:
        start, sequence = F.col(T), [F.col(T), F.col(TS), F.col(V), tie]
    by_key = Window.partitionBy(*[F.col(f"`{c}`") for c in key]).orderBy(*sequence)
    return changes.withColumn(VALID_FROM, start).withColumn(VALID_TO, F.lead(start).over(by_key))


def valid_at(point: Column, prefix: str = "") -> Column:
    """The version (columns under `prefix`) is valid at `point`, and is not a tombstone."""
    start, stop, deleted = (F.col(f"{prefix}{c}") for c in (VALID_FROM, VALID_TO, DELETED))
    return (start <= point) & (stop.isNull() | (point < stop)) & ~deleted
