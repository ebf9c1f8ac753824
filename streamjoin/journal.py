"""The table journal: every change of a job's table sources, kept by streamjoin so it outlives Delta.

Delta serves a table only as far back as `delta.deletedFileRetentionDuration` (7 days by default):
since Delta 4.1, time travel and the batch change-data-feed reader refuse older versions whether
or not VACUUM ran, and log entries (with the commit times) go after `delta.logRetentionDuration`
(30 days). A table updated in place (MERGE, UPDATE, DELETE) has no other copy of its past. So the
index step copies, while Delta still holds them, into the Delta table `<output>_journal`:

    source, version, commit_time    one row per table commit (`change_type` NULL): the journal
                                    holds the source's commits up to its newest such row
    change_type                     on a change row: insert, update_postimage or delete
    rows_<source>                   on a change row: the row, the source's columns as a struct
    write                           the append that wrote the row (an id)
    copied                          on a commit row: the append copied the commit's changes too

From the job's start S on: the rows the table held at S (as inserts of version S, its history),
then the change feed of each later commit. `changelog.read` serves a table from here for the
versions the journal holds and from Delta only for newer commits, so a backfill a month later
rebuilds the table at any version since the start.

An append-only changelog table with row tracking needs no copy of its rows (its newest snapshot
holds them all, each with the version that wrote it, `served_by_rows`): the journal keeps only its
commits' times, which Delta's log forgets after 30 days.

Appends are incremental (the commits after the journal's newest per source) and may repeat: two
writers that extend the journal at once both append the versions they read. Readers take each
version from one append only (the smallest `write` id among the version's commit rows), and every
append holds the whole of each version it records, so a repeat changes nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import reduce
from typing import Protocol

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from streamjoin import delta_io
from streamjoin.delta_io import CHANGE_TYPE, COMMIT_TIMESTAMP, COMMIT_VERSION
from streamjoin.errors import HistoryNotRetainedError, JobError
from streamjoin.frames import local_frame
from streamjoin.plan import BoundSource, Plan
from streamjoin.timeutil import from_micros, from_spark

WRITE = "write"
KIND = "change_type"  # Delta reserves `_change_type` in a table with a change feed
COPIED = "copied"  # on a commit row: the append copied the commit's changes
# Delta's session setting that refuses time travel and change-feed reads of versions committed
# longer ago than delta.deletedFileRetentionDuration (on by default since Delta 4.1).
ENFORCE_RETENTION = "spark.databricks.delta.vacuum.enforceTimeTravelWithinDeletedFileRetentionDuration"


class StartEntry(Protocol):
    """What the journal needs of a source's start entry in the arrival index (`index.Entry`)."""

    @property
    def version(self) -> int: ...
    @property
    def commit_ts(self) -> int: ...  # UTC micros: the time the table's history is stamped at


@dataclass(frozen=True)
class Coverage:
    """The versions of one source the journal holds: from `first` (the job's start) to `last`;
    `copied`: with their changes (False: only the commit times of a table its rows serve)."""

    first: int
    last: int
    copied: bool = True


def location(plan: Plan) -> str:
    """Where a job's journal lives: beside its output and its arrival index."""
    return plan.spec.output.side("journal")


def _rows_column(source: BoundSource) -> str:
    """The struct column that holds a source's rows in the journal."""
    return f"rows_{source.name}"


# ---------------------------------------------------------------------------- what serves a table


def served_by_rows(spark: SparkSession, source: BoundSource, start: int) -> bool:
    """Whether the table's newest snapshot serves every version since `start` without time travel:
    an append-only changelog (`changelog: true`) with row tracking on since at least `start`, whose
    retained log shows no commit that updates or deletes rows. Each row then carries the version
    that wrote it (`_metadata.row_commit_version`, kept by OPTIMIZE)."""
    where = source.spec.location
    if not source.spec.changelog or not delta_io.row_tracking(spark, where):
        return False
    commits = delta_io.history(spark, where, since=max(start, delta_io.oldest_version(spark, where)))
    # Rows written before row tracking was turned on carry the version that turned it on; a row
    # updated or deleted after the start would be missing from, or misplaced in, the newest snapshot.
    return not any(c.version > start and (c.enables_row_tracking or c.rewrites_rows) for c in commits)


def retained_since(spark: SparkSession, location_: str, version: int) -> bool:
    """Whether Delta still serves time travel to `version` and the change feed after it: its log
    entry is kept and it was committed within the file retention (unless the session turned off
    Delta's check of that, `ENFORCE_RETENTION`: Delta then serves what its files still hold)."""
    oldest, _ = delta_io.logged_versions(spark, location_)
    if version < oldest:
        return False
    if (spark.conf.get(ENFORCE_RETENTION, None) or "true").lower() == "false":
        return True
    commit = delta_io.history(spark, location_, since=version)[0]
    age = datetime.now(UTC) - from_spark(commit.timestamp)
    return age < delta_io.file_retention(spark, location_)


def serves(spark: SparkSession, plan: Plan, source: BoundSource, version: int) -> bool:
    """Whether a table source at `version` is served without Delta's copy of that version: by its
    own newest rows (`served_by_rows`, from the start the journal records) or by the job's journal."""
    held = coverage(spark, location(plan)).get(source.name)
    if held is not None and held.copied and held.last >= version:
        return True
    return held is not None and served_by_rows(spark, source, held.first)


# ---------------------------------------------------------------------------- reading it


_coverage_cache: dict[str, tuple[int, dict[str, Coverage], dict[str, set[int]]]] = {}


def coverage(spark: SparkSession, where: str) -> dict[str, Coverage]:
    """Per source, the versions the journal at `where` holds (none: no journal yet)."""
    return _state(spark, where)[0]


def _state(spark: SparkSession, where: str) -> tuple[dict[str, Coverage], dict[str, set[int]]]:
    """The journal's coverage per source, and per source the versions that more than one append
    recorded (readers then pick one append per version). A local journal's answer is kept per
    process until the journal gets a new commit (a listing tells)."""
    newest = delta_io.newest_logged(where)
    cached = _coverage_cache.get(where)
    if newest is not None and cached is not None and cached[0] == newest:
        return cached[1], cached[2]
    if newest == -1 or not delta_io.exists(spark, where):
        return {}, {}
    commits = delta_io.read_snapshot(spark, where).where(F.col(KIND).isNull())
    counted = commits.groupBy("source", "version").agg(
        F.count(F.lit(1)).alias("_sj_repeats"), F.min(COPIED).alias(COPIED)
    )
    per_source = counted.groupBy("source").agg(
        F.min(COPIED).alias(COPIED),
        F.min("version").alias("first"),
        F.max("version").alias("last"),
        F.collect_set(F.when(F.col("_sj_repeats") > 1, F.col("version"))).alias("repeated"),
    )
    rows = per_source.collect()
    held = {r["source"]: Coverage(r["first"], r["last"], r[COPIED] is not False) for r in rows}
    repeated = {r["source"]: set(r["repeated"]) for r in rows}
    if newest is not None:
        _coverage_cache[where] = (newest, held, repeated)
    return held, repeated


def read(
    spark: SparkSession, where: str, source: BoundSource, start: int, upto: int
) -> tuple[DataFrame, int] | None:
    """The source's changes of versions [start, min(upto, last held)] from the journal, as the
    change feed gives them (its columns, `_change_type`, `_commit_version`, `_commit_timestamp`),
    and that last version; None when the journal does not hold the source from `start`."""
    held_all, repeated = _state(spark, where)
    held = held_all.get(source.name)
    if held is None or held.first != start or not held.copied:
        return None
    last = min(upto, held.last)
    journal = delta_io.read_snapshot(spark, where)
    mine = journal.where((F.col("source") == source.name) & (F.col("version") <= last))
    changes = mine.where(F.col(KIND).isNotNull())
    doubled = sorted(v for v in repeated.get(source.name, set()) if v <= last)
    if doubled:  # a version two appends recorded: the rows of the first append only
        chosen = (
            mine.where(F.col(KIND).isNull() & F.col("version").isin(doubled))
            .groupBy("version")
            .agg(F.min(WRITE).alias("_sj_write"))
        )
        changes = changes.join(F.broadcast(chosen), "version", "left").where(
            F.col("_sj_write").isNull() | (F.col("_sj_write") == F.col(WRITE))
        )
    struct = _rows_column(source)
    stored = journal.schema[struct].dataType if struct in journal.columns else StructType()
    assert isinstance(stored, StructType)  # written by `_changes` as a struct
    fields = set(stored.fieldNames())
    columns = [
        F.col(f"`{struct}`.`{f.name}`").alias(f.name)
        if f.name in fields
        else F.lit(None).cast(f.dataType).alias(f.name)  # a column added to the table since
        for f in source.schema.fields
    ]
    return (
        changes.select(
            *columns,
            F.col(KIND).alias(CHANGE_TYPE),
            F.col("version").alias(COMMIT_VERSION),
            F.col("commit_time").alias(COMMIT_TIMESTAMP),
        ),
        last,
    )


def commit_times(
    spark: SparkSession, where: str, source: BoundSource, since: int, upto: int
) -> dict[int, datetime]:
    """The commit times of the source's versions [since, upto] that the journal recorded."""
    if since > upto or source.name not in coverage(spark, where):
        return {}
    rows = (
        delta_io.read_snapshot(spark, where)
        .where(
            (F.col("source") == source.name) & F.col(KIND).isNull() & F.col("version").between(since, upto)
        )
        .select("version", "commit_time")
        .collect()
    )
    return {r["version"]: r["commit_time"] for r in rows}


# ---------------------------------------------------------------------------- keeping it up to date


@dataclass(frozen=True)
class _Extension:
    """What one table source's journal is extended by: its commits [since, target], from a journal
    that starts at `start`; `by_rows`: the table serves its own rows (row-tracked changelog), so
    only the commits' times are copied."""

    source: BoundSource
    start: StartEntry
    since: int
    target: int
    by_rows: bool


def update(
    spark: SparkSession, plan: Plan, starts: Mapping[str, StartEntry], targets: Mapping[str, int]
) -> None:
    """Extend the journal of `plan`'s job to `targets` for each table source from its start in
    `starts` (the arrival index's start entries): the commits after the newest the journal holds,
    in one append. Refuses, naming every such source, a table whose versions still missing from
    the journal Delta no longer serves, before anything is written."""
    if not plan.tables:
        return
    where = location(plan)
    held, repeated = _state(spark, where)
    wanted = [
        extension
        for source in plan.tables
        if (extension := _extension(spark, plan, source, held, starts, targets)) is not None
    ]
    lost = [
        (e.source, e.since)
        for e in wanted
        if not e.by_rows and not retained_since(spark, e.source.spec.location, e.since)
    ]
    if lost:
        raise HistoryNotRetainedError(_lost_message(plan, where, lost))
    write = uuid.uuid4().hex
    parts = [_commits(spark, e.source, e.since, e.target, write, copied=not e.by_rows) for e in wanted]
    parts += [_changes(spark, e.source, e.start, e.since, e.target, write) for e in wanted if not e.by_rows]
    if not parts:
        return
    before = delta_io.newest_logged(where)
    frame = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts)
    delta_io.append(frame.coalesce(1), where, merge_schema=True)
    after = delta_io.newest_logged(where)
    if before is not None and after == before + 1:  # no other writer meanwhile: known without a read
        extended = {
            e.source.name: Coverage(e.since if have is None else have.first, e.target, not e.by_rows)
            for e in wanted
            for have in [held.get(e.source.name)]
        }
        _coverage_cache[where] = (after, held | extended, repeated)


def _extension(
    spark: SparkSession,
    plan: Plan,
    source: BoundSource,
    held: Mapping[str, Coverage],
    starts: Mapping[str, StartEntry],
    targets: Mapping[str, int],
) -> _Extension | None:
    """What `source`'s journal must be extended by to reach its target; None when nothing (no
    start or target, or the journal holds it already). Refuses a journal begun at another start,
    and a changelog whose rows the journal never copied once it no longer serves them itself."""
    start, target = starts.get(source.name), targets.get(source.name)
    if start is None or target is None:
        return None
    where, have = location(plan), held.get(source.name)
    if have is not None and have.first != start.version:
        raise JobError(
            f"job {plan.spec.name!r}: the journal {where} holds table source {source.name!r} from version "
            f"{have.first}, but the job starts it at version {start.version}. Start the job afresh: "
            "`streamjoin reset <job file> --yes`"
        )
    since = start.version if have is None else have.last + 1
    if since > target:
        return None
    by_rows = served_by_rows(spark, source, start.version)
    if have is not None and not have.copied and not by_rows:
        raise JobError(
            f"job {plan.spec.name!r}: table source {source.name!r} is no longer an append-only changelog with row "
            "tracking (its log shows a commit that updates or deletes rows, or row tracking turned on after the "
            f"job's start), and the journal {where} holds only its commit times, not its rows. Declare it "
            "without changelog: true and start the job afresh: `streamjoin reset <job file> --yes`"
        )
    return _Extension(source, start, since, target, by_rows)


def _lost_message(plan: Plan, where: str, lost: list[tuple[BoundSource, int]]) -> str:
    names = ", ".join(f"{s.name!r} ({s.spec.location}) from version {v}" for s, v in lost)
    return (
        f"job {plan.spec.name!r}: Delta no longer serves table source(s) {names}, and the journal {where} "
        "does not hold those versions: Delta refuses versions older than delta.deletedFileRetentionDuration (7 days "
        "by default) and a table updated in place keeps no other copy of them. Start the job later, at a version "
        "Delta still serves: `streamjoin reset <job file> --yes`, then a later start_at (or `--from`); from then on, "
        "run `streamjoin index JOB` (or the live runner, or a backfill) more often than the file retention, so the "
        "journal copies each commit while Delta holds it"
    )


def _commits(
    spark: SparkSession, source: BoundSource, since: int, upto: int, write: str, copied: bool
) -> DataFrame:
    """One row per commit of the source in [since, upto] that its log still holds; `copied`: the
    append holds the commits' changes too."""
    history = delta_io.history(spark, source.spec.location, since=since, upto=upto)
    rows = [(c.version, from_spark(c.timestamp)) for c in history if c.version <= upto]
    if not rows or rows[-1][0] != upto:  # the target itself is always logged: it was just read
        raise JobError(f"table source {source.name!r}: version {upto} is not in its log")
    frame = local_frame(spark, rows, "version long, commit_time timestamp")
    return frame.select(
        F.lit(source.name).alias("source"),
        "version",
        "commit_time",
        F.lit(None).cast("string").alias(KIND),
        F.lit(write).alias(WRITE),
        F.lit(copied).alias(COPIED),
    )


def _changes(
    spark: SparkSession, source: BoundSource, start: StartEntry, since: int, upto: int, write: str
) -> DataFrame:
    """The source's changes of versions [since, upto]: from its start S (> 0), the rows it held at S
    as inserts of S stamped at the start's time, then the change feed."""
    where = source.spec.location
    advice = (
        f"Table source {source.name!r} can no longer be copied into the job's journal; run `streamjoin index JOB` "
        "more often than the file retention, or start the job later"
    )
    parts = []
    if since == start.version and since > 0:
        with delta_io.translated_errors(where, f"its start version {since}", advice):
            history = delta_io.read_snapshot(spark, where, since)
        parts.append(
            history.select(
                *_user_columns(source),
                F.lit("insert").alias(CHANGE_TYPE),
                F.lit(since).cast("long").alias(COMMIT_VERSION),
                F.lit(from_micros(start.commit_ts)).cast("timestamp").alias(COMMIT_TIMESTAMP),
            )
        )
        since += 1
    if since <= upto:
        with delta_io.translated_errors(where, f"the change data feed of versions {since} to {upto}", advice):
            feed = delta_io.read_changes(spark, where, upto, since)
        parts.append(feed.select(*_user_columns(source), CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP))
    changes = reduce(DataFrame.unionByName, parts)
    return changes.select(
        F.lit(source.name).alias("source"),
        F.col(COMMIT_VERSION).cast("long").alias("version"),
        F.col(COMMIT_TIMESTAMP).alias("commit_time"),
        F.col(CHANGE_TYPE).alias(KIND),
        F.lit(write).alias(WRITE),
        F.struct(*_user_columns(source)).alias(_rows_column(source)),
    )


def _user_columns(source: BoundSource) -> list[Column]:
    return [F.col(f"`{c}`") for c in source.schema.fieldNames()]
