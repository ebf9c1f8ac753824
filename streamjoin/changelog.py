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
time): the versioned table that the temporal join family (`joins/temporal.py`) looks up.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import overload

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from streamjoin import delta_io
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
from streamjoin.plan import BoundSource

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

    @property
    def newest_ts(self) -> int | None:
        return max((c.position[0] for c in self.commits), default=None)


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
) -> DataFrame:
    """The table's changes up to `upto_version` since its start, tagged (see module docstring).

    From version 0, every change of the change feed. From a later start S (committed at
    `start_time`), the rows the table held at S, as inserts of commit S (its history), then the
    change feed of the commits after S: no version before S is read.
    """
    spec = source.spec
    if start == 0:
        raw = delta_io.read_changes(spark, spec.location, upto_version, 0)
    else:
        with delta_io.translated_errors(spec.location, f"its start version {start}"):
            history = delta_io.read_snapshot(spark, spec.location, start)
        raw = history.select(
            "*",
            F.lit("insert").alias(CHANGE_TYPE),
            F.lit(start).cast("long").alias(COMMIT_VERSION),
            F.lit(start_time).cast("timestamp").alias(COMMIT_TIMESTAMP),
        )
        if upto_version > start:
            raw = raw.unionByName(delta_io.read_changes(spark, spec.location, upto_version, start + 1))
    return tag(raw, source)


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
