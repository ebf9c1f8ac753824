"""The ROWS-window join on Spark: per key, each stream's latest rows in arrival order (the family's declaration: streamjoin/joins/rows/__init__.py)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StructField

from streamjoin import arrival
from streamjoin.arrival import SRC, TS, Slices, T, V, user_columns
from streamjoin.joins.base import (
    END_OF_INPUT,
    MATCHED,
    OUT_T,
    JoinOperator,
    StepInput,
    StepResult,
    preserves,
    tally_parts,
)
from streamjoin.joins.pairs import col
from streamjoin.joins.rows import RowsLink
from streamjoin.metrics import SourceCounts
from streamjoin.plan import BoundJoin, Plan

SEQ = "_sj_seq"  # a windowed stream's row: its number among its key's rows of that stream (from 1)
_KEY, _NEW, _ROW, _SIDE = "_sj_key", "_sj_new", "_sj_row", "_sj_side"
_SEEN = "_sj_seen"  # how many rows of the other stream (of the key) came before the row
_TOTAL = "_sj_total"  # how many rows of the row's own stream (of the key) there are so far
_NOW = "_sj_now"  # the row pairs in this step


@dataclass(frozen=True)
class RowsJoin(JoinOperator):
    left: str
    right: str
    type: str
    windows: tuple[tuple[str, int], ...]  # (source, how many of its latest rows per key are kept)
    equi: tuple[tuple[str, str], ...]
    residual: str | None

    @classmethod
    def build(cls, plan: Plan, join: BoundJoin) -> RowsJoin:
        spec = join.link(RowsLink)
        return cls(join.left[0], join.right, spec.type, spec.rows, join.equi, join.residual)

    def width(self, side: str) -> int:
        """How many of `side`'s latest rows per key the other stream sees (0: only as they arrive)."""
        return dict(self.windows).get(side, 0)

    def margins(self, side: str) -> tuple[int, int]:
        """A partner may lie any distance away in event time: the streams are read whole."""
        return END_OF_INPUT, END_OF_INPUT

    def state_fields(self) -> tuple[StructField, ...]:
        return StructField(MATCHED, BooleanType()), StructField(SEQ, LongType())

    def open_in_state(self) -> Column:
        return ~F.col(MATCHED)

    def preserves(self, side: str) -> bool:
        return preserves(self.type, side, self.left, self.right)

    # ------------------------------------------------------------------ the semantics

    def step(self, spark: SparkSession, plan: Plan, inputs: StepInput) -> StepResult:
        """Number the rows per key in arrival order, pair each new row with the other stream's
        window as it arrived, decide the rows that arrived unwindowed or left their window."""
        L, R = self.left, self.right
        numbered = self._numbered(plan, inputs).persist()
        sides = {
            side: numbered.where(F.col(_SIDE) == F.lit(side)).select(
                f"_sj_{n}.*", _KEY, _ROW, _NEW, MATCHED, SEQ, _SEEN, _TOTAL
            )
            for n, side in enumerate((L, R))
        }
        pairs = self._pairs(sides)
        # At least one stream has a window (spec), so there is at least one way to pair.
        paired = {
            side: reduce(DataFrame.unionByName, [p.select(col(side, _ROW).alias(_ROW)) for p in pairs])
            .distinct()
            .withColumn(_NOW, F.lit(True))
            for side in (L, R)
        }
        decided = {side: self._decided(side, sides[side], paired[side], inputs) for side in (L, R)}
        emitted = [
            *pairs,
            *[self._pads(sides, side, decided[side]) for side in (L, R) if self.preserves(side)],
        ]
        state = {}
        if inputs.keep_state:
            for side in (L, R):
                kept = decided[side].where(~F.col("_sj_decided") if self.width(side) else F.lit(False))
                state[side] = kept.withColumn(MATCHED, F.col("_sj_ever")).select(
                    *self._settled(inputs, side).columns, MATCHED, SEQ
                )
        slices = inputs.slices
        emitted = [part.where(slices.inside(F.col(OUT_T))) for part in emitted]
        nothing_late = reduce(
            DataFrame.unionByName,
            [
                arrival.side_rows(self._settled(inputs, side).where(F.lit(False)), side, F.lit("late"))
                for side in (L, R)
            ],
        )
        return StepResult(
            output=reduce(DataFrame.unionByName, [plan.project(part, F.col(OUT_T)) for part in emitted]),
            late=nothing_late,
            by_slice=self._counts(decided, slices),
            state=state if inputs.keep_state else None,
            max_event=inputs.timeline.max_event,
            cached=[numbered],
        )

    def _pairs(self, sides: dict[str, DataFrame]) -> list[DataFrame]:
        """Each new row with the rows of the other stream's window (of its key) when it arrived."""
        L, R = self.left, self.right
        left, right = sides[L].alias(L), sides[R].alias(R)
        pairs = []
        for later, earlier in ((L, R), (R, L)):
            width = self.width(earlier)
            if not width:
                continue
            seen, seq = col(later, _SEEN), col(earlier, SEQ)
            condition = (
                (col(L, _KEY) == col(R, _KEY))
                & col(later, _NEW)
                & (seq > seen - F.lit(width))
                & (seq <= seen)
            )
            if self.residual:
                condition = condition & F.expr(self.residual)
            pairs.append(left.join(right, condition).withColumn(OUT_T, F.greatest(col(L, T), col(R, T))))
        return pairs

    def _decided(self, side: str, rows: DataFrame, paired: DataFrame, inputs: StepInput) -> DataFrame:
        """`side`'s rows, each saying whether it pairs now (`_NOW`), ever paired (`_sj_ever`) and
        is decided (`_sj_decided`: it arrived unwindowed, left its key's window, or the input ended)."""
        width = self.width(side)
        now = F.coalesce(F.col(_NOW), F.lit(False))
        evicted = F.lit(False) if not width else F.col(SEQ) <= F.col(_TOTAL) - F.lit(width)
        decided = F.lit(True) if not width or inputs.final else evicted
        return rows.join(paired, _ROW, "left").withColumns(
            {_NOW: now, "_sj_decided": decided, "_sj_ever": F.col(MATCHED) | now}
        )

    def _pads(self, sides: dict[str, DataFrame], side: str, decided: DataFrame) -> DataFrame:
        """`side`'s decided rows that never paired, padded with the other stream's NULLs."""
        other = self.right if side == self.left else self.left
        pads = decided.where(F.col("_sj_decided") & ~F.col("_sj_ever")).withColumn(OUT_T, F.col(T))
        empty = sides[other].where(F.lit(False))
        return pads.alias(side).join(empty.alias(other), F.lit(True), "left_outer")

    def _counts(self, decided: dict[str, DataFrame], slices: Slices) -> list[dict[str, SourceCounts]]:
        """Per slice, each stream's rows that paired for the first time, were decided unpaired, or
        stay open unpaired (by the slice of their event time)."""
        tallied = tally_parts(
            {side: (rows, slices.number(F.col(T))) for side, rows in decided.items()},
            joined=F.count_if(~F.col(MATCHED) & F.col(_NOW)),
            unmatched=F.count_if(F.col("_sj_decided") & ~F.col("_sj_ever")),
            open=F.count_if(~F.col("_sj_decided") & ~F.col("_sj_ever")),
        )
        by_slice = []
        for k in range(len(slices)):
            counts = {}
            for side in (self.left, self.right):
                c = tallied[side].get(k, {"joined": 0, "unmatched": 0, "open": 0})
                counts[side] = SourceCounts(
                    joined=c["joined"],
                    unmatched_emitted=c["unmatched"] if self.preserves(side) else 0,
                    unmatched_dropped=0 if self.preserves(side) else c["unmatched"],
                    open=c["open"],
                )
            by_slice.append(counts)
        return by_slice

    def _numbered(self, plan: Plan, inputs: StepInput) -> DataFrame:
        """Both streams' rows (a step's new rows and the state's) as one frame (`_together`),
        numbered, and per row SEQ (its place among its stream's rows of the key), _SEEN (rows of
        the other stream of the key before it) and _TOTAL (rows of its own stream of the key so
        far)."""
        return self._sequenced(self._together(plan, inputs).withColumn(_ROW, F.monotonically_increasing_id()))

    def _together(self, plan: Plan, inputs: StepInput) -> DataFrame:
        """Both streams' rows as one frame: a struct per stream (`_sj_0`, `_sj_1`), the key (as
        JSON, the right's columns cast to the left's types), the arrival order's columns."""
        L, R = self.left, self.right
        left_types = {f.name: f.dataType for f in plan.source(L).schema.fields}
        frames = {}
        for side in (L, R):
            rows = self._settled(inputs, side).withColumns(
                {_NEW: F.lit(True), MATCHED: F.lit(False), SEQ: F.lit(None).cast(LongType())}
            )
            if inputs.state is not None:
                rows = inputs.state[side].withColumn(_NEW, F.lit(False)).unionByName(rows)
            frames[side] = rows
        packed = {
            side: F.struct(*[F.col(f"`{c}`") for c in rows.columns if c not in (_NEW, MATCHED, SEQ)])
            for side, rows in frames.items()
        }
        types = {side: frames[side].select(packed[side]).schema[0].dataType for side in (L, R)}
        parts = []
        for side, rows in frames.items():
            keys = []
            for i, (left_col, right_col) in enumerate(self.equi):
                name = (left_col if side == L else right_col).split(".", 1)[1].strip("`")
                column = F.col(f"`{name}`")
                if side == R:
                    column = column.cast(left_types[left_col.split(".", 1)[1].strip("`")])
                keys.append(column.alias(f"k{i}"))
            parts.append(
                rows.select(
                    F.lit(side).alias(_SIDE),
                    F.to_json(F.struct(*keys)).alias(_KEY),
                    F.col(TS),
                    F.col(SRC),
                    F.col(V),
                    F.col(T),
                    F.to_json(F.struct(*[F.col(f"`{c}`") for c in user_columns(rows)])).alias("_sj_content"),
                    F.col(_NEW),
                    F.col(MATCHED),
                    F.col(SEQ),
                    *[
                        (packed[side] if other == side else F.lit(None).cast(types[other])).alias(f"_sj_{n}")
                        for n, other in enumerate((L, R))
                    ],
                )
            )
        return reduce(DataFrame.unionByName, parts)

    def _sequenced(self, rows: DataFrame) -> DataFrame:
        """`_numbered`'s counts per key, in arrival order, over `_together`'s numbered rows."""
        L, R = self.left, self.right
        by_key = Window.partitionBy(_KEY)
        before = by_key.orderBy(TS, SRC, V, T, "_sj_content", _ROW).rowsBetween(Window.unboundedPreceding, -1)
        counted = {}
        windowed: dict[str, Column] = {}  # every side's counts, added in one projection
        for side in (L, R):
            mine = F.col(_SIDE) == F.lit(side)
            # Numbers go on from the state's: its rows of a windowed stream are the key's latest.
            windowed |= {
                f"_sj_base{side}": F.coalesce(
                    F.min(F.when(mine, F.col(SEQ))).over(by_key) - F.lit(1), F.lit(0)
                ),
                f"_sj_before{side}": F.coalesce(F.sum(mine.cast("long")).over(before), F.lit(0)),
                f"_sj_all{side}": F.sum(mine.cast("long")).over(by_key),
            }
            counted[side] = (F.col(f"_sj_base{side}"), F.col(f"_sj_before{side}"), F.col(f"_sj_all{side}"))
        rows = rows.withColumns(windowed)
        own = F.col(_SIDE) == F.lit(L)
        (base_l, before_l, all_l), (base_r, before_r, all_r) = counted[L], counted[R]
        return rows.select(
            *[
                c
                for c in rows.columns
                if c != SEQ and not c.startswith(("_sj_base", "_sj_before", "_sj_all"))
            ],
            F.when(own, base_l + before_l + 1).otherwise(base_r + before_r + 1).alias(SEQ),
            F.when(own, base_r + before_r).otherwise(base_l + before_l).alias(_SEEN),
            F.when(own, base_l + all_l).otherwise(base_r + all_r).alias(_TOTAL),
        )

    @staticmethod
    def _settled(inputs: StepInput, side: str) -> DataFrame:
        """A stream's settled rows of the step, without the rejection column (all are accepted)."""
        return inputs.settled[side].drop(arrival.REJECT)
