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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlglot import exp

from streamjoin import family
from streamjoin.enums import LinkKind, SourceKind
from streamjoin.errors import JobError
from streamjoin.links import STREAMS, Conditioned, Graced, Link
from streamjoin.spec import COMMIT_TIME, JoinSpec
from streamjoin.timeutil import format_duration

if TYPE_CHECKING:
    from streamjoin.plan import BoundJoin, NamedTime, Plan


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
    from pyspark.sql.types import TimestampNTZType, TimestampType

    from streamjoin.plan import NamedTime, spelt_as

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


def _table_versions(join: BoundJoin) -> tuple[str, ...]:
    """A temporal link's grace judges its table's versions late; its stream's rows never are."""
    return (join.right,)


ENRICHMENTS = ("stream-table", "temporal", "asof")
_ENRICHING: dict[str, Any] = {
    "bind": _bind,
    "explain": _explain,
    "operator": "streamjoin.joins.temporal.step:Enrichment.build",
}
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
