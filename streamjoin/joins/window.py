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
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType, TimestampType
from sqlglot import exp

from streamjoin import family
from streamjoin.arrival import TS, T
from streamjoin.enums import JoinType, LinkKind, SourceKind
from streamjoin.errors import JobError
from streamjoin.joins.base import (
    MATCHED,
    OUT_T,
    Deferred,
    Evaluation,
    JoinOperator,
    SideCounts,
    StepInput,
    StepResult,
    kept_row,
    preserves,
)
from streamjoin.joins.interval import DUE, ROW
from streamjoin.joins.pairs import NEW, Evaluate, col, decide, result, side_counts, unmatched_counts
from streamjoin.links import STREAMS, Conditioned, Graced, Link
from streamjoin.plan import BoundJoin, Plan
from streamjoin.spec import JoinSpec
from streamjoin.timeutil import format_duration, parse_duration, to_micros

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


WIN = "_sj_window"  # the start of the window a (row, window) stands for, UTC micros


@dataclass(frozen=True)
class WindowJoin(JoinOperator):
    """Windows in place of time bounds, with the interval join's lateness and bookkeeping
    (`joins/pairs.py`). Its state rows are (row, window) pairs; `MATCHED` says the row paired in
    some window."""

    left: str
    right: str
    type: str
    grace: int  # microseconds
    equi: tuple[tuple[str, str], ...]
    residual: str | None
    hop: int  # microseconds
    size: int
    emit: str = "final"  # a window's pads are written when it closes
    reach: tuple[int, int] = (0, 0)

    @classmethod
    def build(cls, plan: Plan, join: BoundJoin) -> WindowJoin:
        spec = join.link(WindowLink)
        return cls(
            left=join.left[0],
            right=join.right,
            type=spec.type,
            grace=to_micros(spec.grace),
            equi=join.equi,
            residual=join.residual,
            hop=to_micros(spec.window.hop),
            size=to_micros(spec.window.size),
        )

    def step(self, spark: SparkSession, plan: Plan, inputs: StepInput) -> StepResult:
        """Lateness by the streams' watermark, the windows' pairs, pads of closed windows, the accounting."""
        return result(plan, decide(spark, self, inputs))

    def reads_rows_once(self) -> bool:
        """An equi join: the pass that writes the output reads each settled row once."""
        return bool(self.equi)

    def preserves(self, side: str) -> bool:
        return preserves(self.type, side, self.left, self.right)

    def margins(self, side: str) -> tuple[int, int]:
        """A row's windows hold rows up to `size` before and after it."""
        return self.size, self.size

    def state_fields(self) -> tuple[StructField, ...]:
        """A state row is one (row, window): the row's number (its windows' rows share it), the
        window's start, and whether the row has paired in any window."""
        return (
            StructField(MATCHED, BooleanType()),
            StructField(ROW, StringType()),
            StructField(WIN, LongType()),
        )

    def open_in_state(self) -> Column:
        """One state row per input row counts: its last window's (the last to close)."""
        return ~F.col(MATCHED) & (F.col(WIN) == self._last_window(F.col(T)))

    def numbered(self, rows: DataFrame) -> DataFrame:
        """Unchanged: `_windowed` numbers the new rows; a state row keeps its number."""
        return rows

    def condition(self) -> Column:
        """Equal windows, equal keys, and the residual (which may name the window columns)."""
        cond = col(self.left, WIN) == col(self.right, WIN)
        for left_col, right_col in self.equi:
            cond = cond & (F.expr(left_col) == F.expr(right_col))
        if self.residual:
            cond = cond & F.expr(self.residual)
        return cond

    # ------------------------------------------------------------------ windows

    def _last_window(self, time: Column) -> Column:
        """The start of the last window holding `time`."""
        return time - F.pmod(time, F.lit(self.hop))

    def _closed(self, start: Column, watermark: int | None) -> Column:
        """The window starting at `start` has closed: the watermark is past its last instant."""
        if watermark is None:
            return F.lit(False)
        return start + F.lit(self.size - 1) < F.lit(watermark)

    def _windowed(self, rows: DataFrame) -> DataFrame:
        """Rows as (row, window) pairs: a new row once per window it lies in, numbered (`ROW`);
        a state row is one already. Adds the `window_start` and `window_end` columns."""
        row, win = (
            F.col(column) if column in rows.columns else F.lit(None).cast(kind)
            for column, kind in ((ROW, StringType()), (WIN, LongType()))
        )
        last = self._last_window(F.col(T))
        starts = F.sequence(last - F.lit(self.size - self.hop), last, F.lit(self.hop))
        # Numbered before the explode, so that a row's windows share its number.
        rows = rows.withColumns({ROW: F.coalesce(row, F.expr("uuid()")), WIN: win})
        rows = rows.withColumn(
            WIN, F.explode(F.when(F.col(WIN).isNull(), starts).otherwise(F.array(F.col(WIN))))
        )
        start, end = WINDOW_COLUMNS
        return rows.withColumns(
            {start: F.timestamp_micros(F.col(WIN)), end: F.timestamp_micros(F.col(WIN) + F.lit(self.size))}
        )

    # ------------------------------------------------------------------ the semantics

    def evaluate(self, rows: dict[str, DataFrame], asked: Evaluate) -> Evaluation:
        """Join on-time (row, window) pairs; emit pairs involving a new row, and the padded
        (row, window) pairs of a preserved side whose window closed without a partner.

        `rows` and `asked` as for `IntervalJoin.evaluate`. A window's rows all stay in the state
        until it closes, so a (row, window) without a partner in the join has never had one."""
        L, R = self.left, self.right
        watermark, slices = asked.watermark, asked.slices
        left, right = self._windowed(rows[L]).alias(L), self._windowed(rows[R]).alias(R)
        lt, rt = col(L, T), col(R, T)
        has_l, has_r = col(L, TS).isNotNull(), col(R, TS).isNotNull()
        only_l, only_r = has_l & ~has_r, has_r & ~has_l
        window = F.coalesce(col(L, WIN), col(R, WIN))
        joined = left.join(right, self.condition(), "full_outer").withColumns(
            {
                OUT_T: F.when(has_l & has_r, F.greatest(lt, rt)).when(has_l, lt).otherwise(rt),
                DUE: F.when(only_l | only_r, window + F.lit(self.size - 1 + self.grace)),
            }
        )
        keep = has_l & has_r & (col(L, NEW) | col(R, NEW))
        for side, only in ((L, only_l), (R, only_r)):
            if self.preserves(side):
                keep = keep | (only & self._closed(col(side, WIN), watermark))
        if self.hop == self.size and not asked.keep_state and not asked.persist:
            return self._tumbling(joined, keep, asked)
        joined = joined.persist()
        emitted = [joined.where(keep & slices.inside(F.col(OUT_T), self.reach))]
        state = self._window_state(rows, joined, watermark) if asked.keep_state else None
        return Evaluation(emitted, self._per_row_counts(joined, asked), state, cached=[joined])

    def _per_row_counts(self, joined: DataFrame, asked: Evaluate) -> Deferred[dict[str, SideCounts]]:
        """Counts per input row, from the (row, window) pairs of `joined`: among the rows not
        paired before this step, those without a pair in any window now, and of them those whose
        last window closed."""
        L, R, slices = self.left, self.right, asked.slices
        per_row = [
            joined.where(col(side, TS).isNotNull())
            .groupBy(col(side, ROW))
            .agg(
                F.any_value(col(side, T)).alias(T),
                F.bool_or(col(side, MATCHED)).alias("_sj_before"),
                F.bool_or(col(other, TS).isNotNull()).alias("_sj_now"),
            )
            .select(F.lit(side).alias("_sj_side"), T, "_sj_before", "_sj_now")
            for side, other in ((L, R), (R, L))
        ]
        unmatched = ~F.col("_sj_before") & ~F.col("_sj_now")
        decided = unmatched & self._closed(self._last_window(F.col(T)), asked.watermark)
        tallied = (
            per_row[0]
            .unionByName(per_row[1])
            .withColumn("_sj_slice", slices.number(F.col(T)))
            .where(F.col("_sj_slice").isNotNull())
            .groupBy("_sj_side", "_sj_slice")
            .agg(F.count_if(unmatched).alias("unmatched"), F.count_if(decided).alias("decided"))
        )

        def counts() -> list[dict[str, SideCounts]]:
            found = {(r["_sj_side"], r["_sj_slice"]): r for r in tallied.collect()}
            result = []
            for k in range(len(slices)):
                sides = {}
                for side in (L, R):
                    row = found.get((side, k))
                    unmatched_rows, decided_rows = (row["unmatched"], row["decided"]) if row else (0, 0)
                    sides[side] = SideCounts(
                        joined=asked.candidates(side, k) - unmatched_rows,
                        unmatched_emitted=decided_rows if self.preserves(side) else 0,
                        unmatched_dropped=0 if self.preserves(side) else decided_rows,
                        open=unmatched_rows - decided_rows,
                    )
                result.append(sides)
            return result

        return Deferred(counts)

    def _tumbling(self, joined: DataFrame, keep: Column, asked: Evaluate) -> Evaluation:
        """`evaluate` where each row lies in one window (TUMBLE) and nothing else reads the join (a
        replay): a row's (row, window) is the row, so the rows without a partner are counted as the
        output's pass writes the emitted rows (`SliceCounts`), as the interval family counts them,
        with no cached join and no grouping by row."""
        closed_l, closed_r = (
            self._closed(self._last_window(col(side, T)), asked.watermark) for side in (self.left, self.right)
        )
        stats = unmatched_counts(self, joined, asked.slices, closed_l, closed_r)
        emitted = [stats.rows.where(keep & asked.slices.inside(F.col(OUT_T), self.reach))]
        return Evaluation(emitted, side_counts(self, stats, asked.candidates), None)

    def _window_state(
        self, rows: dict[str, DataFrame], joined: DataFrame, watermark: int | None
    ) -> dict[str, DataFrame]:
        """The (row, window) pairs whose window is still open, each once, `MATCHED` set on every
        window of a row that paired in any window now."""
        state = {}
        for side, other in ((self.left, self.right), (self.right, self.left)):
            columns = [c for c in rows[side].columns if c not in (ROW, WIN)] + [ROW, WIN]
            per_window = (
                joined.where(col(side, TS).isNotNull())
                .groupBy(col(side, ROW).alias("_sj_of"), col(side, WIN).alias("_sj_in"))
                .agg(
                    F.any_value(F.struct(*[col(side, c).alias(c) for c in columns])).alias("_sj_kept"),
                    F.bool_or(col(other, TS).isNotNull()).alias("_sj_here"),
                )
            )
            paired = F.bool_or(F.col("_sj_here")).over(Window.partitionBy("_sj_of"))
            state[side] = (
                per_window.withColumn("_sj_now", paired)
                .where(~self._closed(F.col("_sj_in"), watermark))
                .select(*kept_row("_sj_kept", columns, F.col("_sj_now")))
            )
        return state


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
        operator=WindowJoin.build,
    )
)
