"""Enrichment joins of a stream with a table: stream-table, event-time temporal, and ASOF.

Each stream row looks up one state of the table, chosen by a point in time, and joins the rows of
that state that satisfy the condition. Only stream rows trigger output; table changes never do
(ksqlDB, Lenses, Flink). The three variants differ only in which state a row sees:

- **stream-table** (`as_of: arrival`, the default; ksqlDB/Lenses/SQLstream, Flink and RisingWave
  processing-time joins): the table as it was when the row arrived, i.e. every change committed
  at or before the row's commit timestamp. Decided from the Delta log, so it is replayable.
- **event-time temporal** (`as_of: event_time`, Flink FOR SYSTEM_TIME AS OF): per primary key, the
  version whose validity holds the row's event time, versions ordered by version time.
- **ASOF** (`asof: true`, RisingWave): among the rows the table held when the row arrived, those
  with equal keys that satisfy the one inequality, and of them the nearest (`right <= left` and
  `right < left` pick the largest right value, `>=` and `>` the smallest; of equal values, the
  latest arrival).

A row is *decided* once the table can no longer change the answer:
- arrival and ASOF: once the table's log is known up to the row's commit timestamp: the table has
  committed at or after it, or some stream has committed `clock_skew` after it (a table commit
  made later carries a later timestamp; docs/semantics.md).
- event time: once the row's event time is below the table's horizon: for version times from a
  column, the table's watermark (largest version time minus grace), below which a change would be
  late; for commit-time versions, the time up to which the log is known (as above).
Undecided rows wait (live state, `open` in the metrics). Stream rows are never late here: their
answer depends only on the table's versions, which Delta keeps. Table changes with a version time
column are late when below the table's watermark at their arrival (exact mode) and then never
become versions; `complete` mode applies every change.

Output event time is the stream row's event time. INNER drops a decided row without a match;
LEFT pads it with NULLs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, StructField

from streamjoin import arrival, changelog
from streamjoin.arrival import ALL_TIME, REJECT, TS, CommitStats, Slices, T, V, watermarks
from streamjoin.joins.base import JoinOperator, StepInput, StepResult, register, tally_by_slice
from streamjoin.joins.interval import MATCHED, OUT_T, Evaluation, SideCounts
from streamjoin.metrics import SourceCounts
from streamjoin.plan import BoundJoin, BoundSource, Plan
from streamjoin.timeutil import to_micros

DECIDED = "_sj_decided"
_NEAREST = "_sj_nearest"


@dataclass(frozen=True)
class TemporalJoin(JoinOperator):
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

    @classmethod
    def from_plan(cls, join: BoundJoin, table: BoundSource) -> TemporalJoin:
        spec = join.spec
        return cls(
            stream=join.left[0],
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
        )

    @property
    def order(self) -> str:
        """How versions are ordered: by arrival, or by version time (event-time temporal)."""
        return "event_time" if self.variant == "temporal" else "arrival"

    def margins(self, side: str) -> tuple[int, int]:
        """A slice owns its stream rows by event time and needs no stream rows beyond it."""
        return 0, 0

    # ------------------------------------------------------------------ the operator

    @classmethod
    def build(cls, plan: Plan, join: BoundJoin) -> TemporalJoin:
        return cls.from_plan(join, plan.source(join.right))

    def state_fields(self) -> tuple[StructField, ...]:
        """The interval family's shape: undecided stream rows, never matched."""
        return (StructField(MATCHED, BooleanType()),)

    def open_in_state(self) -> Column:
        return ~F.col(MATCHED)

    def step(self, spark: SparkSession, plan: Plan, inputs: StepInput) -> StepResult:
        """A stream row against a table's versions: table lateness, versions, the lookup, accounting.

        Stream rows are never late in these joins; the table's changes are, when
        their version time is below the table's watermark at their arrival (exact mode).
        """
        settled, mode, state = inputs.settled, inputs.mode, inputs.state
        table, slices, keep_state, final = (
            inputs.tables[self.table],
            inputs.slices,
            inputs.keep_state,
            inputs.final,
        )
        marks, largest = self.table_watermarks(table.commits, mode)
        changes = arrival.with_watermark(table.changes, arrival.watermark_table(spark, marks))
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

        rows = settled[self.stream]
        if state is not None:  # the live runner's undecided rows
            rows = (
                state[self.stream]
                .drop(MATCHED)
                .unionByName(rows.drop(REJECT) if REJECT in rows.columns else rows)
            )
        known = self.known_until(table.newest_ts, table.stream_clock)
        is_decided = F.lit(True) if final else self.decided(known, largest)
        evaluation = self.evaluate(rows, versions, is_decided, slices=slices, keep_state=keep_state)
        by_slice = []
        for k, sides in enumerate(evaluation.counts):
            decided = sides[self.stream]
            by_slice.append(
                {
                    self.stream: SourceCounts(
                        joined=decided.joined,
                        unmatched_emitted=decided.unmatched_emitted,
                        unmatched_dropped=decided.unmatched_dropped,
                        open=decided.open,
                    ),
                    self.table: SourceCounts(**tally.get(k, {"late": 0, "applied": 0})),
                }
            )
        output = reduce(
            DataFrame.unionByName, [plan.project(part, F.col(OUT_T)) for part in evaluation.emitted]
        )
        next_state = None
        if evaluation.state is not None:  # the same shape as interval state: undecided rows are never matched
            next_state = {
                name: rows.withColumn(MATCHED, F.lit(False)) for name, rows in evaluation.state.items()
            }
        return StepResult(
            output=output,
            late=late_rows,
            by_slice=by_slice,
            state=next_state,
            max_event=None,
            watermark=self.horizon(known, largest),
            cached=evaluation.cached,
        )

    # ------------------------------------------------------------------ time

    def table_watermarks(self, commits: list[CommitStats], mode: str) -> tuple[dict, int | None]:
        """The table's watermark at each of its commits (lateness of changes), and its largest
        version time. Commit-time versions are never late; neither is anything in complete mode."""
        marks, largest = watermarks(commits, None, self.grace)
        if not self.versioned_by_column or mode == "complete" or self.variant != "temporal":
            marks = {}
        return marks, largest

    def known_until(self, table_newest: int | None, stream_clock: int | None) -> int | None:
        """The commit timestamp up to which the table's log is complete."""
        return changelog.known_until(table_newest, stream_clock, self.clock_skew)

    def horizon(self, known: int | None, largest_version_time: int | None) -> int | None:
        """How far the table's answer is final: the table's watermark (largest version time minus
        grace) for versions from a column, else the commit time its log is known up to."""
        if self.variant == "temporal" and self.versioned_by_column:
            return None if largest_version_time is None else largest_version_time - self.grace
        return known

    def decided(self, known: int | None, largest_version_time: int | None) -> Column:
        """The stream row's answer can no longer change (module docstring)."""
        horizon = self.horizon(known, largest_version_time)
        if horizon is None:
            return F.lit(False)
        if self.variant == "temporal" and self.versioned_by_column:
            return F.col(T) < F.lit(horizon)  # strictly: a change at the watermark is still on time
        return (F.col(T) if self.variant == "temporal" else F.col(TS)) <= F.lit(horizon)

    # ------------------------------------------------------------------ matching

    def _col(self, side: str, name: str) -> Column:
        return F.col(f"{side}.`{name}`")

    def condition(self) -> Column:
        """Equal keys, the version valid at the row's point in time, the residual, and for ASOF the inequality."""
        S, R = self.stream, self.table
        point = self._col(S, T) if self.order == "event_time" else self._col(S, TS)
        cond = changelog.valid_at(point, prefix=f"{R}.")
        for left_col, right_col in self.equi:
            cond = cond & (F.expr(left_col) == F.expr(right_col))
        if self.inequality:
            left_col, op, right_col = self.inequality
            cond = cond & F.expr(f"{left_col} {op} {right_col}")
        if self.residual:
            cond = cond & F.expr(self.residual)
        return cond

    def evaluate(
        self,
        rows: DataFrame,
        versions: DataFrame,
        decided: Column,
        slices: Slices = ALL_TIME,
        keep_state: bool = False,
    ) -> Evaluation:
        """Join the decided stream rows with the table's versions; keep the rest (live state).

        With replay `slices`, only rows whose event time lies in them are emitted, and each is
        counted in the slice of its event time.
        """
        S, R = self.stream, self.table
        marked = rows.withColumn(DECIDED, decided)
        ready = marked.where(F.col(DECIDED) & slices.inside(F.col(T))).drop(DECIDED)
        joined = ready.alias(S).join(versions.alias(R), self.condition(), "left_outer")
        if self.inequality:
            joined = self._nearest(joined, ready.columns)
        matched = self._col(R, TS).isNotNull()
        # Persisted: the counts below and the runner's write read the join once, not twice.
        joined = joined.withColumn(OUT_T, self._col(S, T)).persist()
        emitted = joined if self.type == "left" else joined.where(matched)
        stats = {
            r["slice"]: r
            for r in marked.groupBy(slices.number(F.col(T)).alias("slice"))
            .agg(
                F.count(F.when(F.col(DECIDED), 1)).alias("decided"),
                F.count(F.when(~F.col(DECIDED), 1)).alias("open"),
            )
            .collect()
        }
        unmatched_by_slice = {
            r["slice"]: r["count"]
            for r in joined.where(~matched)
            .groupBy(slices.number(F.col(OUT_T)).alias("slice"))
            .count()
            .collect()
        }
        counts = []
        for k in range(len(slices)):
            decided_rows, open_rows = (stats[k]["decided"], stats[k]["open"]) if k in stats else (0, 0)
            unmatched = unmatched_by_slice.get(k, 0)
            counts.append(
                {
                    S: SideCounts(
                        joined=decided_rows - unmatched,
                        unmatched_emitted=unmatched if self.type == "left" else 0,
                        unmatched_dropped=0 if self.type == "left" else unmatched,
                        open=open_rows,
                    )
                }
            )
        state = {S: marked.where(~F.col(DECIDED)).drop(DECIDED)} if keep_state else None
        return Evaluation([emitted], counts, state, cached=[joined])

    def _nearest(self, joined: DataFrame, stream_columns: list[str]) -> DataFrame:
        """Per stream row, keep only its nearest candidate; of candidates with the same value, the
        latest arrival (RisingWave), then, within one commit, the table row's content."""
        S, R = self.stream, self.table
        assert self.inequality is not None  # called for ASOF joins only, which have their inequality
        _, op, right_col = self.inequality
        tie = F.to_json(F.struct(*[self._col(R, c) for c in _user_columns(joined, R)]))
        commit, version = self._col(R, TS), self._col(R, V)
        by_row = Window.partitionBy(*[self._col(S, c) for c in stream_columns])
        # left >= right (or >): the largest right value is nearest; left <= right (or <): the smallest.
        if op in (">=", ">"):
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


def _user_columns(joined: DataFrame, alias: str) -> list[str]:
    """The table's user columns in a joined frame (by the table's alias)."""
    return [f.name for f in joined.select(f"{alias}.*").schema.fields if not f.name.startswith("_sj_")]


register("stream-table", "temporal", "asof")(TemporalJoin.build)
