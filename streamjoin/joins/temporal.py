"""Enrichment joins of a stream with a table: stream-table, event-time temporal, and ASOF.

Each stream row looks up one state of the table, chosen by a point in time, and joins the rows of
that state that satisfy the condition. Only stream rows trigger output; table changes never do
(ksqlDB, Lenses, Flink). The three variants differ only in which state a row sees:

- **stream-table** (`as_of: arrival`, the default; ksqlDB/Lenses/SQLstream, Flink and RisingWave
  processing-time joins): the table as it was when the row arrived, i.e. every change committed
  at or before the row's commit timestamp. Decided from the Delta log, so it is replayable.
- **event-time temporal** (`as_of: event_time`, Flink FOR SYSTEM_TIME AS OF): per primary key, the
  version whose validity holds the row's event time, versions ordered by version time; with
  `as_of: <source>.<column>` (Flink's named time attribute), the version valid at that column's
  time (a NULL time matches no version).
- **ASOF** (`asof: true`, RisingWave): among the rows the table held when the row arrived, those
  with equal keys that satisfy the one inequality, and of them the nearest (`right <= left` and
  `right < left` pick the largest right value, `>=` and `>` the smallest; of equal values, the
  latest arrival).
- **ASOF over the table's history** (`asof: true, as_of: event_time`, RisingWave's result): the
  same choice among every on-time version of the table, each a row at its version time, whether
  it arrived before or after the stream row. The inequality compares the table's version time.

A row is *decided* once the table can no longer change the answer:
- arrival and ASOF: once the table's log is known up to the row's commit timestamp: the table has
  committed at or after it, or some stream has committed `clock_skew` after it (a table commit
  made later carries a later timestamp; docs/semantics.md).
- event time: once the row's event time (or its named time) is below the table's horizon: for version times from a
  column, the table's watermark (largest version time minus grace), below which a change would be
  late; for commit-time versions, the time up to which the log is known (as above).
- ASOF over the history: nearest preceding (`right <= left`, `<`): once the row's value is below
  the table's watermark; nearest following (`>=`, `>`): once its nearest row's version time is
  below the watermark (every row still to come is on time only at or above it). Without a
  following row it waits for one, or for the end of a closed input. The second needs the lookup,
  so these rows are decided after it (`unsettled`).
Undecided rows wait (live state, `open` in the metrics). Stream rows are never late here: their
answer depends only on the table's versions, which Delta keeps. Table changes with a version time
column are late when below the table's watermark at their arrival (exact mode) and then never
become versions; `complete` mode applies every change.

Output event time is the stream row's event time. INNER drops a decided row without a match;
LEFT pads it with NULLs.

A chain of such joins (`FROM a JOIN b JOIN c`, b and c tables: ksqlDB's N-way join) is one
`Enrichment` with a link per table, in the order written: every link looks its table up at the
stream row's point in time, a later link may use an earlier link's columns, and a row is decided
once every link's table is final for it. A stream row keeps its event time and position through
every link, so each link decides as it would alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StructField, TimestampNTZType, TimestampType
from sqlglot import exp

from streamjoin import arrival, changelog, family
from streamjoin.arrival import ALL_TIME, REJECT, SRC, TS, Slices, T, V, watermarks
from streamjoin.changelog import TableInput
from streamjoin.enums import LinkKind, SourceKind
from streamjoin.errors import JobError
from streamjoin.joins.base import (
    CLOCK,
    MATCHED,
    OUT_T,
    Counters,
    Evaluation,
    JoinOperator,
    SideCounts,
    StepInput,
    StepResult,
    tally_by_slice,
)
from streamjoin.joins.chain import Chain
from streamjoin.joins.chaining import Accepts, LinkInput, LinkRun, Upstream, declare
from streamjoin.links import STREAMS, Conditioned, Graced, Link
from streamjoin.metrics import LinkCounts, SourceCounts
from streamjoin.plan import BoundJoin, BoundSource, NamedTime, Plan, spelt_as
from streamjoin.spec import COMMIT_TIME, JoinSpec
from streamjoin.timeutil import format_duration, to_micros

DECIDED = "_sj_decided"
_NEAREST = "_sj_nearest"
_ROW = "_sj_row"  # a stream row's number within one step
_COMPLETE = "_sj_complete"  # emitted, and matched at every link
_ALIVE = "_sj_alive"  # not dropped by an INNER link
_HELD = "_sj_held"  # an ASOF link over the history cannot answer the row yet


# ---------------------------------------------------------------------------- the links


# A stream-table join's point in time: `arrival` (the row's commit), `event_time` (the row's event
# time) or a named time column of a stream before the join, `source.column` (Flink's `FOR
# SYSTEM_TIME AS OF o.order_time`; docs/job-spec.md, "Event-time temporal").
AS_OF_WORDS = ("arrival", "event_time")
_AS_OF_COLUMN = re.compile(r"^`?([A-Za-z_][A-Za-z0-9_]*)`?\.`?([A-Za-z_][A-Za-z0-9_]*)`?$")
_STREAM_TABLE = (SourceKind.STREAM, SourceKind.TABLE)
_AS_OF_STREAM_TABLE_ONLY = "'as_of' and 'asof' apply to stream-table joins only; remove them"


@dataclass(frozen=True)
class LooksUp(Link):
    """A stream row looking its table up, at `as_of`: `arrival` (the table as it was when the row
    arrived; the default), `event_time` or a named time column `<source>.<column>`."""

    as_of: str | None = None

    def _check(self, where: str) -> None:
        super()._check(where)
        if self.as_of is not None and self.as_of not in AS_OF_WORDS and self.as_of_column is None:
            raise JobError(
                f"{where}: as_of is {self.as_of!r}; write 'arrival' (the table as it was when the row arrived), "
                "'event_time' (the version valid at the row's event time) or a time column of a stream before "
                "the join, <source>.<column> (the version valid at that time)"
            )

    @property
    def as_of_column(self) -> tuple[str, str] | None:
        """The (source, column) `as_of` names, e.g. `impressions.ts`; None for arrival/event_time."""
        named = _AS_OF_COLUMN.match(str(self.as_of)) if self.as_of is not None else None
        return (named.group(1), named.group(2)) if named else None

    @property
    def at_event_time(self) -> bool:
        return self.as_of == "event_time" or self.as_of_column is not None

    @property
    def described(self) -> str:
        return "an event-time temporal" if self.at_event_time else "a"

    def check_pair(self, left: SourceKind, right: SourceKind, where: str) -> None:
        if (left, right) != _STREAM_TABLE:
            raise JobError(f"{where}: {_AS_OF_STREAM_TABLE_ONLY} from this {left}-{right} join")

    def check_job(self, spec: JoinSpec, where: str) -> None:
        """`as_of: <source>.<column>` names a stream joined before this link: the table is looked
        up at a time its rows carry (the plan checks the column against the schema)."""
        if self.as_of_column is None:
            return
        source, _ = self.as_of_column
        before = spec.names[: spec.names.index(self.source)]
        declared = {s.name: s for s in spec.sources}
        streams = [n for n in before if n in declared and declared[n].kind == "stream"]
        if source in before and source in streams:
            return
        if source == self.source:
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
            f"{where}: as_of {self.as_of} cannot be honoured: {why}. Name a time column of a stream joined before "
            f"it ({times or 'none declared'}), or write as_of: event_time (the row's event time)"
        )


@dataclass(frozen=True)
class Enriching(LooksUp, Graced, Conditioned):
    """A stream row enriched from a table (the three kinds below, one join operator: `Enrichment`)."""


@dataclass(frozen=True)
class StreamTableLink(Enriching):
    """Each stream row joined with the table as committed when the row arrived (ksqlDB's
    stream-table join; as_of: arrival, Flink's FOR SYSTEM_TIME AS OF PROCTIME())."""

    kind = LinkKind.STREAM_TABLE

    def _check(self, where: str) -> None:
        super()._check(where)
        if self.as_of not in (None, "arrival"):
            raise JobError(
                f"{where}: a stream-table link looks its table up at arrival; for {self.as_of} "
                "use a temporal link"
            )


@dataclass(frozen=True)
class TemporalLink(Enriching):
    """Each stream row joined with the table's version valid at its event time or at a named time
    column (Flink's event-time temporal join), decided once the table's watermark passed."""

    as_of: str | None = "event_time"

    kind = LinkKind.TEMPORAL

    def _check(self, where: str) -> None:
        super()._check(where)
        if not self.at_event_time:
            raise JobError(
                f"{where}: a temporal link looks its table up at an event time: as_of: event_time or "
                "<source>.<column>; for arrival use a stream-table link"
            )


@dataclass(frozen=True)
class AsofLink(Enriching):
    """Each stream row joined with the nearest table row by one inequality (RisingWave's ASOF
    JOIN): among the rows that had arrived before it, or (as_of: event_time) over the table's whole
    history."""

    kind = LinkKind.ASOF
    marks = ("asof",)

    def _check(self, where: str) -> None:
        super()._check(where)
        if self.as_of_column is not None:
            raise JobError(
                f"{where}: an ASOF join picks its row by its inequality; as_of takes 'event_time' (the nearest "
                f"row over the table's whole history) or 'arrival', not a column ({self.as_of}): compare that "
                "column in the inequality instead"
            )

    @property
    def described(self) -> str:
        return "an ASOF"

    def check_pair(self, left: SourceKind, right: SourceKind, where: str) -> None:
        if (left, right) == STREAMS:
            raise JobError(
                f"{where}: ASOF between two streams is not supported yet (RisingWave's ASOF JOIN of two "
                f"append-only relations); declare {self.source!r} as a table (kind: table, key: [...], time: "
                "<column>) and add as_of: event_time for RisingWave's result, the nearest row over its whole "
                "history, final once its watermark has passed; without as_of each stream row gets the "
                "nearest row that had arrived before it"
            )
        super().check_pair(left, right, where)


# ---------------------------------------------------------------------------- which link a job's item is


def _claim_nearest(
    given: Mapping[str, Any], left: SourceKind | None, right: SourceKind | None
) -> type[Link] | None:
    """`asof: true`: the nearest row by an inequality, whatever the kinds joined (it refuses two streams)."""
    return AsofLink if given.get("asof") else None


def _claim_point_in_time(
    given: Mapping[str, Any], left: SourceKind | None, right: SourceKind | None
) -> type[Link] | None:
    """An `as_of`: arrival is a stream-table link, any other point in time a temporal one."""
    as_of = given.get("as_of")
    return None if as_of is None else StreamTableLink if as_of == "arrival" else TemporalLink


def _claim_rest(given: Mapping[str, Any], left: SourceKind | None, right: SourceKind | None) -> type[Link]:
    """What no other family claims: a stream and a table (the last claim, taking every link)."""
    return StreamTableLink


def _asof_settings(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`asof: true` (false: not given)."""
    return {"asof": True} if item.get("asof") else {}


def _as_of_settings(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`as_of: arrival | event_time | <source>.<column>` (the link checks which)."""
    return {"as_of": item["as_of"]} if item.get("as_of") is not None else {}


# ---------------------------------------------------------------------------- SQL: ASOF JOIN, FOR SYSTEM_TIME AS OF


def _sql_asof(join: family.SqlJoin) -> None:
    """RisingWave's `ASOF JOIN` (or `ASOF LEFT JOIN`): `asof: true`."""
    if (join.join.args.get("method") or "").upper() == "ASOF":
        join.item["asof"] = True


def _sql_point_in_time(join: family.SqlJoin) -> None:
    """Flink's `FOR SYSTEM_TIME AS OF <time>`: PROCTIME() is `as_of: arrival`, a column the time it
    names (`_named_time`)."""
    table = join.join.this
    version = table.args.get("version")
    if version is None:
        return
    point = version.args.get("expression")
    if (
        isinstance(point, exp.Anonymous)
        and point.name.upper() == "PROCTIME"
        or (isinstance(point, exp.Func) and point.sql().upper() == "PROCTIME()")
    ):
        join.item["as_of"] = "arrival"
    elif isinstance(point, exp.Column):
        join.item["as_of"] = _named_time(join, point)
    else:
        raise JobError(
            f"{join.where}: {join.at(table)}FOR SYSTEM_TIME AS OF takes the stream's time column (event time) or "
            f"PROCTIME() (as the row arrived), not {point.sql()}"
        )


# What the links' refusals advise in a YAML job's words, and in a SQL statement's (`SqlSyntax.words`).
_ASOF_WORDS = {
    "as a table (kind: table, key: [...], time: <column>) and add as_of: event_time": (
        "as a table (CREATE TABLE ... WITH (path='...', key='...', time='...')) and join it with ASOF JOIN ... "
        "FOR SYSTEM_TIME AS OF <the stream's time column>"
    ),
    "; without as_of each stream row": "; without FOR SYSTEM_TIME AS OF each stream row",
}
_POINT_IN_TIME_WORDS = {
    "or write as_of: event_time (the row's event time)": (
        "in FOR SYSTEM_TIME AS OF (the stream's own time column: its event time)"
    ),
    _AS_OF_STREAM_TABLE_ONLY: "FOR SYSTEM_TIME AS OF and ASOF apply to stream-table joins only; remove them",
}


def _named_time(join: family.SqlJoin, point: exp.Column) -> str:
    """`FOR SYSTEM_TIME AS OF o.order_time`, Flink's named time attribute: `event_time` when it is
    the declared time of the one stream before the join (the row's own event time), else the
    column by its source's declared name (`impressions.ts` after an interval join), which the plan
    checks against the schema. A column of the table looked up, or of no source before the join,
    is refused."""
    seen, sources, table = join.seen, join.sources, join.name
    streams = [s for s in seen if sources[s]["kind"] == "stream"]
    if point.table:
        owner = join.aliases.get(point.table, point.table)
    else:  # a bare name: the stream before the join whose time column it is, else the first source
        timed = [s for s in streams if sources[s].get("time") == point.name]
        owner = timed[0] if len(timed) == 1 else seen[0]
    if owner not in seen:
        times = (
            ", ".join(f"{s}.{sources[s]['time']}" for s in streams if sources[s].get("time"))
            or "none declared"
        )
        what = (
            f"a column of {table}, the table looked up"
            if owner == table
            else "no column of a source before it"
        )
        raise JobError(
            f"{join.where}: {join.at(point)}FOR SYSTEM_TIME AS OF {point.sql()} is {what}: write FOR SYSTEM_TIME AS OF "
            f"<a time column of a stream before the join> (event time: {times}) or PROCTIME() (the table as each "
            "row arrived)"
        )
    if streams == [owner] and sources[owner].get("time") == point.name:
        return "event_time"
    return f"{owner}.{point.name}"


def looks_back(op: str) -> bool:
    """ASOF `stream <op> table` with >= or >: the table's values lie at or below the stream's, so
    the nearest is the largest (nearest preceding); with <= or < the smallest (nearest following)."""
    return op in (">=", ">")


def _bind(binding: family.Binding) -> dict[str, Any]:
    """An ASOF link's one inequality (and over the table's history, one on its version time); a
    time an `as_of` names, checked against its stream's schema."""
    link, left, right, where = binding.link, binding.left, binding.link.source, binding.where
    inequalities = binding.inequalities
    nearest = isinstance(link, AsofLink)
    if nearest and len(inequalities) != 1:
        found = (
            "none"
            if not inequalities
            else f"{len(inequalities)} ({', '.join(' '.join(i) for i in inequalities)})"
        )
        raise JobError(
            f"{where}: an ASOF join needs exactly one inequality (<=, <, >=, >) between a column of "
            f"{' / '.join(left)} and a column of {right}, which says which rows are candidates and which is "
            f"nearest; found {found}. Example: on: {left[0]}.sym = {right}.sym AND {right}.ts <= {left[0]}.ts"
        )
    if isinstance(link, AsofLink) and link.as_of == "event_time":
        _check_asof_over_history(binding, inequalities[0])
    return {"inequality": inequalities[0] if nearest else None, "named_time": _bind_as_of(binding)}


def _bind_as_of(binding: family.Binding) -> NamedTime | None:
    """The column `as_of` names, checked against its stream's schema: a timestamp (or
    timestamp_ntz) column, or the stream's declared time column. None when it is the time the row
    carries anyway: the declared time of the one stream before the link."""
    spec, join, schemas, where = binding.spec, binding.link, binding.schemas, binding.where
    if not isinstance(join, Enriching) or join.as_of_column is None:
        return None
    source, named = join.as_of_column  # the spec checked it names a stream before the link
    stream = spec.source(source)
    spelt = spelt_as(schemas[source], named)
    if spelt is None:
        raise JobError(
            f"{where}: as_of {join.as_of} names no column of {source}; its columns are "
            f"{', '.join(schemas[source].fieldNames())} (for the table as each row arrived, Flink's PROCTIME(), "
            "write as_of: arrival)"
        )
    field = schemas[source][spelt]
    declared = field.name == stream.time
    if not (isinstance(field.dataType, TimestampType | TimestampNTZType) or declared):
        raise JobError(
            f"{where}: as_of {join.as_of} is a column of type {field.dataType.simpleString()}, not a time; name a "
            f"timestamp column of {source}"
            + (
                f" or its time column {source}.{stream.time}"
                if stream.time not in (None, COMMIT_TIME)
                else ""
            )
        )
    streams = [s.name for s in spec.sources if s.name in binding.left and s.kind == "stream"]
    if declared and streams == [source]:
        return None  # the rows are that stream's own (enriched), at its event time
    return NamedTime(source, field.name, field.dataType, stream.time_format if declared else None)


def _check_asof_over_history(binding: family.Binding, inequality: tuple[str, str, str]) -> None:
    """An ASOF join over the table's whole history orders by the table's version time: only its
    watermark says that no nearer row can still come."""
    name = binding.link.source
    table = binding.spec.source(name)
    compared = inequality[2]
    if table.time is None or compared.split(".", 1)[1].strip("`") != table.time:
        fix = (
            f"compare {name}.{table.time} in the inequality"
            if table.time
            else f"declare the version-time column of {name!r} (time: <column>)"
        )
        raise JobError(
            f"{binding.where}: an ASOF join with as_of: event_time (nearest row over the table's whole history) "
            f"orders by the table's version time, whose watermark tells when no nearer row can come; "
            f"the inequality compares {compared}. {fix}, or drop as_of to pick the nearest row that "
            "had arrived before the stream row"
        )


def _explain(plan: Plan, join: BoundJoin, step: int) -> list[str]:
    """How an enrichment join resolves the table's versions (docs/semantics.md), under its header."""
    table = plan.source(join.right).spec
    if table.changelog:
        tombstone = f"{table.deleted} = true" if table.deleted else "every value column NULL"
        form = f"append-only changelog (each row a new value of its key; tombstone: {tombstone})"
    else:
        form = "updated in place (inserts, update post-images and deletes from its change data feed)"
    lines = [f"table {table.name}: {form}, primary key {', '.join(table.key)}"]
    if join.family == "temporal":
        lines += _explain_event_time(plan, join)
    elif join.family == "asof" and join.link(Enriching).as_of == "event_time":
        lines += _explain_history(plan, join)
    else:
        lines += _explain_arrival(plan, join)
    return [f"     {line}" for line in lines]


def _stream_words(plan: Plan, join: BoundJoin) -> str:
    """The rows the table enriches: the stream's, or (after stream-stream links) theirs, each at its emission."""
    if plan.joins[0].family == "interval":
        return f"joined ({' + '.join(join.left)})"
    return join.left[0]


def _waits(plan: Plan, join: BoundJoin) -> str:
    table = plan.source(join.right).spec
    return (
        f"the table's log is known up to the row's commit: a table commit at or after it, or a stream "
        f"commit {format_duration(table.clock_skew)} (clock_skew) later"
    )


def _explain_event_time(plan: Plan, join: BoundJoin) -> list[str]:
    """A temporal link: the version valid at the row's event time (or a named time)."""
    table, grace = plan.source(join.right).spec, join.link(Enriching).grace
    versions = f"version time {table.time}" if table.time else "version time = commit timestamp"
    named = join.named_time
    point = "the row's event time" if named is None else f"{named.source}.{named.column}"
    lines = [
        f"versions: per key, ordered by {versions}; each {_stream_words(plan, join)} row joins the version valid at {point}"
    ]
    if table.time:
        lines.append(
            f"decided once the table's watermark (largest version time - grace {format_duration(grace)}) "
            f"is above {point}; changes below the watermark at their arrival are late"
        )
    else:
        lines.append(f"decided once {_waits(plan, join)}")
    return lines


def _explain_history(plan: Plan, join: BoundJoin) -> list[str]:
    """An ASOF link over the table's whole history, decided by its watermark."""
    table, grace = plan.source(join.right).spec, join.link(Enriching).grace
    assert join.inequality is not None  # every ASOF join binds its one inequality
    left_col, op, right_col = join.inequality
    preceding = looks_back(op)
    return [
        f"ASOF over the table's history: among every version of the table (each a row at its version time "
        f"{table.time}) with equal keys and {left_col} {op} {right_col}, the one with the "
        f"{'largest' if preceding else 'smallest'} {right_col}, whenever it arrived",
        f"decided once the table's watermark (largest version time - grace {format_duration(grace)}) "
        + (
            f"is above {left_col}"
            if preceding
            else "is above the nearest row's version time (a row without one waits for it, or for a closed input)"
        )
        + "; changes below the watermark at their arrival are late",
    ]


def _explain_arrival(plan: Plan, join: BoundJoin) -> list[str]:
    """A stream-table link, or an ASOF one, over the table as committed when the row arrived."""
    lines = [
        f"versions: each {_stream_words(plan, join)} row sees the table as committed at or before the row's "
        "commit timestamp (what Delta time travel to that instant returns)"
    ]
    if join.family == "asof":
        assert join.inequality is not None  # every ASOF join binds its one inequality
        left_col, op, right_col = join.inequality
        nearest = "largest" if looks_back(op) else "smallest"
        lines.append(
            f"ASOF: among those rows with equal keys and {left_col} {op} {right_col}, the one with the {nearest} {right_col}"
        )
    lines.append(f"decided once {_waits(plan, join)}")
    return lines


def _reached(link: int) -> str:
    """The flag of rows that reached link `link` (0-based) alive."""
    return f"_sj_reached_{link}"


def _matched(link: int) -> str:
    """The flag of rows that reached link `link` alive and matched there."""
    return f"_sj_matched_{link}"


def _assumed(link: int) -> str:
    """The flag of rows that reached link `link` alive before the earliest time its table can be
    told, looked up in its earliest known state instead (`TableInput.known_from`)."""
    return f"_sj_assumed_{link}"


def _assumed_alive(link: int) -> str:
    """The flag of assumed rows that link `link` passed on (an INNER link drops those without a match)."""
    return f"_sj_assumed_alive_{link}"


@dataclass(frozen=True)
class TemporalJoin:
    """One enrichment link: a stream row (or a row of the chain so far, which carries its stream
    row's time and position) looks up one table's version at its point in time."""

    stream: str
    table: str
    type: str  # inner | left
    variant: str  # stream-table | temporal | asof
    key: tuple[str, ...]
    versioned_by_column: bool  # version times from the table's `time` column, else commit timestamps
    grace: int  # microseconds
    clock_skew: int  # microseconds
    equi: tuple[tuple[str, str], ...]
    residual: str | None
    inequality: tuple[str, str, str] | None
    over_history: bool = False  # ASOF among every version of the table (as_of: event_time)
    named_time: NamedTime | None = None  # as_of: <source>.<column>; else the row's event time

    @classmethod
    def from_plan(cls, join: BoundJoin, table: BoundSource, stream: str) -> TemporalJoin:
        spec = join.link(Enriching)
        return cls(
            stream=stream,
            table=join.right,
            type=spec.type,
            variant=join.family,
            key=table.spec.key,
            versioned_by_column=table.spec.time is not None,
            grace=to_micros(spec.grace),
            clock_skew=to_micros(table.spec.clock_skew),
            equi=join.equi,
            residual=join.residual,
            inequality=join.inequality,
            over_history=join.family == "asof" and spec.as_of == "event_time",
            named_time=join.named_time,
        )

    @property
    def order(self) -> str:
        """How versions are ordered: by arrival, or by version time (event-time temporal)."""
        return "event_time" if self.variant == "temporal" or self.over_history else "arrival"

    @property
    def by_watermark(self) -> bool:
        """Versions timed by a column, final below the table's watermark (late below it at arrival)."""
        return self.versioned_by_column and (self.variant == "temporal" or self.over_history)

    # ------------------------------------------------------------------ the table

    def versions(self, spark: SparkSession, table: TableInput, mode: str) -> TableVersions:
        """The table's on-time changes as versions, its late changes, and its counts per slice.
        Commit-time versions are never late; neither is anything in complete mode."""
        marks, largest = watermarks(table.commits, None, self.grace)
        if not self.by_watermark or mode == "complete":
            marks = {}
        changes = arrival.with_per_commit(table.changes, arrival.per_commit_table(spark, {arrival.WM: marks}))
        accepted, late = F.col(REJECT).isNull(), F.col(REJECT).isNull() & arrival.is_late()
        versions = changelog.versions(
            changes.where(accepted & ~late).drop(arrival.WM, REJECT), self.key, self.order
        )
        tally = tally_by_slice(
            changes,
            table.owner,
            late=F.count(F.when(late, 1)),
            applied=F.count(F.when(accepted & ~late, 1)),
        )
        late_rows = arrival.side_rows(
            changes.where(table.owner.isNotNull() & late), self.table, F.lit("late"), F.col(arrival.WM)
        )
        known = changelog.known_until(table.newest_ts, table.stream_clock, self.clock_skew)
        known_from = table.known_from if self.order == "event_time" and not self.over_history else None
        return TableVersions(versions, tally, late_rows, self.horizon(known, largest), known_from)

    def horizon(self, known: int | None, largest_version_time: int | None) -> int | None:
        """How far the table's answer is final: the table's watermark (largest version time minus
        grace) for versions from a column, else the commit time its log is known up to."""
        if self.by_watermark:
            return None if largest_version_time is None else largest_version_time - self.grace
        return known

    def decided(self, horizon: int | None) -> Column:
        """The stream row's answer can no longer change (module docstring); an ASOF link over the
        history decides after its lookup (`unsettled`)."""
        if horizon is None:
            return F.lit(False)
        if self.over_history:
            return F.lit(True)
        point = self.point(qualified=False)
        if self.named_time is not None:  # a row without its named time matches nothing: decided as at T
            point = F.coalesce(point, F.col(T))
        if self.by_watermark:
            return point < F.lit(horizon)  # strictly: a change at the watermark is still on time
        return (point if self.variant == "temporal" else F.col(TS)) <= F.lit(horizon)

    def point(self, qualified: bool = True) -> Column:
        """The time (UTC micros) a row looks its version up at: its event time, or the time `as_of`
        names, in the stream's own columns or in its source's struct (a chain's joined rows);
        `qualified` by the stream's alias, as in the lookup."""
        alias = (self.stream,) if qualified else ()
        if self.named_time is None:
            return F.col(".".join(f"`{part}`" for part in (*alias, T)))
        nested = () if self.named_time.source == self.stream else (self.named_time.source,)
        return self.named_time.micros((*alias, *nested))

    def unsettled(self, horizon: int | None) -> Column | None:
        """For an ASOF link over the history, on the looked-up rows: a row or version still to come
        may be nearer. None for every other link (decided before the lookup)."""
        if not self.over_history:
            return None
        assert self.inequality is not None  # every ASOF join has its one inequality
        if horizon is None:  # no version yet: decided() already kept every row back
            return F.lit(True)
        left_col, op, _ = self.inequality
        if looks_back(op):  # nearest preceding: every row still to come lies at or above the watermark
            return ~(F.unix_micros(F.expr(left_col).cast("timestamp")) < F.lit(horizon))
        return ~(self.matched() & (self._col(self.table, T) < F.lit(horizon)))

    # ------------------------------------------------------------------ matching

    def _col(self, side: str, name: str) -> Column:
        return F.col(f"{side}.`{name}`")

    def condition(self, known_from: int | None = None) -> Column:
        """Equal keys, the version valid at the row's point in time (not before `known_from`, the
        earliest time the table can be told at, if given), the residual, and for ASOF the inequality."""
        S, R = self.stream, self.table
        if self.over_history:  # every version, at its own version time
            cond = ~self._col(R, changelog.DELETED)
        else:
            point = self.point() if self.order == "event_time" else self._col(S, TS)
            if known_from is not None:
                point = F.greatest(point, F.lit(known_from))
            cond = changelog.valid_at(point, prefix=f"{R}.")
        for left_col, right_col in self.equi:
            cond = cond & (F.expr(left_col) == F.expr(right_col))
        if self.inequality:
            left_col, op, right_col = self.inequality
            cond = cond & F.expr(f"{left_col} {op} {right_col}")
        if self.residual:
            cond = cond & F.expr(self.residual)
        return cond

    def matched(self) -> Column:
        """A looked-up row found its version (a padded one has none)."""
        return self._col(self.table, TS).isNotNull()

    def lookup(
        self,
        rows: DataFrame,
        versions: DataFrame,
        row_columns: list[Column],
        alive: Column,
        known_from: int | None = None,
    ) -> DataFrame:
        """Each row (columns qualified by source name) with its matching versions, or padded with
        NULLs; rows not `alive` (dropped by an earlier link) match nothing. `row_columns` identify
        a row (ASOF keeps the nearest candidate per row). `known_from`: as in `condition`."""
        joined = rows.join(versions.alias(self.table), self.condition(known_from) & alive, "left_outer")
        return self._nearest(joined, row_columns) if self.inequality else joined

    def _nearest(self, joined: DataFrame, row_columns: list[Column]) -> DataFrame:
        """Per row, keep only its nearest candidate; of candidates with the same value, the latest
        arrival (RisingWave), then, within one commit, the table row's content."""
        R = self.table
        assert self.inequality is not None  # called for ASOF joins only, which have their inequality
        _, op, right_col = self.inequality
        tie = F.to_json(F.struct(*[self._col(R, c) for c in _user_columns(joined, R)]))
        commit, version = self._col(R, TS), self._col(R, V)
        by_row = Window.partitionBy(*row_columns)
        if looks_back(op):
            order = F.struct(
                F.expr(right_col).alias("v"), commit.alias("ts"), version.alias("cv"), tie.alias("t")
            )
            best = F.max(order).over(by_row)
        else:
            order = F.struct(
                F.expr(right_col).alias("v"), (-commit).alias("ts"), (-version).alias("cv"), tie.alias("t")
            )
            best = F.min(order).over(by_row)
        return (
            joined.withColumn(_NEAREST, best)
            .where(self._col(R, TS).isNull() | (F.col(_NEAREST) == order))
            .drop(_NEAREST)
        )


@dataclass(frozen=True)
class TableVersions:
    """One link's table in a step: its versions, counts per slice, late changes and horizon."""

    versions: DataFrame
    tally: dict[int, dict[str, int]]
    late: DataFrame
    horizon: int | None
    known_from: int | None = None  # `TableInput.known_from`, for a link that looks up at an event time


@dataclass
class EnrichmentStep:
    """What `Enrichment.run` decided: `StepResult`'s parts, the rows still in joined form."""

    emitted: list[DataFrame]
    late: DataFrame
    by_slice: Sequence[dict[str, SourceCounts]]
    state: dict[str, DataFrame] | None
    watermark: int | None
    cached: list[DataFrame]
    links: list[list[LinkCounts]]


@dataclass(frozen=True)
class Enrichment(JoinOperator):
    """A stream enriched by one table, or by several in the order written (ksqlDB's
    `A JOIN B JOIN C` with B and C tables). Each link looks up its own table at the stream row's
    point in time, and may use the columns of earlier links in its condition. A row is decided
    once every link's table is final for it; an INNER link without a match drops the row, a LEFT
    link pads it. Every emitted row keeps its stream row's event time and position, so the chain
    is a function of the Delta log as a single link is."""

    stream: str
    links: tuple[TemporalJoin, ...]
    number: int = 1  # the job's number of its first link (a chain's links after a stream-stream join)
    # A replay emits rows this far (before, after) around its slices: a chain's stream-stream
    # link after this one reads them there as partners of the rows it owns.
    reach: tuple[int, int] = (0, 0)
    upstream: tuple[str, ...] = ()  # after another link: the sources whose columns its rows hold

    @classmethod
    def build(cls, plan: Plan, join: BoundJoin) -> Enrichment:
        stream = join.left[0]
        return cls(stream, (TemporalJoin.from_plan(join, plan.source(join.right), stream),))

    @classmethod
    def following(cls, plan: Plan, join: BoundJoin, upstream: Upstream) -> Enrichment:
        """The rows an earlier link emitted (`upstream`) looked up by `join`."""
        link = TemporalJoin.from_plan(join, plan.source(join.right), upstream.name)
        return cls(upstream.name, (link,), upstream.number, upstream=upstream.sources)

    def then(self, plan: Plan, join: BoundJoin) -> JoinOperator | None:
        """One more enrichment link, or a `Chain` (ksqlDB's `FROM a JOIN b JOIN c WITHIN ...`, b a
        table); None for what its declaration does not take."""
        return Chain.of(self).then(plan, join)

    # ------------------------------------------------------------------ as a link of a chain

    def family(self) -> str:
        return self.links[-1].variant

    def joins(self) -> int:
        return len(self.links)

    def input(self) -> str:
        return self.stream

    def reads(self) -> tuple[str, ...]:
        return (*(() if self.upstream else (self.stream,)), *(link.table for link in self.links))

    def sources(self) -> tuple[str, ...]:
        """The sources whose columns its emitted rows hold: the stream's, then each link's table."""
        return (*(self.upstream or (self.stream,)), *(link.table for link in self.links))

    def carries(self) -> tuple[StructField, ...]:
        """Over a source, each row's clock at its position (`CLOCK`), for a stream-stream link after it."""
        return () if self.upstream else (StructField(CLOCK, LongType()),)

    def read_margins(self, side: str) -> tuple[int, int] | None:
        """Its stream is read as far as the link after it reads the enriched rows (`reach`)."""
        return self.reach if side == self.stream and not self.upstream else None

    def reaching(self, reach: tuple[int, int]) -> Enrichment:
        return replace(self, reach=reach)

    def absorb(self, plan: Plan, join: BoundJoin) -> Enrichment | None:
        """The chain of tables extended by one more enrichment link."""
        if join.family not in ENRICHMENTS:
            return None
        link = TemporalJoin.from_plan(join, plan.source(join.right), self.stream)
        return replace(self, links=(*self.links, link))

    def run_link(self, spark: SparkSession, plan: Plan, given: LinkInput) -> LinkRun:
        """`run` over the rows the link before emitted, or (first) over its stream's rows, each
        given the clock at its position (`CLOCK`), keeping the rows the tables hold back (`held`)
        for the link after it; counts its stream (first) and its tables, and each table link."""
        inputs, S = given.step, self.stream
        state = None if inputs.state is None else {S: inputs.state[S]}
        if given.rows is None:
            clocks = arrival.per_commit_table(spark, {CLOCK: inputs.timeline.before})
            rows, keep_state = arrival.with_per_commit(inputs.settled[S], clocks), True
            carried: dict[int, dict[str, int]] = {}
        else:
            rows, keep_state = given.rows, inputs.keep_state
            carried = (
                {}
                if state is None
                else tally_by_slice(state[S], inputs.slices.number(F.col(T)), n=F.count(F.lit(1)))
            )
        ran = self.run(spark, inputs.with_rows({S: rows}, state=state, keep_state=keep_state))
        sources, links = [], []
        for s, counted in enumerate(ran.by_slice):
            sources.append({name: c for name, c in counted.items() if given.rows is None or name != S})
            first, *rest = ran.links[s]
            links.append(
                [replace(first, carried_in=carried.get(s, {"n": 0})["n"], open=counted[S].open), *rest]
            )
        held = None if inputs.final or given.rows is not None or ran.state is None else ran.state[S]
        return LinkRun(ran.emitted, ran.late, sources, links, ran.state, ran.cached, held=held)

    def as_rows(
        self, spark: SparkSession, plan: Plan, emitted: list[DataFrame], inputs: StepInput
    ) -> DataFrame:
        """Emitted rows (`run`'s joined form) as the rows of one stream, for a chain's next link:
        each source's columns in a struct named after it, and the stream row's event time,
        position and clock (`CLOCK`): an enriched row is known at its stream row's position."""
        S = self.stream
        sources = [
            F.struct(*[self._col(S, c).alias(c) for c in plan.source(S).schema.fieldNames()]).alias(S),
            *[
                F.struct(
                    *[self._col(link.table, c).alias(c) for c in plan.source(link.table).schema.fieldNames()]
                ).alias(link.table)
                for link in self.links
            ],
        ]
        own = [self._col(S, c).alias(c) for c in (T, TS, SRC, V, CLOCK)]
        return reduce(DataFrame.unionByName, [part.select(*sources, *own) for part in emitted])

    def output(self, plan: Plan, emitted: list[DataFrame]) -> DataFrame:
        """Emitted rows (`run`'s joined form) as output rows: `where`, `select`, the output time."""
        return reduce(DataFrame.unionByName, [plan.project(part, F.col(OUT_T)) for part in emitted])

    def state_fields(self) -> tuple[StructField, ...]:
        """The interval family's shape: undecided stream rows, never matched."""
        return (StructField(MATCHED, BooleanType()),)

    def open_in_state(self) -> Column:
        return ~F.col(MATCHED)

    def step(self, spark: SparkSession, plan: Plan, inputs: StepInput) -> StepResult:
        """Stream rows against each link's table versions: table lateness, versions, the lookups,
        accounting. Stream rows are never late in these joins; a table's changes are, when their
        version time is below the table's watermark at their arrival (exact mode)."""
        ran = self.run(spark, inputs)
        return StepResult(
            output=self.output(plan, ran.emitted),
            late=ran.late,
            by_slice=ran.by_slice,
            state=ran.state,
            max_event=None,
            watermark=ran.watermark,
            cached=ran.cached,
            counters=[Counters(links=tuple(own)) for own in ran.links],
        )

    def run(self, spark: SparkSession, inputs: StepInput) -> EnrichmentStep:
        """`step` up to the rows it emits, in joined form (aliased by source name, with OUT_T)."""
        tables = [link.versions(spark, inputs.tables[link.table], inputs.mode) for link in self.links]
        rows = inputs.settled[self.stream]
        if inputs.state is not None:  # the live runner's undecided rows
            rows = (
                inputs.state[self.stream]
                .drop(MATCHED)
                .unionByName(rows.drop(REJECT) if REJECT in rows.columns else rows)
            )
        is_decided = (
            F.lit(True)
            if inputs.final
            else reduce(
                Column.__and__, [link.decided(t.horizon) for link, t in zip(self.links, tables, strict=True)]
            )
        )
        unsettled = [
            None if inputs.final else link.unsettled(t.horizon)
            for link, t in zip(self.links, tables, strict=True)
        ]
        evaluation = self.evaluate(
            rows,
            [t.versions for t in tables],
            is_decided,
            slices=inputs.slices,
            keep_state=inputs.keep_state,
            unsettled=unsettled,
            known_from=[t.known_from for t in tables],
        )
        by_slice = []
        for k, sides in enumerate(evaluation.counts):
            decided = sides[self.stream]
            counts = {
                self.stream: SourceCounts(
                    joined=decided.joined,
                    unmatched_emitted=decided.unmatched_emitted,
                    unmatched_dropped=decided.unmatched_dropped,
                    open=decided.open,
                )
            }
            for link, table in zip(self.links, tables, strict=True):
                counts[link.table] = SourceCounts(**table.tally.get(k, {"late": 0, "applied": 0}))
            by_slice.append(counts)
        next_state = None
        if evaluation.state is not None:  # the same shape as interval state: undecided rows are never matched
            next_state = {
                name: rows.withColumn(MATCHED, F.lit(False)) for name, rows in evaluation.state.items()
            }
        horizons = [t.horizon for t in tables]
        return EnrichmentStep(
            emitted=evaluation.emitted,
            late=reduce(DataFrame.unionByName, [t.late for t in tables]),
            by_slice=by_slice,
            state=next_state,
            watermark=None if None in horizons else min(h for h in horizons if h is not None),
            cached=evaluation.cached,
            links=evaluation.links,
        )

    def evaluate(
        self,
        rows: DataFrame,
        versions: list[DataFrame],
        decided: Column,
        slices: Slices = ALL_TIME,
        keep_state: bool = False,
        unsettled: list[Column | None] | None = None,
        known_from: list[int | None] | None = None,
    ) -> Evaluation:
        """Look the decided stream rows up in each link's `versions` in turn; keep the rest (live state).

        `unsettled[n]`, on link n's lookup result, holds back a row that link cannot answer yet (an
        ASOF link over the history): the row then stays undecided, as if `decided` had said so.
        `known_from[n]`: the earliest time link n's table can be told at; a row looked up before it
        is looked up at it and counted as assumed there, neither matched nor padded nor dropped.

        With replay `slices`, only rows whose event time lies in them (or within `reach` around
        them) are emitted, and each stream row in them is counted once, in the slice of its event
        time: joined when one of its output rows matched at every link, unmatched_emitted when all
        of them were padded somewhere, unmatched_dropped when an INNER link left it without output.
        """
        S = self.stream
        marked = rows.withColumn(DECIDED, decided)
        # With a row number that survives the lookups, to count stream rows rather than output rows.
        ready = marked.where(F.col(DECIDED) & slices.inside(F.col(T), self.reach)).select(
            *(F.col(f"`{c}`") for c in rows.columns), F.monotonically_increasing_id().alias(_ROW)
        )
        waits = unsettled or [None] * len(self.links)
        knowns = known_from or [None] * len(self.links)
        joined = self._looked_up(ready, versions, waits, knowns)
        # Persisted: the counts below and the runner's write read the lookups once, not twice.
        joined = joined.persist()
        emitted = joined.where(~F.col(_HELD) & F.col(_ALIVE))  # _HELD stays false unless a link waits
        assuming = any(known is not None for known in knowns)
        counts, links = self._counted(marked, joined, slices, assuming)
        state = None
        if keep_state:
            undecided = marked.where(~F.col(DECIDED)).drop(DECIDED)
            if any(w is not None for w in waits):
                waiting = joined.where(F.col(_HELD)).select(
                    *[self._col(S, c) for c in rows.columns], F.col(_ROW)
                )
                undecided = undecided.unionByName(waiting.dropDuplicates([_ROW]).drop(_ROW))
            state = {S: undecided}
        return Evaluation([emitted], counts, state, cached=[joined], links=links)

    def _looked_up(
        self,
        ready: DataFrame,
        versions: list[DataFrame],
        waits: list[Column | None],
        knowns: list[int | None],
    ) -> DataFrame:
        """The decided rows (`ready`) looked up at each link in turn, with the flags the counts
        read: reached, matched (and assumed) per link, alive, held (`evaluate`), OUT_T, complete."""
        S = self.stream
        identity = [self._col(S, _ROW)]
        # Rows an INNER link finds no match for stay, not alive (no later link matches them), so
        # that one pass over the result counts what every link did.
        joined = ready.withColumns({_ALIVE: F.lit(True), _HELD: F.lit(False)}).alias(S)
        complete = F.lit(True)
        # Only a backfill run with --assume-earliest-known counts assumed rows; other runs carry no
        # flag for them, and every such count is 0.
        assuming = any(known is not None for known in knowns)
        for n, (link, table, wait, known) in enumerate(zip(self.links, versions, waits, knowns, strict=True)):
            flags_in = {_reached(n): F.col(_ALIVE)}
            if assuming:
                before_known = (
                    F.lit(False) if known is None else F.coalesce(link.point() < F.lit(known), F.lit(False))
                )
                flags_in[_assumed(n)] = F.col(_ALIVE) & before_known
            joined = link.lookup(joined.withColumns(flags_in), table, identity, F.col(_ALIVE), known)
            identity += [F.col(f"{link.table}.`{c}`") for c in table.columns]
            matched = F.col(_ALIVE) & link.matched()
            updates = {_matched(n): matched & ~F.col(_assumed(n)) if assuming else matched}
            if wait is not None:
                updates[_HELD] = F.col(_HELD) | (F.col(_reached(n)) & wait)
            if link.type == "inner":
                updates[_ALIVE] = matched
            joined = joined.withColumns(updates)
            if assuming:
                joined = joined.withColumn(_assumed_alive(n), F.col(_assumed(n)) & F.col(_ALIVE))
            complete = complete & link.matched()
        if any(w is not None for w in waits):  # a row held at one of its output rows is held at all
            joined = joined.withColumn(
                _HELD, F.max(F.col(_HELD).cast("int")).over(Window.partitionBy(_ROW)) == 1
            )
        return joined.withColumns({OUT_T: self._col(S, T), _COMPLETE: F.col(_ALIVE) & complete})

    def _counted(
        self, marked: DataFrame, joined: DataFrame, slices: Slices, assuming: bool
    ) -> tuple[list[dict[str, SideCounts]], list[list[LinkCounts]]]:
        """Per slice, the stream's `SideCounts` and each link's `LinkCounts`: one Spark job counts
        the stream rows decided and open before the lookups, and of the decided ones (by their
        row number) those held back, and what the rest did at each link."""
        per_link = (_reached, _matched, _assumed, _assumed_alive) if assuming else (_reached, _matched)
        flags = [_ALIVE, _COMPLETE] + [f(n) for n in range(len(self.links)) for f in per_link]
        before, looked_up = self._tallied(marked, joined, slices, flags)
        counts, links = [], []
        for k in range(len(slices)):
            decided_rows, open_rows = (before[k]["decided"], before[k]["open"]) if k in before else (0, 0)
            summed = looked_up.get(k) or dict.fromkeys(["held", *flags], 0)
            waiting_rows = summed["held"]  # decided before the lookups, held back by one
            decided_rows, open_rows = decided_rows - waiting_rows, open_rows + waiting_rows
            out_rows, complete_rows = summed[_ALIVE], summed[_COMPLETE]
            counts.append(
                {
                    self.stream: SideCounts(
                        joined=complete_rows,
                        unmatched_emitted=out_rows - complete_rows,
                        unmatched_dropped=decided_rows - out_rows,
                        open=open_rows,
                    )
                }
            )
            links.append(
                [
                    self._link_counts(
                        n,
                        summed[_reached(n)],
                        summed[_matched(n)],
                        *((summed[_assumed(n)], summed[_assumed_alive(n)]) if assuming else ()),
                    )
                    for n in range(len(self.links))
                ]
            )
        return counts, links

    def _tallied(
        self, marked: DataFrame, joined: DataFrame, slices: Slices, flags: list[str]
    ) -> tuple[dict[int, Row], dict[int, Row]]:
        """By slice: the rows decided and open before the lookups; and the rows held back, and the
        sum of each of `flags` over the rows not held (a row counts once, by its number)."""
        per_row = joined.groupBy(slices.number(F.col(OUT_T)).alias("slice"), F.col(_ROW)).agg(
            *[F.max(F.col(flag).cast("int")).alias(flag) for flag in (_HELD, *flags)]
        )
        answered = F.col(_HELD) == 0  # a row held at one of its output rows is held at all
        looked_up = per_row.groupBy("slice").agg(
            F.sum(_HELD).alias("held"),
            *[F.sum(F.when(answered, F.col(flag)).otherwise(0)).alias(flag) for flag in flags],
        )
        before = marked.groupBy(slices.number(F.col(T)).alias("slice")).agg(
            F.count(F.when(F.col(DECIDED), 1)).alias("decided"),
            F.count(F.when(~F.col(DECIDED), 1)).alias("open"),
        )
        stats: dict[int, Row] = {}  # by slice: counts before the lookups
        by_slice: dict[int, Row] = {}  # by slice: counts of the lookups
        for r in (
            before.withColumn("_sj_part", F.lit(0))
            .unionByName(looked_up.withColumn("_sj_part", F.lit(1)), allowMissingColumns=True)
            .collect()
        ):
            (by_slice if r["_sj_part"] else stats)[r["slice"]] = r
        return stats, by_slice

    def _link_counts(
        self, n: int, reached: int, matched: int, assumed: int = 0, assumed_alive: int = 0
    ) -> LinkCounts:
        """Link n's counts; its assumed rows (`evaluate`'s `known_from`) count apart, and those it
        passed on are what it emits besides its matched and padded rows."""
        link = self.links[n]
        unmatched = reached - matched - assumed
        padded = unmatched if link.type == "left" else 0
        return LinkCounts(
            f"{self.number + n}. {link.type.upper()} JOIN {link.table}",
            reached=reached,
            matched=matched,
            padded=padded,
            dropped=unmatched if link.type == "inner" else 0,
            emitted=matched + padded + assumed_alive if assumed else None,
            assumed=assumed,
        )

    def _col(self, side: str, name: str) -> Column:
        return F.col(f"{side}.`{name}`")


def _user_columns(joined: DataFrame, alias: str) -> list[str]:
    """The table's user columns in a joined frame (by the table's alias)."""
    return [f.name for f in joined.select(f"{alias}.*").schema.fields if not f.name.startswith("_sj_")]


def _table_versions(join: BoundJoin) -> tuple[str, ...]:
    """A temporal link's grace judges its table's versions late; its stream's rows never are."""
    return (join.right,)


ENRICHMENTS = ("stream-table", "temporal", "asof")
_ENRICHING: dict[str, Any] = {"bind": _bind, "explain": _explain, "operator": Enrichment.build}
family.register(
    family.Family(
        name="asof",
        links=(AsofLink,),
        claims=(family.Claim(40, _claim_nearest),),
        keys=("asof",),
        refused_elsewhere={"asof": _AS_OF_STREAM_TABLE_ONLY},
        settings=_asof_settings,
        sql=family.SqlSyntax(join=_sql_asof, methods=("ASOF",), words=_ASOF_WORDS),
        inequalities=True,
        **_ENRICHING,
    )
)
family.register(
    family.Family(
        name="temporal",
        links=(TemporalLink,),
        claims=(family.Claim(50, _claim_point_in_time),),
        keys=("as_of",),
        refused_elsewhere={"as_of": _AS_OF_STREAM_TABLE_ONLY},
        settings=_as_of_settings,
        sql=family.SqlSyntax(join=_sql_point_in_time, words=_POINT_IN_TIME_WORDS),
        graced=_table_versions,
        **_ENRICHING,
    )
)
# A link no other family claims is a stream and a table: the last claim, after every family's.
family.register(
    family.Family(
        name="stream-table",
        links=(StreamTableLink,),
        claims=(family.Claim(10_000, _claim_rest),),
        **_ENRICHING,
    )
)
declare(
    *ENRICHMENTS,
    accepts=(
        Accepts(ENRICHMENTS),
        Accepts(
            ("interval",),
            when="keyed, with final emission",
            allows=lambda join: join.spec.type != "cross" and join.spec.settings().get("emit") != "eager",
            at_start=True,
            last=True,
        ),
    ),
    after=Enrichment.following,
)
