"""The window join on Spark: rows paired within each tumbling or hopping window they fall in (the family's declaration: streamjoin/joins/window/__init__.py)."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StringType, StructField

from streamjoin.arrival import TS, T
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
from streamjoin.joins.interval.step import DUE, ROW
from streamjoin.joins.pairs import NEW, Evaluate, col, decide, result, side_counts, unmatched_counts
from streamjoin.joins.window import WINDOW_COLUMNS, WindowLink
from streamjoin.plan import BoundJoin, Plan
from streamjoin.timeutil import to_micros

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
