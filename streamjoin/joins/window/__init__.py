"""Window joins (RisingWave's and Flink's TUMBLE and HOP): rows of two streams join when their keys
are equal and they lie in the same time window.

Windows of `size` start every `hop` (a tumble: hop = size), aligned to the Unix epoch in UTC, each
the half-open [start, start + size); a row lies in size / hop of them. Each side is a relation of
(row, window) pairs, as the SQL table functions make it, and the two are joined on the keys and
the window: a pair sharing m windows writes m output rows, each with its own `window_start` and
`window_end` (both sources' columns, as the TVFs add them to each side). A joined row's event time
is the later of the two rows' times; a padded row's is its own.

Lateness is the interval family's (a row below the watermark at its position is late). A window
closes when the watermark passes its last instant; a (row, window) of a preserved side with no
partner in that window is then written padded, once per window, and the rows of closed windows
leave the state. Accounting is per input row, as for every family: `joined` once it pairs in any
window, unmatched once its last window closes without a pair, `open` until then.

docs/design-window-joins.md gives the reasons and the worked examples; `evaluate` is the whole
semantics, run by the replay over all settled rows and by the live runner per micro-batch over its
state (a row per (row, window) still open) plus the newly settled rows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlglot import exp

from streamjoin import family
from streamjoin.enums import JoinType, LinkKind, SourceKind
from streamjoin.errors import JobError
from streamjoin.links import STREAMS, Conditioned, Graced, Link
from streamjoin.spec import JoinSpec
from streamjoin.timeutil import format_duration, parse_duration

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from streamjoin.plan import BoundJoin, Plan

WINDOW_COLUMNS = ("window_start", "window_end")  # what each side's rows gain, as the TVFs add them


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

    def plain(self) -> dict[str, str]:
        """As JSON data (`links.plain`)."""
        return {"hop": format_duration(self.hop), "size": format_duration(self.size)}


@dataclass(frozen=True, kw_only=True)
class WindowLink(Graced, Conditioned):
    """Two streams whose rows pair within a time window they share (RisingWave's and Flink's
    TUMBLE and HOP window joins), on an equality of keys."""

    window: Windows

    kind = LinkKind.WINDOW
    refused = {
        "bounds": "give either 'window' (rows in the same time window) or 'within'/'between' (rows close in "
        "time), not both",
        "emit": "a window join writes its padded rows when their window closes, never earlier; remove 'emit: eager'",
    }

    def _check(self, where: str) -> None:
        super()._check(where)
        window = self.window
        if self.type == JoinType.CROSS:
            raise JobError(
                f"{where}: a window join needs an equality between a left and a right column (RisingWave, "
                "Flink); use type inner with e.g. on: a.id = b.id"
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

    def check_pair(self, left: SourceKind, right: SourceKind, where: str) -> None:
        if (left, right) != STREAMS:
            raise JobError(
                f"{where}: window joins pair rows of two streams in the same time window (RisingWave, Flink); "
                f"{self.source!r} is a {right}. Use as_of/asof to look rows up in a table"
            )


def _settings(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`window: {tumble: 10m}` or `window: {hop: 10m, size: 1h}`."""
    value = item["window"]
    example = "write window: {tumble: 10m} or window: {hop: 10m, size: 1h}"
    if not isinstance(value, dict):
        raise JobError(f"{where}: window {value!r} is not a mapping; {example}")
    family.only(value, {"tumble", "hop", "size"}, f"{where}: window")
    if "tumble" in value:
        if set(value) != {"tumble"}:
            raise JobError(f"{where}: a tumbling window takes only its size; {example}")
        size = parse_duration(value["tumble"], f"{where}: window tumble")
        return {"window": Windows(size, size)}
    if set(value) != {"hop", "size"}:
        raise JobError(f"{where}: a hopping window takes both 'hop' and 'size'; {example}")
    hop = parse_duration(value["hop"], f"{where}: window hop")
    return {"window": Windows(hop, parse_duration(value["size"], f"{where}: window size"))}


def _sql_windows(statement: family.SqlStatement) -> family.Finish | None:
    """RisingWave's window functions as FROM and JOIN items, `TUMBLE(s1, ts, INTERVAL '1' MINUTE)`
    and `HOP(s, ts, <hop>, <size>)`: each becomes its source (the alias kept), its time column the
    source's `time`; the compiled job's one join, of two such items, gets their `window`."""
    query = statement.query
    start = query.args.get("from_") if isinstance(query, exp.Select) else None
    items = [start.this] if start is not None else []
    items += [join.this for join in query.args.get("joins") or []]
    used = Counter(
        a.expressions[0].name
        for a in (i.this for i in items)
        if isinstance(a, exp.Anonymous) and a.expressions
    )
    found = {}
    for item in items:
        function = item.this if isinstance(item, exp.Table) else None
        if isinstance(function, exp.Anonymous) and function.name.upper() in ("TUMBLE", "HOP"):
            source, window = _window_item(statement, item, function)
            # In a self-join each use is a source of its own, named by its alias (sql.py splits them).
            found[item.alias if used[source] > 1 else source] = (window, item)
    return (lambda document: _window_of_join(statement, document, found)) if found else None


def _window_item(
    statement: family.SqlStatement, item: exp.Expr, function: exp.Anonymous
) -> tuple[str, dict[str, str]]:
    """One TUMBLE or HOP item, read as its source (the item rewritten to it) and its window."""
    name, origin, at = function.name.upper(), statement.where, statement.at
    arguments = function.expressions
    wanted = 3 if name == "TUMBLE" else 4
    if len(arguments) != wanted or not all(isinstance(a, exp.Column) for a in arguments[:2]):
        form = (
            "TUMBLE(source, time, INTERVAL '1' MINUTE)"
            if name == "TUMBLE"
            else "HOP(source, time, <hop>, <size>)"
        )
        raise JobError(f"{origin}: {at(item)}write {form}; an offset is not supported")
    source, time = arguments[0].name, arguments[1].name
    if source not in statement.sources:
        raise JobError(f"{origin}: {at(item)}{name} reads {source!r}, which is not declared")
    declared = statement.sources[source].get("time")
    if declared and declared != time:
        raise JobError(
            f"{origin}: {at(item)}{name} windows {source} by {time}, but its declared time column is {declared}; "
            "window by the event time"
        )
    statement.sources[source]["time"] = time
    spans = [statement.duration(a) for a in arguments[2:] if isinstance(a, exp.Interval)]
    if len(spans) != wanted - 2:
        raise JobError(f"{origin}: {at(item)}{name}'s durations are intervals, e.g. INTERVAL '10' MINUTE")
    item.set("this", exp.to_identifier(source))
    return source, {"tumble": spans[0]} if name == "TUMBLE" else {"hop": spans[0], "size": spans[1]}


def _window_of_join(
    statement: family.SqlStatement, document: dict[str, Any], windowed: dict[str, tuple[dict, exp.Expr]]
) -> None:
    """A join of two windowed items is a window join: both with the same window function and
    sizes (RisingWave's rule); a windowed item joined otherwise is refused."""
    origin, at = statement.where, statement.at
    names = [document["from"], *(join["join"] for join in document["joins"])]
    if len(names) != 2 or set(windowed) != set(names):
        node = next(iter(windowed.values()))[1]
        raise JobError(
            f"{origin}: {at(node)}a window join joins two windowed streams, each in a TUMBLE or HOP of the same "
            "size: FROM TUMBLE(a, ts, INTERVAL '1' MINUTE) JOIN TUMBLE(b, ts, INTERVAL '1' MINUTE) ON ...; "
            "for rows close in time without windows, write an interval join"
        )
    (left, _), (right, node) = (windowed[n] for n in names)
    if left != right:
        raise JobError(
            f"{origin}: {at(node)}both sides of a window join need the same window function and size (RisingWave: "
            "'the same time window functions must be used, and the window size must be the same'); to pair rows "
            "offset in time, write an interval join"
        )
    document["joins"][0]["window"] = right


def _schemas(spec: JoinSpec, link: Link, left: str, schemas: dict[str, StructType]) -> dict[str, StructType]:
    """The schemas that conditions, `where` and `select` see: a window join's two sources each
    gain `window_start` and `window_end` (as the TVFs add them), for the window a row is in."""
    from pyspark.sql.types import StructField, StructType, TimestampType

    seen = dict(schemas)
    for name in sorted({left, link.source}):
        clash = [c for c in schemas[name].fieldNames() if c.lower() in WINDOW_COLUMNS]
        if clash:
            raise JobError(
                f"job {spec.name!r}, source {name!r}: its column {clash[0]!r} would be hidden by the window "
                "join's own window_start/window_end; rename it in the source (or a view over it)"
            )
        seen[name] = StructType(
            [*schemas[name].fields, *(StructField(c, TimestampType()) for c in WINDOW_COLUMNS)]
        )
    return seen


def _window_equality(pair: tuple[str, str], where: str) -> bool:
    """An equality of the two sides' window columns: `a.window_start = b.window_start` (or
    window_end) says what a window join means anyway (RisingWave's required equality); equating a
    start with an end is refused."""
    left, right = (column.split(".", 1)[1].strip("`").lower() for column in pair)
    if left not in WINDOW_COLUMNS and right not in WINDOW_COLUMNS:
        return False
    if left != right:
        raise JobError(
            f"{where}: the condition equates {pair[0]} with {pair[1]}; rows of a window join meet in the same "
            "window, so equate like with like (a.window_start = b.window_start) or leave it out"
        )
    return True


def _explain(plan: Plan, join: BoundJoin, step: int) -> list[str]:
    j = join.link(WindowLink)
    return [
        f"     time windows: {j.window.describe()} (each row in {j.window.per_row} window(s) [start, start + "
        f"{format_duration(j.window.size)}), aligned to the epoch in UTC), grace {format_duration(j.grace)}; "
        "rows join within a window they share, one output row per pair and window; a row without a "
        "partner in a window is padded once the watermark passes that window's end"
    ]


def _explain_json(join: BoundJoin) -> dict[str, Any]:
    window = join.link(WindowLink).window
    return {"window_s": {"hop": window.hop.total_seconds(), "size": window.size.total_seconds()}}


family.register(
    family.Family(
        name="window",
        links=(WindowLink,),
        claims=(family.Claim.key(20, "window", WindowLink),),
        keys=("window",),
        settings=_settings,
        sql=family.SqlSyntax(statement=_sql_windows),
        schemas=_schemas,
        columns=WINDOW_COLUMNS,
        own_equality=_window_equality,
        graced=family.sides,
        explain=_explain,
        explain_json=_explain_json,
        json_keys=("window_s",),
        operator="streamjoin.joins.window.step:WindowJoin.build",
    )
)
