"""The time model both runners share: arrival positions, the settled frontier, watermarks, lateness.

Every stream row has an event time and an arrival position: (commit timestamp, source index,
commit version) of the Delta commit that added it. Rows of one commit share a position.

- The *watermark* at a position p is the largest event time among accepted rows at positions
  strictly before p, minus the join's grace. A row whose event time is strictly below the watermark
  at its own position is *late*.
- The *frontier* of a set of inputs is the smallest, over the job's sources, of each source's
  newest position with rows. Rows at or before it are *settled*: no commit yet to come can take a
  place before them, so their lateness is final. Rows after it wait.

Both are functions of the Delta log alone, never of the wall clock or of how the rows were divided
into micro-batches, which is what makes a live run and a replay write the same rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

import numpy as np
import pandas as pd
import pendulum
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from streamjoin.delta_io import COMMIT_TIMESTAMP, COMMIT_VERSION
from streamjoin.frames import local_frame
from streamjoin.timeutil import Instant, parse_instant, to_micros

T = "_sj_t"  # event time, UTC microseconds (NULL when missing or unparseable)
TS = "_sj_ts"  # commit timestamp, UTC microseconds
SRC = "_sj_src"  # source index in the join chain
V = "_sj_v"  # commit version
REJECT = "_sj_reject"  # why the row is bad input, or NULL
WM = "_sj_wm"  # the watermark at the row's arrival (NULL before any event time arrived)
EMIT = "_sj_emit"  # a derived row's emission position (a `position_struct`)
META = (T, TS, SRC, V, REJECT)


class Position(NamedTuple):
    """A row's arrival position: the Delta commit that added it. Positions order as tuples do
    (commit time, then source index, then version), which is the arrival order (docs/semantics.md)."""

    time: int  # the commit's timestamp, UTC microseconds
    source: int  # the source's index in the job
    version: int  # the commit's version


NULL_KEY = "null_key"
NULL_TIME = "null_event_time"
BAD_TIME = "unparseable_event_time"
FUTURE_TIME = "future_event_time"


def too_far_ahead(time: Column, commit_time: Column, max_future: int | None) -> Column:
    """An event time leads its commit time by more than `max_future` (microseconds; None: never).
    NULL while the commit time is not known yet (`guard_future` decides once it is)."""
    if max_future is None:
        return F.lit(False)
    return time > commit_time + F.lit(max_future)


def guard_future(rows: DataFrame, max_future: int | None) -> DataFrame:
    """Reject, with reason `future_event_time`, the accepted rows whose event time leads their
    commit time (`TS`) by more than `max_future`: one clock error must not lift the watermark past
    every row still to come (docs/semantics.md, "Bad input")."""
    if max_future is None:
        return rows
    ahead = F.when(too_far_ahead(F.col(T), F.col(TS), max_future), F.lit(FUTURE_TIME))
    return rows.withColumn(REJECT, F.coalesce(F.col(REJECT), ahead))


@dataclass(frozen=True)
class CommitStats:
    """One source commit, as far as time goes: its position and the largest accepted event time,
    and how many of its rows (and rejected rows) each replay slice owns (slice number -> (rows,
    rejected))."""

    position: Position
    max_event: int | None
    rows: int
    rejected: int = 0
    owned: dict[int, tuple[int, int]] = field(default_factory=dict)
    # Of the rows counted in `rows`: the range of their event times, and how many have none.
    min_time: int | None = None
    max_time: int | None = None
    untimed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "position", Position(*self.position))  # a plain tuple read by name too

    def owned_rows(self, slice_number: int = 0) -> int:
        return self.owned.get(slice_number, (0, 0))[0]

    def owned_rejected(self, slice_number: int = 0) -> int:
        return self.owned.get(slice_number, (0, 0))[1]


@dataclass(frozen=True)
class Slice:
    """One interval [start, end) of UTC time, the unit a replay replaces, a backfill cuts and
    records, a metrics row counts and verify compares."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:  # aware, in UTC (a naive datetime is UTC)
        object.__setattr__(self, "start", parse_instant(self.start, "start"))
        object.__setattr__(self, "end", parse_instant(self.end, "end"))

    @classmethod
    def of(cls, start: Instant, end: Instant) -> Slice:
        """From datetimes (naive: UTC) or ISO strings, as the CLI takes them."""
        return cls(parse_instant(start, "start"), parse_instant(end, "end"))

    def micros(self) -> tuple[int, int]:
        """Start and end in UTC microseconds, as the kernel counts time."""
        return to_micros(self.start), to_micros(self.end)

    def label(self, timezone: str = "UTC") -> str:
        """The slice as a person reads it: local start and end in `timezone`."""
        start = pendulum.instance(self.start).in_timezone(timezone)
        end = pendulum.instance(self.end).in_timezone(timezone)
        return f"{start.isoformat()} .. {end.isoformat()}"

    def short_label(self, timezone: str = "UTC") -> str:
        """The slice in a table cell: local times to the minute, the end's date only when it falls
        on another day than the start's (a slice ending at midnight ends at 24:00)."""
        start = pendulum.instance(self.start).in_timezone(timezone)
        end = pendulum.instance(self.end).in_timezone(timezone)
        if end.date() == start.date():
            until = f"{end:%H:%M}"
        elif end == start.add(days=1).start_of("day"):
            until = "24:00"
        else:
            until = f"{end:%m-%d %H:%M}"
        return f"{start:%Y-%m-%d %H:%M} \u2192 {until}"


@dataclass(frozen=True)
class Slices:
    """The slices one step decides, as the kernel reads them: consecutive `Slice`s [b0, b1),
    [b1, b2), ... as UTC microseconds, each accounted for on its own (a backfill's group of slices,
    or one replay's single slice). `bounds` None: one slice holding every time, as a live
    micro-batch has."""

    bounds: tuple[int, ...] | None = None

    @classmethod
    def of(cls, pieces: Iterable[Slice]) -> Slices:
        """From consecutive slices, each starting where the one before ended."""
        windows = [piece.micros() for piece in pieces]
        assert windows and all(a[1] == b[0] for a, b in zip(windows, windows[1:], strict=False))
        return cls((windows[0][0], *(w[1] for w in windows)))

    def __len__(self) -> int:
        return 1 if self.bounds is None else len(self.bounds) - 1

    def inside(self, time: Column, reach: tuple[int, int] = (0, 0)) -> Column:
        """`time` lies in one of the slices, or up to `reach` (before, after) around them."""
        if self.bounds is None:
            return F.lit(True)
        before, after = reach
        return (time >= F.lit(self.bounds[0] - before)) & (time < F.lit(self.bounds[-1] + after))

    def number(self, time: Column) -> Column:
        """The number of the slice `time` lies in (0, 1, ...); NULL outside them all."""
        if self.bounds is None:
            return F.lit(0)
        inside = (time >= F.lit(self.bounds[0])) & (time < F.lit(self.bounds[-1]))
        return F.when(inside, self._search(time, 0, len(self) - 1))

    def _search(self, time: Column, first: int, last: int) -> Column:
        """The number of the slice among `first`..`last` that `time` (inside them) lies in: a
        binary search, so a row costs a few comparisons however many slices there are."""
        if first == last:
            return F.lit(first)
        middle = (first + last + 1) // 2
        assert self.bounds is not None
        return F.when(time < F.lit(self.bounds[middle]), self._search(time, first, middle - 1)).otherwise(
            self._search(time, middle, last)
        )

    def owner(self) -> Column:
        """The slice that owns a row (by `slice_time`); NULL when no slice does."""
        return self.number(slice_time())


ALL_TIME = Slices()  # one slice holding every time: a live micro-batch's


def prepare(
    changes: DataFrame,
    index: int,
    raw_time: Column,
    event_time: Column,
    keys: Iterable[str],
    max_future: int | None = None,
    commit_time: bool = False,
) -> DataFrame:
    """Tag change-feed rows with event time, position and rejection reason; keep user columns.
    Rows read without their commit time (NULL `_commit_timestamp`) get the `max_future` guard
    from `guard_future` once it is attached. `commit_time`: the event time is the commit time
    (`time: commit`), never missing; rows read without it get it with their commit time."""
    keys = list(keys)
    null_key = F.lit(False)
    for key in keys:
        null_key = null_key | F.col(key).isNull()
    committed = F.unix_micros(F.col(COMMIT_TIMESTAMP))
    timeless = F.lit(False) if commit_time else raw_time.isNull()
    unparsed = F.lit(False) if commit_time else event_time.isNull()
    reason = (
        F.when(timeless, F.lit(NULL_TIME))
        .when(unparsed, F.lit(BAD_TIME))
        .when(null_key, F.lit(NULL_KEY))
        .when(too_far_ahead(event_time, committed, max_future), F.lit(FUTURE_TIME))
    )
    user = [c for c in changes.columns if c not in (COMMIT_VERSION, COMMIT_TIMESTAMP)]
    return changes.select(
        *[F.col(f"`{c}`") for c in user],
        event_time.alias(T),
        committed.alias(TS),
        F.lit(index).alias(SRC),
        F.col(COMMIT_VERSION).cast("long").alias(V),
        reason.alias(REJECT),
    )


def user_columns(rows: DataFrame) -> list[str]:
    """The source's own columns of a prepared DataFrame."""
    return [c for c in rows.columns if not c.startswith("_sj_")]


def slice_time(rejected: bool = True) -> Column:
    """The time that places a row in a replay slice: its event time; its commit time when it has
    none, or when the row was rejected for leading it too far (an event time not to be trusted,
    and one no replay of the rows' own period would otherwise read). `rejected` False: rows
    without a REJECT column (accepted rows)."""
    if not rejected:
        return F.coalesce(F.col(T), F.col(TS))
    return F.when(F.col(REJECT) == F.lit(FUTURE_TIME), F.col(TS)).otherwise(F.coalesce(F.col(T), F.col(TS)))


def in_reach(time_range: tuple[int, int], owned: tuple[int, int]) -> Column:
    """The rows a slice reads: event time in `time_range` (the slice and its margins), or a slice
    time (`slice_time`) in `owned` (the slice itself)."""
    low, high = time_range
    timed = (F.col(T) >= F.lit(low)) & (F.col(T) < F.lit(high))
    return timed | ((slice_time() >= F.lit(owned[0])) & (slice_time() < F.lit(owned[1])))


def commit_stats(
    rows: DataFrame, slices: Slices | None = None, counted: Column | None = None
) -> list[CommitStats]:
    """Per commit: position, largest accepted event time, row counts (small; collected).

    With `slices`, also the rows each slice owns (`Slices.owner`). With `counted`, `rows` and
    `rejected` count only the rows it holds for, while `max_event` still looks at every accepted row.
    """
    owner = F.lit(None).cast("int") if slices is None else slices.owner()
    counted = F.lit(True) if counted is None else counted
    grouped = rows.groupBy(TS, SRC, V, owner.alias("_sj_slice")).agg(
        F.max(F.when(F.col(REJECT).isNull(), F.col(T))).alias("max_event"),
        F.count(F.when(counted, 1)).alias("rows"),
        F.count(F.when(counted & F.col(REJECT).isNotNull(), 1)).alias("rejected"),
        F.count(F.lit(1)).alias("owned_rows"),
        F.count(F.when(F.col(REJECT).isNotNull(), 1)).alias("owned_rejected"),
        F.min(F.when(counted, F.col(T))).alias("min_time"),
        F.max(F.when(counted, F.col(T))).alias("max_time"),
        F.count(F.when(counted & F.col(T).isNull(), 1)).alias("untimed"),
    )
    parts: dict[Position, list] = {}
    for r in grouped.collect():
        parts.setdefault(Position(r[TS], r[SRC], r[V]), []).append(r)
    stats = []
    for position, groups in sorted(parts.items()):
        stats.append(
            CommitStats(
                position,
                max_present(g["max_event"] for g in groups),
                sum(g["rows"] for g in groups),
                sum(g["rejected"] for g in groups),
                {
                    g["_sj_slice"]: (g["owned_rows"], g["owned_rejected"])
                    for g in groups
                    if g["_sj_slice"] is not None
                },
                min_present(g["min_time"] for g in groups),
                max_present(g["max_time"] for g in groups),
                sum(g["untimed"] for g in groups),
            )
        )
    return stats


def max_present(values: Iterable[int | None]) -> int | None:
    """The largest of `values` that is not None (None if none is)."""
    present = [v for v in values if v is not None]
    return max(present) if present else None


def min_present(values: Iterable[int | None]) -> int | None:
    """The smallest of `values` that is not None (None if none is)."""
    present = [v for v in values if v is not None]
    return min(present) if present else None


def frontier(
    newest: dict[int, Position], sources: int, history_end: Position | None = None
) -> Position | None:
    """The settled frontier: the oldest of the sources' newest positions; None until all have rows
    (and for a job without stream sources). The job's history settles as one: a frontier inside
    it (at or before `history_end`, the last start position) is `history_end`, since no commit to
    come can be placed at or before the start instant."""
    if not newest or len(newest) < sources:
        return None
    oldest = min(newest.values())
    return history_end if history_end is not None and oldest < history_end else oldest


def newest_positions(
    commits: Iterable[CommitStats], into: dict[int, Position] | None = None
) -> dict[int, Position]:
    """Each source's newest position among `commits`, merged into `into`."""
    newest = dict(into or {})
    for commit in commits:
        src = commit.position.source
        if src not in newest or commit.position > newest[src]:
            newest[src] = commit.position
    return newest


def watermarks(
    commits: list[CommitStats], max_before: int | None, grace: int
) -> tuple[dict[tuple[int, int], int | None], int | None]:
    """The watermark at each commit (keyed by (source, version)) and the largest event time after all.

    `commits` must be in position order and `max_before` the largest event time of every settled
    position before the first of them.
    """
    line = timeline(commits, max_before)
    return line.watermarks(grace), line.max_event


@dataclass(frozen=True)
class Timeline:
    """What lateness and eager emission need of one step, keyed by commit (source index, version):
    the largest accepted event time strictly before each of its commits (`before`), up to and
    including each (`through`), before the first of them (`start`: what earlier steps had seen) and
    after all settled commits (`max_event`). The live runner builds it from its micro-batches
    (`timeline`), the replay from the arrival index."""

    before: dict[tuple[int, int], int | None]
    max_event: int | None
    through: dict[tuple[int, int], int | None] = field(default_factory=dict)
    start: int | None = None
    # Where the clock rises, from the step's first commit to its last settled one, whatever rows
    # were read: (the clock after, the commit's position), in position order. The last settled
    # commit (`end`) is where a closed input ends.
    rises: tuple[tuple[int, Position], ...] = ()
    end: Position | None = None

    def watermarks(self, grace: int) -> dict[tuple[int, int], int | None]:
        """The watermark at each commit: the largest event time before it, minus `grace`."""
        return {k: None if b is None else b - grace for k, b in self.before.items()}


def in_history(position: Position, history_end: Position | None) -> bool:
    """The position is one of the job's history, which ends at `history_end` (None: no history group)."""
    return history_end is not None and position <= history_end


def timeline(
    commits: list[CommitStats], max_before: int | None, history_end: Position | None = None
) -> Timeline:
    """The timeline of `commits` (position order) after a settled past whose largest event time is
    `max_before`. The commits at or before `history_end` are the job's history: one group that
    arrived at once (each sees `max_before` before it and the whole group's clock through it; the
    clock rises once, at the group's last commit)."""
    before: dict[tuple[int, int], int | None] = {}
    through: dict[tuple[int, int], int | None] = {}
    rises: list[tuple[int, Position]] = []
    running = max_before
    history = [c for c in commits if in_history(c.position, history_end)]
    if history:
        after = max_present([running, *(c.max_event for c in history)])
        for commit in history:
            before[(commit.position.source, commit.position.version)] = running
            through[(commit.position.source, commit.position.version)] = after
        if after is not None and after != running:
            rises.append((after, history[-1].position))
        running = after
    for commit in commits[len(history) :]:
        key = (commit.position.source, commit.position.version)
        before[key] = running
        if commit.max_event is not None and (running is None or commit.max_event > running):
            running = commit.max_event
            rises.append((running, commit.position))
        through[key] = running
    end = commits[-1].position if commits else None
    return Timeline(before, running, through, max_before, tuple(rises), end)


def per_commit_table(spark: SparkSession, values: dict[str, dict[tuple[int, int], int | None]]) -> DataFrame:
    """Values per commit as a small DataFrame, a column per name in `values` (each keyed by
    (source index, version); a commit missing from one has NULL there), to join onto rows with
    `with_per_commit`: e.g. `{WM: marks}` for each commit's watermark."""
    names = list(values)
    commits = dict.fromkeys(key for by_commit in values.values() for key in by_commit)
    schema = StructType(
        [
            StructField("_sj_msrc", LongType()),
            StructField("_sj_mv", LongType()),
            *[StructField(name, LongType()) for name in names],
        ]
    )
    rows = [(s, v, *(values[name].get((s, v)) for name in names)) for s, v in commits]
    return local_frame(spark, rows, schema)


def with_per_commit(rows: DataFrame, table: DataFrame) -> DataFrame:
    """Attach to each row the values at its commit from `table` (`per_commit_table`); NULL for a
    commit it does not hold (for the watermark `_sj_wm`: no watermark yet)."""
    joined = rows.join(
        F.broadcast(table),
        (F.col(SRC) == F.col("_sj_msrc")) & (F.col(V) == F.col("_sj_mv")),
        "left",
    )
    return joined.drop("_sj_msrc", "_sj_mv")


def when_clock_passes(
    spark: SparkSession, rows: DataFrame, threshold: Column, own: Column, timeline: Timeline, final: bool
) -> DataFrame:
    """`rows` with EMIT: the first settled position at or after `own` (a position struct, see
    `position_struct`) at which the clock (the largest accepted event time) exceeds `threshold`; a
    NULL threshold gives `own`. Where the clock never does, a closed input (`final`) gives its last
    settled commit. How a derived row's emission position is found: a padded row comes out at the
    commit whose rows close its window (docs/semantics.md, "Chains")."""
    clocks = [clock for clock, _ in timeline.rises]
    rise_schema = StructType(
        [
            StructField("_sj_rise", LongType()),
            StructField("_sj_rise_at", StructType(_POSITION_FIELDS)),
        ]
    )
    rises = local_frame(spark, [(k, p) for k, (_, p) in enumerate(timeline.rises)], rise_schema)
    started = F.lit(False) if timeline.start is None else F.lit(timeline.start) > threshold
    first_above = _first_above(clocks)(threshold) if clocks else F.lit(0).cast("long")
    numbered = rows.withColumn(
        "_sj_rise_k", F.when(threshold.isNull() | started, None).otherwise(first_above)
    )
    joined = numbered.join(F.broadcast(rises), F.col("_sj_rise_k") == F.col("_sj_rise"), "left")
    emit = F.when(threshold.isNull() | started, own).when(
        F.col("_sj_rise_at").isNotNull(), F.greatest(own, F.col("_sj_rise_at"))
    )
    if final and timeline.end is not None:
        emit = emit.otherwise(F.greatest(own, position_struct(*(F.lit(x) for x in timeline.end))))
    return joined.withColumn(EMIT, emit).drop("_sj_rise_k", "_sj_rise", "_sj_rise_at")


def _first_above(clocks: list[int]):
    """A vectorised UDF: for each threshold, the index of the first of `clocks` (ascending) above it."""
    ascending = np.array(clocks, dtype=np.int64)

    @F.pandas_udf(LongType())  # type: ignore[call-overload]  # pyspark's overloads miss this form
    def first_above(threshold: pd.Series) -> pd.Series:
        return pd.Series(np.searchsorted(ascending, threshold.to_numpy(), side="right"))

    return first_above


_POSITION_FIELDS = [
    StructField("ts", LongType()),
    StructField("src", LongType()),
    StructField("v", LongType()),
]


def position_struct(ts: Column, src: Column, version: Column) -> Column:
    """A position as one orderable column (structs compare field by field)."""
    return F.struct(
        ts.cast("long").alias("ts"), src.cast("long").alias("src"), version.cast("long").alias("v")
    )


def is_late() -> Column:
    """Strictly below the watermark at arrival: the same instant at which a window closes (docs)."""
    return F.col(WM).isNotNull() & (F.col(T) < F.col(WM))


def at_or_before(position: Position) -> Column:
    """Rows whose position is at or before `position` (a plain tuple is taken as one)."""
    position = Position(*position)
    at = (F.lit(position.time), F.lit(position.source), F.lit(position.version))
    return position_le((F.col(TS), F.col(SRC), F.col(V)), at)


def position_le(a: tuple[Column, Column, Column], b: tuple[Column, Column, Column]) -> Column:
    """Row-wise position a <= position b, for columns of two joined sides."""
    (ats, asrc, av), (bts, bsrc, bv) = a, b
    return (ats < bts) | ((ats == bts) & ((asrc < bsrc) | ((asrc == bsrc) & (av <= bv))))


def side_rows(rows: DataFrame, source: str, reason: Column, watermark: Column | None = None) -> DataFrame:
    """Late or rejected rows in the side-table form: the row as JSON, why, and when it arrived.

    `slice_time` (`slice_time()`) decides which replay slice owns the row, so re-running a slice
    replaces its side rows too.
    """
    return rows.select(
        F.lit(source).alias("source"),
        reason.alias("reason"),
        F.timestamp_micros(F.col(T)).alias("event_time"),
        (F.timestamp_micros(watermark) if watermark is not None else F.lit(None).cast("timestamp")).alias(
            "watermark"
        ),
        F.col(V).alias("commit_version"),
        F.timestamp_micros(F.col(TS)).alias("commit_timestamp"),
        F.to_json(F.struct(*[F.col(f"`{c}`") for c in user_columns(rows)])).alias("row"),
        F.timestamp_micros(slice_time(REJECT in rows.columns)).alias("slice_time"),
    )
