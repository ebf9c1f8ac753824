"""The job model: an immutable description of a join job, checked before any data moves.

A `JoinSpec` says which sources to join, in which order, under which conditions and time bounds,
and where the result goes. It holds no data and runs nothing: the runners (live and replay) take
it and decide which data and when. Build one in Python or load a YAML job file (docs/job-spec.md).
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pendulum

from streamjoin.enums import Emit, JoinType, SourceKind
from streamjoin.errors import JobError
from streamjoin.limits import check_nesting, load_yaml
from streamjoin.timeutil import format_duration, parse_duration, parse_instant

# A stream-table join's point in time: `arrival` (the row's commit), `event_time` (the row's event
# time) or a named time column of a stream before the join, `source.column` (Flink's `FOR
# SYSTEM_TIME AS OF o.order_time`; docs/job-spec.md, "Event-time temporal").
AsOf = str
AS_OF_WORDS = ("arrival", "event_time")
_AS_OF_COLUMN = re.compile(r"^`?([A-Za-z_][A-Za-z0-9_]*)`?\.`?([A-Za-z_][A-Za-z0-9_]*)`?$")

COMMIT_TIME = "commit"  # `time: commit`: a source's event time is its commit timestamp (docs/semantics.md)
DEFAULT_GRACE = timedelta(hours=24)  # ksqlDB's default grace period
DEFAULT_CLOCK_SKEW = timedelta(seconds=2)  # how late a table commit may become visible (docs/semantics.md)
# How far an event time may lead its commit time before the row is rejected (docs/semantics.md)
DEFAULT_MAX_FUTURE = timedelta(days=1)
_JOIN_TYPES = {
    "inner": JoinType.INNER,
    "join": JoinType.INNER,
    "left": JoinType.LEFT,
    "left outer": JoinType.LEFT,
    "left_outer": JoinType.LEFT,
    "right": JoinType.RIGHT,
    "right outer": JoinType.RIGHT,
    "right_outer": JoinType.RIGHT,
    "full": JoinType.FULL,
    "full outer": JoinType.FULL,
    "full_outer": JoinType.FULL,
    "outer": JoinType.FULL,
    "cross": JoinType.CROSS,
    "cross join": JoinType.CROSS,
}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Which join types each pair of source kinds supports (ksqlDB's and Lenses' compatibility tables),
# and why the others are refused.
SUPPORTED_TYPES: dict[tuple[str, str], tuple[str, ...]] = {
    ("stream", "stream"): ("inner", "left", "right", "full", "cross"),
    ("stream", "table"): ("inner", "left"),
    ("table", "table"): ("inner", "left", "full"),
    ("table", "stream"): (),
}
_REFUSALS = {
    ("stream", "table", "full"): "a FULL OUTER stream-table join has no sound semantics: table updates "
    "never trigger output, so the table side's unmatched rows could never be emitted (ksqlDB, Lenses)",
    ("stream", "table", "right"): "only stream rows trigger a stream-table join, so the table cannot be "
    "the preserved side",
    ("table", "table", "right"): "RIGHT table-table joins are not supported (ksqlDB): swap the two "
    "tables and use LEFT",
    ("table", "stream"): "a table cannot drive a stream: put the stream first (stream JOIN table)",
    ("stream", "table", "cross"): "a CROSS join pairs rows of two streams within time bounds (SQLstream); "
    "a table's rows have no window to bound the pairs",
    ("table", "table", "cross"): "a CROSS join pairs rows of two streams within time bounds (SQLstream); "
    "the product of two tables has no key to update it by",
}


@dataclass(frozen=True)
class Source:
    """A Delta input: an append-only `stream` of events, or a keyed `table` that changes over time."""

    name: str
    kind: SourceKind
    path: str | None = None
    table: str | None = None
    time: str | None = None
    time_format: str | None = None
    key: tuple[str, ...] = ()
    changelog: bool = False
    deleted: str | None = None
    clock_skew: timedelta = DEFAULT_CLOCK_SKEW
    start_at: int | str | None = None  # the version (or the time) the job begins at (docs/semantics.md)
    max_future: timedelta | None = DEFAULT_MAX_FUTURE  # None: no bound

    def __post_init__(self) -> None:
        where = f"source {self.name!r}"
        _check_start_at(self.start_at, f"{where}: start_at")
        if not _NAME.match(self.name or ""):
            raise JobError(
                f"{where}: a source name must be an identifier (letters, digits, _), e.g. 'orders'"
            )
        if self.kind not in list(SourceKind):
            raise JobError(f"{where}: kind is {self.kind!r}; write 'stream' (append-only events) or 'table'")
        object.__setattr__(self, "kind", SourceKind(self.kind))
        if bool(self.path) == bool(self.table):
            raise JobError(f"{where}: give exactly one of 'path' (a Delta folder) or 'table' (a table name)")
        if self.kind == "stream" and not self.time:
            raise JobError(
                f"{where}: a stream needs 'time', the name of its event-time column (or time: commit, "
                "its commit timestamp)"
            )
        if self.kind == "table" and self.time == COMMIT_TIME:  # what a table without `time` does already
            object.__setattr__(self, "time", None)
        if self.kind == "stream" and (self.changelog or self.deleted):
            raise JobError(
                f"{where}: 'changelog' and 'deleted' describe table sources; make it kind: table or remove them"
            )
        if self.deleted and not self.changelog:
            raise JobError(
                f"{where}: 'deleted' names the tombstone column of an append-only changelog; add changelog: true "
                "(a table updated in place records deletes in its change data feed)"
            )
        if self.clock_skew < timedelta(0):
            raise JobError(
                f"{where}: clock_skew {format_duration(self.clock_skew)} is negative; write 0s or more"
            )
        if self.max_future is not None and self.max_future < timedelta(0):
            raise JobError(
                f"{where}: max_future {format_duration(self.max_future)} is negative; write 0s or more, "
                "or none for no bound"
            )
        object.__setattr__(self, "key", tuple(self.key))

    @property
    def location(self) -> str:
        """The Delta path or table name, as given."""
        return self.path or self.table or ""


@dataclass(frozen=True)
class TimeBounds:
    """right.time - left.time must lie in [lower, upper], both ends included."""

    lower: timedelta
    upper: timedelta

    def describe(self) -> str:
        if self.lower == -self.upper:
            return f"WITHIN {format_duration(self.upper)}"
        return f"BETWEEN {format_duration(self.lower)} AND {format_duration(self.upper)}"


@dataclass(frozen=True)
class Windows:
    """Time windows of a window join (RisingWave's and Flink's TUMBLE and HOP): windows of `size`
    starting every `hop`, aligned to the Unix epoch in UTC, each [start, start + size)."""

    hop: timedelta
    size: timedelta

    @property
    def per_row(self) -> int:
        """How many windows hold each row."""
        return self.size // self.hop

    def describe(self) -> str:
        if self.hop == self.size:
            return f"TUMBLE {format_duration(self.size)}"
        return f"HOP {format_duration(self.hop)} SIZE {format_duration(self.size)}"


# The driver class of the databases whose JDBC URL names them (jdbc:<name>:...).
JDBC_DRIVERS = {
    "postgresql": "org.postgresql.Driver",
    "mysql": "com.mysql.cj.jdbc.Driver",
    "mariadb": "org.mariadb.jdbc.Driver",
    "sqlite": "org.sqlite.JDBC",
    "sqlserver": "com.microsoft.sqlserver.jdbc.SQLServerDriver",
    "oracle": "oracle.jdbc.OracleDriver",
}


@dataclass(frozen=True)
class Lookup:
    """An external database table a lookup join reads through JDBC (Flink's JDBC lookup source):
    `url` (jdbc:postgresql://host:port/db), the `table` in it, and credentials: `user`, and the
    name of an environment variable holding the password (never the password itself)."""

    url: str
    table: str
    user: str | None = None
    password_env: str | None = None
    driver: str | None = None  # the JDBC driver class; default: the one the URL's database ships

    def __post_init__(self) -> None:
        if not str(self.url).startswith("jdbc:"):
            raise JobError(
                f"lookup url {self.url!r} is not a JDBC URL; write e.g. url: jdbc:postgresql://127.0.0.1:5432/shop"
            )
        if not self.table:
            raise JobError("lookup: give the database table to look rows up in, e.g. table: customers")
        if self.password_env is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", self.password_env):
            raise JobError(
                f"lookup password_env {self.password_env!r} must name an environment variable (e.g. SHOP_PASSWORD), "
                "not hold the password"
            )

    @property
    def driver_class(self) -> str | None:
        """`driver`, else the usual driver of the URL's database (Spark finds no driver loaded from
        spark.jars by URL alone)."""
        if self.driver:
            return self.driver
        kind = self.url.split(":", 2)[1] if self.url.count(":") >= 2 else ""
        return JDBC_DRIVERS.get(kind)

    @property
    def where(self) -> str:
        """The table and database, for messages (without the URL's parameters, which may hold secrets)."""
        return f"{self.table} at {self.url.split('?', 1)[0]}"


@dataclass(frozen=True)
class Join:
    """One link of the join chain: everything joined so far, joined with `source`."""

    source: str
    type: JoinType = JoinType.INNER
    on: str | None = None
    using: tuple[str, ...] = ()
    natural: bool = False
    bounds: TimeBounds | None = None
    grace: timedelta = DEFAULT_GRACE
    emit: Emit = Emit.FINAL
    as_of: AsOf | None = None
    asof: bool = False
    window: Windows | None = None
    # ROWS windows (SQLstream): per source of the join, how many of its latest rows per key the
    # other stream sees; a stream not named is seen only as its rows arrive.
    rows: tuple[tuple[str, int], ...] = ()
    # Lateral joins (Flink): each row joined with rows made from it, not with a source; `source`
    # is then the name those rows go by. `unnest`: an array or map expression over the row;
    # `function`: a Python table function (`module:attribute`, a Spark UDTF) called with `args`;
    # `columns`: names for the made rows' columns (default: the element's, or the function's).
    # `lookup`: the rows of an external database table with equal keys, looked up as the row is
    # processed and recorded in a journal beside the output (streamjoin/joins/lookup.py).
    unnest: str | None = None
    function: str | None = None
    args: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()
    lookup: Lookup | None = None

    @property
    def lateral(self) -> bool:
        """Joined with rows made for each row (UNNEST, a table function, a database lookup) rather
        than with a source."""
        return self.unnest is not None or self.function is not None or self.lookup is not None

    def __post_init__(self) -> None:
        where = f"join with {self.source!r}"
        kind = _JOIN_TYPES.get(str(self.type).lower().strip())
        if kind is None:
            raise JobError(f"{where}: type {self.type!r} is unknown; write inner, left, right, full or cross")
        object.__setattr__(self, "type", kind)
        object.__setattr__(self, "using", tuple(self.using))
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "columns", tuple(self.columns))
        if self.lateral:
            self._check_lateral(where)
            return
        if self.args or self.columns:
            raise JobError(
                f"{where}: 'args' and 'columns' belong to UNNEST and table-function joins; remove them"
            )
        conditions = sum([bool(self.on), bool(self.using), bool(self.natural)])
        if kind == "cross" and conditions:
            raise JobError(
                f"{where}: a CROSS join pairs every row with every row of the other side within its time "
                "bounds and takes no condition; remove 'on'/'using'/'natural' (filters go in 'where'), or "
                "use type inner with the condition"
            )
        if kind != "cross" and conditions != 1:
            raise JobError(
                f"{where}: give exactly one condition: 'on' (an expression), 'using' (columns) or 'natural: true'"
            )
        if self.grace < timedelta(0):
            raise JobError(
                f"{where}: grace {format_duration(self.grace)} is negative; write a grace of 0s or more"
            )
        if self.bounds is not None and self.bounds.lower > self.bounds.upper:
            raise JobError(
                f"{where}: 'between' lower bound {format_duration(self.bounds.lower)} is above its upper bound "
                f"{format_duration(self.bounds.upper)}; write [lower, upper] with lower <= upper"
            )
        if self.emit not in list(Emit):
            raise JobError(f"{where}: emit is {self.emit!r}; write 'final' (default) or 'eager'")
        object.__setattr__(self, "emit", Emit(self.emit))
        if self.window is not None:
            self._check_window(where)
        object.__setattr__(self, "rows", tuple(self.rows))
        if self.rows:
            self._check_rows(where)
        if self.as_of is not None and self.as_of not in AS_OF_WORDS and self.as_of_column is None:
            raise JobError(
                f"{where}: as_of is {self.as_of!r}; write 'arrival' (the table as it was when the row arrived), "
                "'event_time' (the version valid at the row's event time) or a time column of a stream before "
                "the join, <source>.<column> (the version valid at that time)"
            )
        if self.asof and self.as_of_column is not None:
            raise JobError(
                f"{where}: an ASOF join picks its row by its inequality; as_of takes 'event_time' (the nearest "
                f"row over the table's whole history) or 'arrival', not a column ({self.as_of}): compare that "
                "column in the inequality instead"
            )

    @property
    def as_of_column(self) -> tuple[str, str] | None:
        """The (source, column) `as_of` names, e.g. `impressions.ts`; None for arrival/event_time."""
        named = _AS_OF_COLUMN.match(str(self.as_of)) if self.as_of is not None else None
        return (named.group(1), named.group(2)) if named else None

    @property
    def at_event_time(self) -> bool:
        """Looks its table up at an event time: the row's (`event_time`) or a named column's."""
        return self.as_of == "event_time" or self.as_of_column is not None

    def _check_lateral(self, where: str) -> None:
        """An UNNEST, table-function or lookup join's settings (Flink's array expansion, LATERAL
        TABLE and JDBC lookup)."""
        what = "an UNNEST" if self.unnest is not None else "a table-function" if self.function else "a lookup"
        if sum(x is not None for x in (self.unnest, self.function, self.lookup)) > 1:
            raise JobError(f"{where}: give one of 'unnest' (an array column), 'function' or 'lookup'")
        if self.bounds or self.window or self.rows or self.as_of or self.asof or self.emit != "final":
            raise JobError(
                f"{where}: {what} join is decided as each row is processed; remove within/between/window/rows/"
                "as_of/asof/emit"
            )
        if self.grace != DEFAULT_GRACE:
            raise JobError(f"{where}: {what} join judges no row late; remove 'grace'")
        if self.lookup is not None:
            self._check_lookup(where)
            return
        if self.type not in ("inner", "left", "cross"):
            raise JobError(
                f"{where}: {what} join is INNER (CROSS JOIN UNNEST, a row with no element is dropped) or LEFT "
                f"(the row kept, padded); type {self.type} has no meaning for rows made from the row itself"
            )
        if self.type == "cross":
            object.__setattr__(self, "type", JoinType.INNER)  # CROSS JOIN UNNEST(...) is Flink's inner form
        if self.using or self.natural or (self.on is not None and str(self.on).strip().lower() != "true"):
            raise JobError(
                f"{where}: {what} join pairs each row with the rows made from it and takes no condition "
                "(Flink: ON TRUE); remove 'on'/'using'/'natural' and filter in 'where'"
            )
        object.__setattr__(self, "on", None)
        if self.unnest is not None and self.args:
            raise JobError(f"{where}: 'args' are a table function's; UNNEST takes its array in 'unnest'")
        if self.function is not None and not re.match(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", self.function):
            raise JobError(
                f"{where}: function {self.function!r} should name a Spark Python UDTF as module:attribute, e.g. "
                "function: mypackage.functions:split_words"
            )
        for name in self.columns:
            if not _NAME.match(name):
                raise JobError(f"{where}: column name {name!r} must be an identifier (letters, digits, _)")
        if len(set(self.columns)) != len(self.columns):
            raise JobError(f"{where}: columns {list(self.columns)} name a column twice")

    def _check_lookup(self, where: str) -> None:
        """A lookup join: INNER or LEFT, on a condition with an equality (Flink's mandatory one);
        the settings it shares with UNNEST are checked by `_check_lateral`."""
        if self.type not in ("inner", "left"):
            raise JobError(
                f"{where}: a lookup join is INNER (a row without a database row is dropped) or LEFT (kept, "
                f"padded); type {self.type} has no meaning for rows looked up for the row"
            )
        if not self.on or self.using or self.natural:
            raise JobError(
                f"{where}: a lookup join needs 'on' with an equality of a stream column and a column of the "
                "database table (Flink's mandatory equality), e.g. on: orders.customer_id = c.id"
            )
        if self.args or self.columns:
            raise JobError(
                f"{where}: 'args' and 'columns' belong to UNNEST and table-function joins; remove them"
            )

    def _check_rows(self, where: str) -> None:
        """A ROWS-window join's settings that no source is needed to refuse."""
        if self.bounds is not None or self.window is not None:
            raise JobError(
                f"{where}: give either 'rows' (the latest rows per key) or 'window'/'within'/'between' (time), not both"
            )
        if self.type == "cross":
            raise JobError(
                f"{where}: ROWS windows count rows per key; a CROSS join has no key. Use type inner with "
                "on: a.id = b.id"
            )
        if self.emit == "eager":
            raise JobError(f"{where}: a ROWS-window join decides each row as rows arrive; remove 'emit'")
        for name, count in self.rows:
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise JobError(
                    f"{where}: rows {{{name}: {count!r}}} must be a whole number of rows, 1 or more "
                    "(SQLstream's ROWS 5 PRECEDING is 6: the five before and the current one)"
                )

    def _check_window(self, where: str) -> None:
        """A window join's settings that no source is needed to refuse (docs/job-spec.md)."""
        window = self.window
        assert window is not None
        if self.bounds is not None:
            raise JobError(
                f"{where}: give either 'window' (rows in the same time window) or 'within'/'between' (rows "
                "close in time), not both"
            )
        if self.type == "cross":
            raise JobError(
                f"{where}: a window join needs an equality between a left and a right column (RisingWave, "
                "Flink); use type inner with e.g. on: a.id = b.id"
            )
        if self.emit == "eager":
            raise JobError(
                f"{where}: a window join writes its padded rows when their window closes, never earlier; "
                "remove 'emit: eager'"
            )
        if window.hop <= timedelta(0) or window.size <= timedelta(0):
            raise JobError(
                f"{where}: window durations must be positive; write e.g. window: {{tumble: 10m}} or "
                "window: {hop: 10m, size: 1h}"
            )
        if window.size % window.hop:
            raise JobError(
                f"{where}: window size {format_duration(window.size)} is not a multiple of hop "
                f"{format_duration(window.hop)}; every row must lie in the same number of windows "
                f"(e.g. size {format_duration(window.hop * max(window.per_row, 1))})"
            )


@dataclass(frozen=True)
class Output:
    """Where the result goes. Side tables sit beside it: <output>_late, _rejected, _metrics."""

    path: str | None = None
    table: str | None = None
    time: str = "event_time"
    partition_by: tuple[str, ...] = ()
    key: tuple[str, ...] = ()  # columns that identify an output row: never NULL, unique (validation)

    def __post_init__(self) -> None:
        if bool(self.path) == bool(self.table):
            raise JobError("output: give exactly one of 'path' (a Delta folder) or 'table' (a table name)")
        if not _NAME.match(self.time or ""):
            raise JobError(f"output: time column name {self.time!r} must be an identifier, e.g. event_time")
        object.__setattr__(self, "partition_by", tuple(self.partition_by))
        object.__setattr__(self, "key", tuple(self.key))

    @property
    def location(self) -> str:
        return self.path or self.table or ""

    def side(self, suffix: str) -> str:
        """The location of a side table (`late`, `rejected`, `metrics`)."""
        return f"{self.location}_{suffix}"


@dataclass(frozen=True)
class Schedule:
    """When a job's slices are cut: every `every` (a duration, calendar days in `timezone`) from `start`."""

    every: str = "1d"
    timezone: str = "UTC"
    start: str | None = None  # ISO date or datetime: the first slice a scheduler runs (Airflow's start_date)
    live_every: str | None = None  # how often a scheduler runs the live runner (available-now), if at all
    verify: bool = False  # after each scheduled live run, compare the slices it wrote with the replay

    def __post_init__(self) -> None:
        parse_duration(self.every, "schedule: every")
        if self.live_every is not None:
            parse_duration(self.live_every, "schedule: live_every")
        if self.verify and self.live_every is None:
            raise JobError(
                "schedule: verify runs after each scheduled live run, but the job has no live_every; "
                "add e.g. live_every: 15m, or drop verify"
            )
        try:
            pendulum.timezone(self.timezone)
        except Exception:
            raise JobError(
                f"schedule: timezone {self.timezone!r} is unknown; write an IANA name such as UTC or Europe/Berlin"
            ) from None


@dataclass(frozen=True)
class Quality:
    """What every slice's output must satisfy (validated with Great Expectations, docs/validation.md)."""

    match_column: str | None = None  # an output column that is NULL exactly when a row is padded
    min_match_rate: float = 0.0  # share of output rows whose match_column is not NULL
    not_null: tuple[str, ...] = ()  # output columns padding never fills (the preserved side's)
    # Each link's match rate against the job's recent slices (docs/validation.md, "Links of a chain"):
    link_history: int = 7  # the last N valid slices whose median is the baseline; 0: no check
    link_min_history: int = 3  # the check applies once this many slices are known
    link_tolerance: float = 0.1  # how far below the baseline a slice's rate may fall
    link_min_rows: int = 20  # a link that reached fewer rows in a slice is not judged by it
    # A backfill run with --assume-earliest-known counts rows looked up in a table's earliest known
    # state as assumed (docs/backfills.md); a slice holding any is invalid unless this allows them.
    allow_assumed: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "not_null", tuple(self.not_null))
        if min(self.link_history, self.link_min_history, self.link_min_rows) < 0:
            raise JobError("quality: link_history, link_min_history and link_min_rows are counts: 0 or more")
        if not 0.0 <= float(self.link_tolerance) <= 1.0:
            raise JobError(
                f"quality: link_tolerance {self.link_tolerance!r} must lie between 0 and 1, e.g. 0.1"
            )
        if not 0.0 <= float(self.min_match_rate) <= 1.0:
            raise JobError(
                f"quality: min_match_rate {self.min_match_rate!r} must lie between 0 and 1, e.g. 0.95"
            )
        if self.min_match_rate and not self.match_column:
            raise JobError(
                "quality: min_match_rate needs match_column, the output column that is NULL when a row is unmatched"
            )


@dataclass(frozen=True)
class JoinSpec:
    """One join job: sources, the chain of joins in the order written, projection and output."""

    name: str
    sources: tuple[Source, ...]
    start: str
    joins: tuple[Join, ...]
    output: Output
    select: tuple[str, ...] = ()
    where: str | None = None
    description: str = ""
    schedule: Schedule = Schedule()
    quality: Quality = Quality()
    # the time every source begins at, unless the source says otherwise; a version (an int, as YAML
    # reads `start_at: 12`) is accepted here only for __post_init__ to refuse it with the job's message
    start_at: int | str | None = None

    def __post_init__(self) -> None:
        _check_start_at(self.start_at, f"job {self.name!r}: start_at", versions=False)
        object.__setattr__(self, "sources", tuple(self.sources))
        object.__setattr__(self, "joins", tuple(self.joins))
        object.__setattr__(self, "select", tuple(self.select))
        _validate(self)

    def source(self, name: str) -> Source:
        for source in self.sources:
            if source.name == name:
                return source
        raise JobError(f"job {self.name!r}: no source named {name!r}; sources are {', '.join(self.names)}")

    @property
    def names(self) -> tuple[str, ...]:
        """Names in the order they enter the join chain: sources, and the name of the rows a
        lateral join (UNNEST, a table function, a lookup) makes."""
        return (self.start,) + tuple(j.source for j in self.joins)

    def with_root(self, root: str | os.PathLike) -> JoinSpec:
        """The same job with relative Delta paths resolved against `root`."""

        def absolute(path: str | None) -> str | None:
            if path is None or "://" in path or os.path.isabs(path):
                return path
            return str(Path(root, path).resolve())

        return replace(
            self,
            sources=tuple(replace(s, path=absolute(s.path)) for s in self.sources),
            output=replace(self.output, path=absolute(self.output.path)),
        )


def _max_future(body: dict, where: str) -> timedelta | None:
    """A source's `max_future`: a duration, or `none` for no bound; the default when absent."""
    if "max_future" not in body:
        return DEFAULT_MAX_FUTURE
    value = body["max_future"]
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    return parse_duration(value, f"{where}: max_future")


def _check_start_at(value: Any, where: str, versions: bool = True) -> None:
    """A start is a version (of one source) or an ISO time; checked before any table is read."""
    if value is None:
        return
    if isinstance(value, bool):
        raise JobError(
            f"{where}: {value!r} is neither a version nor a time; write e.g. 42 or 2024-05-01T00:00:00Z"
        )
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        if not versions:
            raise JobError(
                f"{where}: a job-wide start is a time (e.g. 2024-05-01T00:00:00Z); give versions per source"
            )
        if int(value) < 0:
            raise JobError(f"{where}: version {value} is negative")
        return
    parse_instant(str(value), where)


def _validate(spec: JoinSpec) -> None:
    """Structural checks that need no data and no schema."""
    where = f"job {spec.name!r}"
    if not _NAME.match(spec.name or ""):
        raise JobError(f"job name {spec.name!r} must be an identifier (letters, digits, _)")
    for what, expression in _expressions(spec):
        check_nesting(str(expression), f"{where}, {what}")
    names = [s.name for s in spec.sources]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise JobError(f"{where}: source names must be unique; {', '.join(duplicates)} appear twice")
    if not spec.joins:
        raise JobError(f"{where}: 'joins' is empty; a join job needs at least one join")
    made = [j.source for j in spec.joins if j.lateral]
    for name in made:
        if name in names:
            raise JobError(
                f"{where}: {name!r} names both a source and the rows an UNNEST, table-function or lookup join makes; "
                "give the join another 'as'"
            )
    if made and len(spec.joins) > 1:
        raise JobError(
            f"{where}: an UNNEST, table-function or lookup join runs as the job's only join for now; split the job: "
            "write the expanded rows to a table in one job and join that table in a second"
        )
    chain = [n for n in spec.names if n not in made]
    for name in chain:
        if name not in names:
            raise JobError(
                f"{where}: the join chain names source {name!r}, which is not declared; sources are {', '.join(names)}"
            )
    if len(set(chain)) != len(chain):
        raise JobError(
            f"{where}: each source may appear once in the join chain; to self-join, declare the table twice under two names"
        )
    unused = [n for n in names if n not in chain]
    if unused:
        raise JobError(
            f"{where}: source(s) {', '.join(unused)} are declared but never joined; remove them or add a join"
        )
    left_kind = spec.source(spec.start).kind
    for join in spec.joins:
        link = f"{where}, join with {join.source!r}"
        if join.lateral:
            if left_kind != "stream":
                raise JobError(
                    f"{link}: UNNEST, table functions and lookups take the rows of a stream; {spec.start!r} is a table, "
                    "whose rows change. Declare it kind: stream if its rows are events"
                )
            continue
        right_kind = spec.source(join.source).kind
        pair = (left_kind, right_kind)
        if join.type not in SUPPORTED_TYPES[pair]:
            reason = _REFUSALS.get(pair + (join.type,)) or _REFUSALS.get(pair) or "unsupported"
            allowed = ", ".join(SUPPORTED_TYPES[pair]) or "none"
            article = "an" if join.type == "inner" else "a"
            raise JobError(
                f"{link}: {article} {join.type.upper()} join of a {left_kind} with a {right_kind} is refused: {reason}. Supported: {allowed}"
            )
        if pair == ("stream", "stream") and join.asof:
            raise JobError(
                f"{link}: ASOF between two streams is not supported yet (RisingWave's ASOF JOIN of two "
                f"append-only relations); declare {join.source!r} as a table (kind: table, key: [...], time: "
                "<column>) and add as_of: event_time for RisingWave's result, the nearest row over its whole "
                "history, final once its watermark has passed; without as_of each stream row gets the "
                "nearest row that had arrived before it"
            )
        if join.window is not None and pair != ("stream", "stream"):
            raise JobError(
                f"{link}: window joins pair rows of two streams in the same time window (RisingWave, Flink); "
                f"{join.source!r} is a {right_kind}. Use as_of/asof to look rows up in a table"
            )
        if join.rows and pair != ("stream", "stream"):
            raise JobError(
                f"{link}: ROWS windows keep the latest rows of streams (SQLstream: a table takes no OVER); "
                f"{join.source!r} is a {right_kind}"
            )
        unbounded = (
            pair == ("stream", "stream") and join.bounds is None and join.window is None and not join.rows
        )
        if unbounded and join.type == "cross":
            raise JobError(
                f"{link}: a CROSS join of two streams needs time bounds, or every row would pair with every "
                "row of the other stream forever; add 'within: 1m' (SQLstream's RANGE INTERVAL '1' MINUTE on "
                "both sides) or 'between: [-1m, 0s]'"
            )
        if unbounded:
            raise JobError(
                f"{link}: a stream-stream join needs time bounds, or its state would grow with all history; "
                "add 'within: 1h' (|right.time - left.time| <= 1h) or 'between: [-1h, 2h]' (right.time - left.time), or time windows: 'window: {tumble: 10m}'"
            )
        if pair != ("stream", "stream") and join.bounds is not None:
            raise JobError(
                f"{link}: 'within'/'between' apply to stream-stream joins only; remove them from this {left_kind}-{right_kind} join"
            )
        if pair != ("stream", "stream") and join.emit == "eager":
            raise JobError(
                f"{link}: 'emit: eager' applies to stream-stream joins only; remove it from this {left_kind}-{right_kind} join"
            )
        if pair != ("stream", "table") and (join.as_of or join.asof):
            raise JobError(
                f"{link}: 'as_of' and 'asof' apply to stream-table joins only; remove them from this {left_kind}-{right_kind} join"
            )
        if join.as_of_column is not None:
            _check_as_of_source(spec, join, link)
        table = spec.source(join.source)
        if right_kind == "table" and not table.key:
            what = "an ASOF" if join.asof else ("an event-time temporal" if join.at_event_time else "a")
            raise JobError(
                f"{link}: {what} join against table {table.name!r} needs the table's primary key, which identifies "
                f"the versions of a row: add key: [<column>, ...] to source {table.name!r}"
            )
        # The result of joining a stream with anything is a stream; table-table stays a table.
        left_kind = SourceKind.STREAM if "stream" in pair else SourceKind.TABLE


def _expressions(spec: JoinSpec) -> list[tuple[str, Any]]:
    """Every SQL expression of the job, with where it stands: what a parser will read."""
    found: list[tuple[str, Any]] = []
    for join in spec.joins:
        link = f"join with {join.source!r}"
        found += [(f"{link}: on", join.on), (f"{link}: unnest", join.unnest)]
        found += [(f"{link}: argument {n + 1}", arg) for n, arg in enumerate(join.args)]
    found += [(f"select item {n + 1}", item) for n, item in enumerate(spec.select)]
    found.append(("where", spec.where))
    return [(what, expression) for what, expression in found if expression is not None]


def _check_as_of_source(spec: JoinSpec, join: Join, link: str) -> None:
    """`as_of: <source>.<column>` names a stream joined before this link: the table is looked up
    at a time its rows carry (the plan checks the column against the schema)."""
    assert join.as_of_column is not None  # called for a named column only
    source, column = join.as_of_column
    before = spec.names[: spec.names.index(join.source)]
    declared = {s.name: s for s in spec.sources}
    streams = [n for n in before if n in declared and declared[n].kind == "stream"]
    if source in before and source in streams:
        return
    if source == join.source:
        why = f"{source!r} is the table this link looks up, whose versions are chosen by the time"
    elif source in before:
        why = f"{source!r} is a table; its columns say nothing of when the stream row happened"
    elif source in spec.names:
        why = f"{source!r} is joined after this link"
    else:
        why = f"no source is named {source!r}"
    times = ", ".join(
        f"{n}.{declared[n].time}" for n in streams if declared[n].time not in (None, COMMIT_TIME)
    )
    raise JobError(
        f"{link}: as_of {join.as_of} cannot be honoured: {why}. Name a time column of a stream joined before "
        f"it ({times or 'none declared'}), or write as_of: event_time (the row's event time)"
    )


# ---------------------------------------------------------------------------- job files


JOB_SUFFIXES = (".yaml", ".yml", ".sql")
# The settings of a job file's sections, as YAML names them (SQL jobs name them alike: sql.py).
SOURCE_KEYS = (
    "path",
    "table",
    "kind",
    "time",
    "time_format",
    "key",
    "changelog",
    "deleted",
    "clock_skew",
    "start_at",
    "max_future",
)
OUTPUT_KEYS = ("path", "table", "time", "partition_by", "key")
SCHEDULE_KEYS = ("every", "timezone", "start", "live_every", "verify")
QUALITY_KEYS = (
    "match_column",
    "min_match_rate",
    "not_null",
    "link_history",
    "link_min_history",
    "link_tolerance",
    "link_min_rows",
    "allow_assumed",
)


def job_files(folder: str | os.PathLike) -> list[Path]:
    """The job files of a folder, YAML or SQL, in name order."""
    found = Path(folder)
    return sorted(p for p in found.iterdir() if p.suffix.lower() in JOB_SUFFIXES) if found.is_dir() else []


def load_job(path: str | os.PathLike, root: str | os.PathLike | None = None) -> JoinSpec:
    """Load a job file, YAML or SQL (`.sql`, streamjoin/sql.py); relative Delta paths resolve
    against `root` ($STREAMJOIN_ROOT, else ./data)."""
    file = Path(path)
    if not file.exists():
        raise JobError(f"job file {str(file)!r} does not exist")
    if file.suffix.lower() == ".sql":
        spec = spec_from_sql(file.read_text(), origin=str(file))
        return spec.with_root(root or os.environ.get("STREAMJOIN_ROOT", "data"))
    document = load_yaml(file.read_text(), str(file))
    if not isinstance(document, dict):
        raise JobError(f"job file {str(file)!r} must hold a mapping with name, sources, from, joins, output")
    document.setdefault("name", file.stem)
    spec = spec_from_dict(document, origin=str(file))
    return spec.with_root(root or os.environ.get("STREAMJOIN_ROOT", "data"))


def spec_from_sql(text: str, origin: str = "job") -> JoinSpec:
    """Build a JoinSpec from a SQL job: source declarations and one CREATE STREAM ... AS SELECT
    (streamjoin/sql.py, docs/job-spec.md "Jobs in SQL")."""
    from streamjoin import sql  # sql.py builds on this module's vocabulary

    document, places = sql.compile_sql(text, origin)
    try:
        return spec_from_dict(document, origin=origin)
    except JobError as exc:  # a check of the mapping: point at the join's place in the statement
        message = sql.in_statement_words(str(exc))
        named = re.search(r"join with '([^']+)'", message)
        place = places.get(named.group(1), "") if named else ""
        raise type(exc)(f"{place}{message}") from None


def spec_from_dict(document: dict[str, Any], origin: str = "job") -> JoinSpec:
    """Build a JoinSpec from the job-file mapping (docs/job-spec.md)."""
    _only(
        document,
        {
            "name",
            "description",
            "sources",
            "from",
            "joins",
            "select",
            "where",
            "output",
            "schedule",
            "quality",
            "start_at",
        },
        origin,
    )
    for required in ("sources", "from", "joins", "output"):
        if required not in document:
            raise JobError(f"{origin}: missing '{required}'; see docs/job-spec.md")
    sources_doc = document["sources"]
    if not isinstance(sources_doc, dict) or not sources_doc:
        raise JobError(f"{origin}: 'sources' must map source names to their settings")
    sources = []
    for name, body in sources_doc.items():
        body = body or {}
        where = f"{origin}: source {name!r}"
        _only(body, SOURCE_KEYS, where)
        skew = (
            parse_duration(body["clock_skew"], f"{where}: clock_skew")
            if "clock_skew" in body
            else DEFAULT_CLOCK_SKEW
        )
        sources.append(
            Source(
                name=str(name),
                kind=body.get("kind", "stream"),
                path=body.get("path"),
                table=body.get("table"),
                time=body.get("time"),
                time_format=body.get("time_format"),
                key=_names(body.get("key")),
                changelog=bool(body.get("changelog", False)),
                deleted=body.get("deleted"),
                clock_skew=skew,
                start_at=_start_value(body.get("start_at")),
                max_future=_max_future(body, where),
            )
        )
    joins_doc = document["joins"]
    if not isinstance(joins_doc, list):
        raise JobError(f"{origin}: 'joins' must be a list of joins, in the order they apply")
    joins = [_join_from_dict(item, origin) for item in joins_doc]
    select = document.get("select") or ()
    if isinstance(select, str):
        select = [select]
    output_doc = document["output"] or {}
    _only(output_doc, OUTPUT_KEYS, f"{origin}: output")
    output = Output(
        path=output_doc.get("path"),
        table=output_doc.get("table"),
        time=output_doc.get("time", "event_time"),
        partition_by=_names(output_doc.get("partition_by")),
        key=_names(output_doc.get("key")),
    )
    schedule_doc = document.get("schedule") or {}
    _only(schedule_doc, SCHEDULE_KEYS, f"{origin}: schedule")
    verify = schedule_doc.get("verify", False)
    if not isinstance(verify, bool):
        raise JobError(f"{origin}: schedule: verify must be true or false, not {verify!r}")
    schedule = Schedule(
        every=str(schedule_doc.get("every", "1d")),
        timezone=str(schedule_doc.get("timezone", "UTC")),
        start=None if schedule_doc.get("start") is None else str(schedule_doc["start"]),
        live_every=None if schedule_doc.get("live_every") is None else str(schedule_doc["live_every"]),
        verify=verify,
    )
    quality_doc = document.get("quality") or {}
    _only(quality_doc, QUALITY_KEYS, f"{origin}: quality")
    quality = Quality(
        match_column=quality_doc.get("match_column"),
        min_match_rate=float(quality_doc.get("min_match_rate", 0.0)),
        not_null=_names(quality_doc.get("not_null")),
        link_history=int(quality_doc.get("link_history", Quality.link_history)),
        link_min_history=int(quality_doc.get("link_min_history", Quality.link_min_history)),
        link_tolerance=float(quality_doc.get("link_tolerance", Quality.link_tolerance)),
        link_min_rows=int(quality_doc.get("link_min_rows", Quality.link_min_rows)),
        allow_assumed=bool(quality_doc.get("allow_assumed", False)),
    )
    return JoinSpec(
        name=str(document.get("name")),
        description=str(document.get("description") or ""),
        sources=tuple(sources),
        start=str(document["from"]),
        joins=tuple(joins),
        select=tuple(str(s) for s in select),
        where=document.get("where"),
        output=output,
        schedule=schedule,
        quality=quality,
        start_at=_start_value(document.get("start_at")),
    )


def _start_value(value: Any) -> int | str | None:
    """YAML reads `start_at: 2024-05-01` as a date and `start_at: 12` as a number: keep versions as
    ints and everything else as text."""
    if value is None or isinstance(value, (int, str)):
        return value
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def _join_from_dict(item: Any, origin: str) -> Join:
    if isinstance(item, dict) and True in item:
        item = {("on" if k is True else k): v for k, v in item.items()}  # YAML 1.1 reads `on:` as true
    if isinstance(item, dict) and "join" not in item and ({"unnest", "function", "lookup"} & set(item)):
        return _lateral_from_dict(item, origin)
    if not isinstance(item, dict) or "join" not in item:
        raise JobError(
            f"{origin}: each entry of 'joins' needs 'join: <source name>' (or 'unnest: <array column>' or "
            "'function: module:udtf' with 'as: <name>')"
        )
    where = f"{origin}: join with {item['join']!r}"
    _only(
        item,
        {
            "join",
            "type",
            "on",
            "using",
            "natural",
            "within",
            "between",
            "grace",
            "emit",
            "as_of",
            "asof",
            "window",
            "rows",
        },
        where,
    )
    if "rows" in item and "grace" in item:
        raise JobError(
            f"{where}: a ROWS window judges no row late (it reads only the order rows arrive in); remove 'grace'"
        )
    if "rows" in item and (not isinstance(item["rows"], dict) or not item["rows"]):
        raise JobError(
            f"{where}: rows {item['rows']!r} should map a source of the join to a number of rows, e.g. rows: {{prices: 6}}"
        )
    bounds = None
    if "within" in item and "between" in item:
        raise JobError(f"{where}: give either 'within' or 'between', not both")
    if "within" in item:
        width = parse_duration(item["within"], f"{where}: within")
        if width < timedelta(0):
            raise JobError(
                f"{where}: within {item['within']!r} is negative; write a positive width such as 1h"
            )
        bounds = TimeBounds(-width, width)
    elif "between" in item:
        pair = item["between"]
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise JobError(
                f"{where}: 'between' takes two durations [lower, upper] of right.time - left.time, e.g. [-4h, 0s]"
            )
        bounds = TimeBounds(
            parse_duration(pair[0], f"{where}: between"), parse_duration(pair[1], f"{where}: between")
        )
    grace = parse_duration(item["grace"], f"{where}: grace") if "grace" in item else DEFAULT_GRACE
    window = _windows_from_dict(item["window"], where) if "window" in item else None
    return Join(
        source=str(item["join"]),
        type=item.get("type", "inner"),
        on=item.get("on"),
        using=_names(item.get("using")),
        natural=bool(item.get("natural", False)),
        bounds=bounds,
        grace=grace,
        emit=item.get("emit", "final"),
        as_of=item.get("as_of"),
        asof=bool(item.get("asof", False)),
        window=window,
        rows=tuple((str(name), count) for name, count in (item.get("rows") or {}).items()),
    )


def _lateral_from_dict(item: dict, origin: str) -> Join:
    """`unnest: orders.tags`, `function: pkg.mod:udtf` with `args`, or `lookup: {url, table}` with
    `on`, named by `as`."""
    kind = next(k for k in ("unnest", "function", "lookup") if k in item)
    where = f"{origin}: join {kind} {item[kind]!r}"
    _only(item, {"unnest", "function", "lookup", "args", "as", "columns", "type", "on"}, where)
    alias = item.get("as")
    if not isinstance(alias, str) or not _NAME.match(alias):
        raise JobError(
            f"{where}: give the rows it makes a name with 'as' (an identifier), e.g. as: t; select them as t.<column>"
        )
    args = item.get("args", [])
    if not isinstance(args, list):
        raise JobError(f"{where}: 'args' is a list of expressions, e.g. args: [orders.comment]")
    lookup = None
    if "lookup" in item:
        settings = item["lookup"]
        _only(settings, {"url", "table", "user", "password_env", "driver"}, f"{where}: lookup")
        lookup = Lookup(
            url=str(settings.get("url", "")),
            table=str(settings.get("table", "")),
            user=None if settings.get("user") is None else str(settings["user"]),
            password_env=None if settings.get("password_env") is None else str(settings["password_env"]),
            driver=None if settings.get("driver") is None else str(settings["driver"]),
        )
    return Join(
        source=alias,
        type=item.get("type", "inner"),
        on=item.get("on"),
        lookup=lookup,
        unnest=None if "unnest" not in item else str(item["unnest"]),
        function=None if "function" not in item else str(item["function"]),
        args=tuple(str(a) for a in args),
        columns=_names(item.get("columns")),
    )


def _windows_from_dict(value: Any, where: str) -> Windows:
    """`{tumble: 10m}` or `{hop: 10m, size: 1h}`."""
    example = "write window: {tumble: 10m} or window: {hop: 10m, size: 1h}"
    if not isinstance(value, dict):
        raise JobError(f"{where}: window {value!r} is not a mapping; {example}")
    _only(value, {"tumble", "hop", "size"}, f"{where}: window")
    if "tumble" in value:
        if set(value) != {"tumble"}:
            raise JobError(f"{where}: a tumbling window takes only its size; {example}")
        size = parse_duration(value["tumble"], f"{where}: window tumble")
        return Windows(size, size)
    if set(value) != {"hop", "size"}:
        raise JobError(f"{where}: a hopping window takes both 'hop' and 'size'; {example}")
    return Windows(
        parse_duration(value["hop"], f"{where}: window hop"),
        parse_duration(value["size"], f"{where}: window size"),
    )


def _names(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(str(v) for v in value)


def _only(body: Any, allowed: Collection[str], where: str) -> None:
    if not isinstance(body, dict):
        raise JobError(f"{where}: expected a mapping of settings")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise JobError(
            f"{where}: unknown setting(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(allowed))}"
        )
