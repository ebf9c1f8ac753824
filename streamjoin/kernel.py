"""The relational kernel both runners call: settled rows in, lateness decided, joined rows out.

A runner decides which rows are settled in a step (a replay: all of them; the live runner: those
each micro-batch settles) and hands them here with the commits they came from. Everything that
decides which rows come out (rejection, lateness, the join family's semantics, projection) is in
this call and in the family module it dispatches to, never in a runner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import reduce

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from streamjoin import arrival, changelog
from streamjoin.arrival import ALL_TIME, REJECT, Slices, T, Timeline
from streamjoin.changelog import TableInput
from streamjoin.errors import UnsupportedJobError
from streamjoin.joins.interval import MATCHED, NEW, OUT_T, IntervalJoin
from streamjoin.joins.table_table import OP, POINT, RESULT_KEY, TableTableJoin, latest
from streamjoin.joins.temporal import TemporalJoin
from streamjoin.metrics import SourceCounts
from streamjoin.plan import Plan

MODES = ("exact", "complete")
# The watermark of an input that has ended (Flink's final watermark): every window is closed.
END_OF_INPUT = 2**62
ENRICHMENT = ("stream-table", "temporal", "asof")


def family(plan: Plan) -> IntervalJoin | TemporalJoin | TableTableJoin:
    """The join-family kernel for a plan; refuses, before any data moves, what no kernel runs yet."""
    if len(plan.joins) != 1:
        raise UnsupportedJobError(
            f"job {plan.spec.name!r} chains {len(plan.joins)} joins; the runners execute one join per job "
            "for now (N-way chains are planned): split it into jobs whose outputs feed the next"
        )
    join = plan.joins[0]
    if join.family == "interval":
        return IntervalJoin.from_plan(join)
    if join.family in ENRICHMENT:
        return TemporalJoin.from_plan(join, plan.source(join.right))
    return TableTableJoin.from_plan(join, plan.source(join.left[0]), plan.source(join.right))


@dataclass
class StepResult:
    """What one step emits and how its rows were accounted for."""

    output: DataFrame
    late: DataFrame
    by_slice: list[dict[str, SourceCounts]]  # per slice of the step (`Slices`), by source name
    state: dict[str, DataFrame] | None
    max_event: int | None
    watermark: int | None = None
    result: DataFrame | None = None  # table-table joins: the result table as of the settled bound
    cached: list[DataFrame] = field(default_factory=list)  # persisted by the step; unpersist after writing

    @property
    def counts(self) -> dict[str, SourceCounts]:
        """The counts of a step over one slice (a live micro-batch, or a one-slice replay)."""
        (only,) = self.by_slice
        return only


def split_rejected(rows: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(accepted, rejected) rows of a prepared source DataFrame."""
    return rows.where(F.col(REJECT).isNull()), rows.where(F.col(REJECT).isNotNull())


def rejected_side_rows(name: str, rejected: DataFrame) -> DataFrame:
    """Rejected rows in side-table form, with the reason they were refused."""
    return arrival.side_rows(rejected, name, F.col(REJECT))


def step(
    spark: SparkSession,
    plan: Plan,
    settled: dict[str, DataFrame],
    timeline: Timeline,
    mode: str,
    state: dict[str, DataFrame] | None = None,
    slices: Slices = ALL_TIME,
    keep_state: bool = False,
    tables: dict[str, TableInput] | None = None,
    after: int | None = None,
    final: bool = False,
) -> StepResult:
    """Run accepted, settled rows (by source name) through lateness and the join.

    `timeline` gives, for the commits of the settled rows, the largest accepted event time before
    each and after all settled commits (from the live runner's batches, or the arrival index in a
    replay); `state` holds the rows an earlier step left open (live runner only);
    `tables` holds what is known of each table source (enrichment and table-table joins);
    `after` is the bound up to which an earlier step already emitted table-table result changes.
    `slices`: a replay's slices; only rows inside them are emitted, and each is accounted for
    apart (`StepResult.by_slice`). The default, one slice of every time, is the live runner's.
    `final`: the input has ended (a replay of a closed history): every window closes, every stream
    row is decided and every table change settled, as if a last watermark at infinity had passed.
    """
    join = family(plan)
    if isinstance(join, TableTableJoin | TemporalJoin):
        assert tables is not None  # the runners always give `tables` for a join with a table source
        if isinstance(join, TableTableJoin):
            return _join_tables(plan, join, tables, slices, after, final)
        return _enrich(spark, plan, join, settled, mode, state, tables[join.table], slices, keep_state, final)
    marks, max_event = timeline.watermarks(join.grace), timeline.max_event
    if mode == "complete":
        marks = {}
    closing = None if max_event is None else max_event - join.grace

    on_time, late_parts, tally_parts = {}, [], []
    table = arrival.watermark_table(spark, marks)
    for name, rows in settled.items():
        marked = arrival.with_watermark(rows, table)
        late = arrival.is_late()
        late_parts.append(
            arrival.side_rows(
                marked.where(late & slices.inside(F.col(T))), name, F.lit("late"), F.col(arrival.WM)
            )
        )
        tally_parts.append(
            marked.select(
                F.lit(name).alias("name"), slices.number(F.col(T)).alias("slice"), late.alias("late")
            )
        )
        fresh = (
            marked.where(~late)
            .drop(arrival.WM, REJECT)
            .withColumn(NEW, F.lit(True))
            .withColumn(MATCHED, F.lit(False))
        )
        if state is not None:
            tally_parts.append(
                state[name]
                .where(~F.col(MATCHED))
                .select(
                    F.lit(name).alias("name"),
                    slices.number(F.col(T)).alias("slice"),
                    F.lit(False).alias("late"),
                )
            )
            fresh = state[name].withColumn(NEW, F.lit(False)).unionByName(fresh)
        on_time[name] = fresh
    tally: dict[tuple[str, int], Row] = {
        (r["name"], r["slice"]): r
        for r in reduce(DataFrame.unionByName, tally_parts)
        .where(F.col("slice").isNotNull())
        .groupBy("name", "slice")
        .agg(
            F.count(F.when(F.col("late"), 1)).alias("late"),
            F.count(F.when(~F.col("late"), 1)).alias("candidates"),
        )
        .collect()
    }

    def tallied(name: str, k: int, field: str) -> int:
        return tally[(name, k)][field] if (name, k) in tally else 0

    evaluation = join.evaluate(
        on_time,
        END_OF_INPUT if final else closing,
        {name: [tallied(name, k, "candidates") for k in range(len(slices))] for name in settled},
        slices=slices,
        keep_state=keep_state,
    )
    by_slice = [
        {
            name: SourceCounts(
                late=tallied(name, k, "late"),
                joined=side.joined,
                unmatched_emitted=side.unmatched_emitted,
                unmatched_dropped=side.unmatched_dropped,
                open=side.open,
            )
            for name, side in sides.items()
        }
        for k, sides in enumerate(evaluation.counts)
    ]
    output = reduce(DataFrame.unionByName, [plan.project(part, F.col(OUT_T)) for part in evaluation.emitted])
    next_state = None
    if evaluation.state is not None:
        next_state = {name: rows.drop(NEW) for name, rows in evaluation.state.items()}
    return StepResult(
        output=output,
        late=reduce(DataFrame.unionByName, late_parts),
        by_slice=by_slice,
        state=next_state,
        max_event=max_event,
        watermark=closing,
        cached=evaluation.cached,
    )


def _enrich(
    spark: SparkSession,
    plan: Plan,
    join: TemporalJoin,
    settled: dict[str, DataFrame],
    mode: str,
    state: dict[str, DataFrame] | None,
    table: TableInput,
    slices: Slices,
    keep_state: bool,
    final: bool,
) -> StepResult:
    """A stream row against a table's versions: table lateness, versions, the lookup, accounting.

    Stream rows are never late in these joins (joins/temporal.py); the table's changes are, when
    their version time is below the table's watermark at their arrival (exact mode).
    """
    marks, largest = join.table_watermarks(table.commits, mode)
    changes = arrival.with_watermark(table.changes, arrival.watermark_table(spark, marks))
    accepted, late = F.col(REJECT).isNull(), F.col(REJECT).isNull() & arrival.is_late()
    versions = changelog.versions(
        changes.where(accepted & ~late).drop(arrival.WM, REJECT), join.key, join.order
    )
    tally = _by_slice(
        changes,
        table.owner,
        late=F.count(F.when(late, 1)),
        applied=F.count(F.when(accepted & ~late, 1)),
    )
    late_rows = arrival.side_rows(
        changes.where(table.owner.isNotNull() & late), join.table, F.lit("late"), F.col(arrival.WM)
    )

    rows = settled[join.stream]
    if state is not None:  # the live runner's undecided rows
        rows = (
            state[join.stream]
            .drop(MATCHED)
            .unionByName(rows.drop(REJECT) if REJECT in rows.columns else rows)
        )
    known = join.known_until(table.newest_ts, table.stream_clock)
    is_decided = F.lit(True) if final else join.decided(known, largest)
    evaluation = join.evaluate(rows, versions, is_decided, slices=slices, keep_state=keep_state)
    by_slice = []
    for k, sides in enumerate(evaluation.counts):
        decided = sides[join.stream]
        by_slice.append(
            {
                join.stream: SourceCounts(
                    joined=decided.joined,
                    unmatched_emitted=decided.unmatched_emitted,
                    unmatched_dropped=decided.unmatched_dropped,
                    open=decided.open,
                ),
                join.table: SourceCounts(**tally.get(k, {"late": 0, "applied": 0})),
            }
        )
    output = reduce(DataFrame.unionByName, [plan.project(part, F.col(OUT_T)) for part in evaluation.emitted])
    next_state = None
    if evaluation.state is not None:  # the same shape as interval state: undecided rows are never matched
        next_state = {name: rows.withColumn(MATCHED, F.lit(False)) for name, rows in evaluation.state.items()}
    return StepResult(
        output=output,
        late=late_rows,
        by_slice=by_slice,
        state=next_state,
        max_event=None,
        watermark=join.horizon(known, largest),
        cached=evaluation.cached,
    )


def _join_tables(
    plan: Plan,
    join: TableTableJoin,
    tables: dict[str, TableInput],
    slices: Slices,
    after: int | None,
    final: bool,
) -> StepResult:
    """Table-table: the result's changes settled after `after` (and, in a replay, inside the slice)
    and the result table as of the settled bound. Nothing is late: tables have no lateness."""
    known = join.known_until({name: t.newest_ts for name, t in tables.items()})
    bound = END_OF_INPUT if final else known
    applied = {name: t.changes.where(F.col(REJECT).isNull()).drop(REJECT) for name, t in tables.items()}
    changes = join.changes(plan, applied[join.left], applied[join.right])
    when = F.col(f"{POINT}.ts")
    settled = changes.where(F.lit(False) if bound is None else when <= F.lit(bound))
    emitted = settled
    if after is not None:
        emitted = emitted.where(when > F.lit(after))
    emitted = emitted.where(slices.inside(when))
    out_time = plan.spec.output.time
    output = emitted.select(
        RESULT_KEY,
        OP,
        *[F.col(f"`{c}`") for c in plan.output_columns],
        F.timestamp_micros(when).alias(out_time),
        F.col(f"{POINT}.src").alias("change_source"),
        F.col(f"{POINT}.v").alias("change_version"),
    )
    result = (
        latest(settled)
        .where(F.col(OP) == "upsert")
        .select(
            RESULT_KEY,
            *[F.col(f"`{c}`") for c in plan.output_columns],
            F.timestamp_micros(when).alias(out_time),
        )
    )
    applied_by_slice = {
        name: _by_slice(table.changes, table.owner, applied=F.count(F.when(F.col(REJECT).isNull(), 1)))
        for name, table in tables.items()
    }
    by_slice = [
        {name: SourceCounts(**tally.get(k, {"applied": 0})) for name, tally in applied_by_slice.items()}
        for k in range(len(slices))
    ]
    no_late_rows = arrival.side_rows(tables[join.left].changes.limit(0), join.left, F.lit("late"))
    return StepResult(
        output=output,
        late=no_late_rows,
        by_slice=by_slice,
        state=None,
        max_event=None,
        watermark=known,
        result=result,
    )


def _by_slice(rows: DataFrame, owner: Column, **aggregates: Column) -> dict[int, dict[str, int]]:
    """`aggregates` over the rows each slice owns, by slice number (rows without an owner are not
    counted); a slice that owns no row is absent."""
    grouped = (
        rows.where(owner.isNotNull())
        .groupBy(owner.alias("_sj_slice"))
        .agg(*[column.alias(name) for name, column in aggregates.items()])
    )
    return {r["_sj_slice"]: {name: r[name] for name in aggregates} for r in grouped.collect()}
