"""Interval (windowed) stream-stream joins: ksqlDB WITHIN, Flink/RisingWave interval, SQLstream RANGE.

A left row l and a right row r join when their keys are equal, the residual predicate holds, both
are on time, and  lower <= r.time - l.time <= upper  (both ends included). A joined row's event
time is the later of the two; an unmatched row's is its own. A CROSS join (SQLstream) has no keys
and no residual: every pair in the time bounds joins, and no side is padded.

Final emission (default): an outer row padded with NULLs is written once its window has closed,
that is once the watermark has passed the last time a partner could have: for a left row,
watermark > l.time + upper; for a right row, watermark > r.time - lower. A partner at that edge
arriving later would be strictly below the watermark, hence late: closing and lateness are the same
instant, so a row comes out joined or padded, never both.

Eager emission (`emit: eager`, SQLstream, ksqlDB without grace): an on-time outer row is decided
as soon as the joined streams' clock (the largest settled event time) has moved past its time, as
SQLstream decides per rowtime millisecond; it is padded then if no partner arrived before that
(or at or before its own position, if the clock was already past it when it came). Rows of equal
event time thus meet whichever source committed first. Matches that arrive later are emitted as
they come, and the pad is not retracted. A row whose window closes before the clock passes its
time is decided when it closes. All of it is read from positions and the timeline, so replays
reproduce it exactly.

`evaluate` is the whole semantics. Both runners call it: the replay once over all settled rows,
the live runner once per micro-batch over its state plus the newly settled rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import reduce

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, StructField

from streamjoin import arrival
from streamjoin.arrival import ALL_TIME, REJECT, SRC, TS, Slices, T, V, position_le
from streamjoin.joins.base import (
    CLOCK,
    END_OF_INPUT,
    MATCHED,
    OUT_T,
    Deferred,
    Evaluation,
    JoinOperator,
    SideCounts,
    SliceCounts,
    StepInput,
    StepResult,
    kept_row,
    preserves,
    register,
    tally_by_slice,
)
from streamjoin.joins.chain import Chain
from streamjoin.links import IntervalLink
from streamjoin.metrics import SourceCounts
from streamjoin.plan import BoundJoin, Plan
from streamjoin.timeutil import to_micros

NEW = "_sj_new"  # the row settled in this step (every row, in a replay)
THROUGH = "_sj_through"  # eager emission: the clock after the row's commit (NULL: an earlier step's row)
DUE = "_sj_due"  # a padded row: the clock it waited for (its emission position is where the clock passed it)
ROW = "_sj_row"  # an on-time row's number within one live step: its next state is read from the join


@dataclass(frozen=True)
class IntervalJoin(JoinOperator):
    left: str
    right: str
    type: str
    lower: int  # microseconds
    upper: int
    grace: int
    emit: str
    equi: tuple[tuple[str, str], ...]
    residual: str | None
    # In a chain: the sources whose columns the left rows hold, a struct each, when the left input
    # is the rows an earlier link emitted (empty: the left is a source); and how far around the
    # slices its emitted rows must reach, for the links after it (before, after).
    left_sources: tuple[str, ...] = ()
    reach: tuple[int, int] = (0, 0)

    @classmethod
    def from_plan(cls, join: BoundJoin) -> IntervalJoin:
        spec = join.link(IntervalLink)
        assert spec.bounds is not None  # the job is refused when a stream-stream join has no bounds
        return cls(
            left=join.left[0],
            right=join.right,
            type=spec.type,
            lower=to_micros(spec.bounds.lower),
            upper=to_micros(spec.bounds.upper),
            grace=to_micros(spec.grace),
            emit=spec.emit,
            equi=join.equi,
            residual=join.residual,
        )

    # ------------------------------------------------------------------ the operator

    @classmethod
    def build(cls, plan: Plan, join: BoundJoin) -> IntervalJoin:
        return cls.from_plan(join)

    def state_fields(self) -> tuple[StructField, ...]:
        """Each kept row says whether it has met a partner (an outer row is padded only if not)."""
        return (StructField(MATCHED, BooleanType()),)

    def open_in_state(self) -> Column:
        return ~F.col(MATCHED)

    def then(self, plan: Plan, join: BoundJoin) -> Chain | None:
        """Its joined rows joined with another stream, or looked up in a table: a `Chain`."""
        return Chain.of(self).then(plan, join)

    def following(self, join: BoundJoin, left: str, sources: tuple[str, ...]) -> IntervalJoin:
        """The interval join of `join` whose left input is `left`, the rows an earlier link emitted
        (holding `sources`' columns): a chain's stream-stream link after this one."""
        return replace(self.from_plan(join), left=left, left_sources=sources)

    def sources(self) -> tuple[str, ...]:
        """The sources whose columns its emitted rows hold, in the order written."""
        return (*(self.left_sources or (self.left,)), self.right)

    def step(self, spark: SparkSession, plan: Plan, inputs: StepInput) -> StepResult:
        """Lateness by the streams' watermark, the join, padding of closed windows, the accounting."""
        ran = self.run(spark, inputs)
        return StepResult(
            output=self.output(plan, ran.emitted),
            late=ran.late,
            by_slice=ran.by_slice,
            state=ran.state,
            max_event=ran.max_event,
            watermark=ran.watermark,
            cached=ran.cached,
        )

    def output(self, plan: Plan, emitted: list[DataFrame]) -> DataFrame:
        """Emitted rows (`run`'s joined form) as output rows: `where`, `select`, the output time."""
        return reduce(DataFrame.unionByName, [plan.project(part, F.col(OUT_T)) for part in emitted])

    def tally(self, emitted: list[DataFrame], slices: Slices) -> dict[int, tuple[int, int]]:
        """(pairs, padded rows) among emitted rows (`run`'s joined form), by slice of their time."""
        both = self._col(self.left, TS).isNotNull() & self._col(self.right, TS).isNotNull()
        rows = reduce(
            DataFrame.unionByName, [part.select(F.col(OUT_T), both.alias("_sj_pair")) for part in emitted]
        )
        counted = tally_by_slice(
            rows,
            slices.number(F.col(OUT_T)),
            pairs=F.count(F.when(F.col("_sj_pair"), 1)),
            pads=F.count(F.when(~F.col("_sj_pair"), 1)),
        )
        return {k: (c["pairs"], c["pads"]) for k, c in counted.items()}

    def run(
        self, spark: SparkSession, inputs: StepInput, persist: bool = False, waiting: Sequence[int] = ()
    ) -> IntervalStep:
        """`step` up to the rows it emits, in joined form (`IntervalStep.emitted`), unprojected.
        `persist`: the emitted rows are read more than once (`evaluate`). `waiting`: event times of
        left rows an earlier link still holds, on time here when they come (a chain's table links):
        a right row one of them could join stays open. Left rows that carry their clock (`CLOCK`)
        are judged late or on time by it."""
        settled, timeline, mode, state = inputs.settled, inputs.timeline, inputs.mode, inputs.state
        slices, keep_state, final = inputs.slices, inputs.keep_state, inputs.final
        marks, max_event = timeline.watermarks(self.grace), timeline.max_event
        if mode == "complete":
            marks = {}
        closing = None if max_event is None else max_event - self.grace

        on_time, late_parts, tallies = {}, [], []
        per_commit = {arrival.WM: marks}
        if self.emit == "eager":
            per_commit[THROUGH] = timeline.through
        table = arrival.per_commit_table(spark, per_commit)
        slice_of = slices.number(F.col(T))
        for name, rows in settled.items():
            late = arrival.is_late()
            timed = arrival.with_per_commit(rows, table)
            if CLOCK in rows.columns:  # held by a table link: judged at its own position, whenever it comes
                clock_mark = F.lit(None) if mode == "complete" else F.col(CLOCK) - F.lit(self.grace)
                timed = timed.withColumn(arrival.WM, clock_mark.cast("long"))
            tally = SliceCounts(
                timed,
                len(slices),
                observed=self.reads_rows_once(),
                late=(slice_of, late),
                candidates=(slice_of, ~late),
            )
            tallies.append((name, tally))
            marked = tally.rows
            late_parts.append(
                arrival.side_rows(
                    marked.where(late & slices.inside(F.col(T))), name, F.lit("late"), F.col(arrival.WM)
                )
            )
            fresh = (
                marked.where(~late)
                .drop(arrival.WM, REJECT)
                .withColumns({NEW: F.lit(True), MATCHED: F.lit(False)})
            )
            if state is not None:
                kept = SliceCounts(
                    state[name],
                    len(slices),
                    observed=self.reads_rows_once(),
                    candidates=(slice_of, self.open_in_state()),
                )
                tallies.append((name, kept))
                earlier = kept.rows.withColumns(
                    {NEW: F.lit(False)}
                    | ({THROUGH: F.lit(None).cast("long")} if self.emit == "eager" else {})
                )
                fresh = earlier.unionByName(fresh, allowMissingColumns=True)
            on_time[name] = self.numbered(fresh) if keep_state else fresh

        def tallied(name: str, k: int, field: str) -> int:
            return sum(t.get()[k].get(field, 0) for n, t in tallies if n == name)

        evaluation = self.evaluate(
            on_time,
            END_OF_INPUT if final else closing,
            lambda name, k: tallied(name, k, "candidates"),
            slices=slices,
            keep_state=keep_state,
            clock=(timeline.start, END_OF_INPUT if final else max_event),
            persist=persist,
            waiting=waiting,
        )
        by_slice = Deferred(
            lambda: [
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
        )
        next_state = None
        if evaluation.state is not None:
            next_state = {name: rows.drop(NEW, THROUGH) for name, rows in evaluation.state.items()}
        return IntervalStep(
            emitted=evaluation.emitted,
            late=reduce(DataFrame.unionByName, late_parts),
            by_slice=by_slice,
            state=next_state,
            max_event=max_event,
            watermark=closing,
            cached=evaluation.cached,
        )

    def as_rows(
        self,
        spark: SparkSession,
        plan: Plan,
        emitted: list[DataFrame],
        timeline: arrival.Timeline,
        final: bool,
    ) -> DataFrame:
        """Emitted rows as the rows of one stream, for the chain's next link: each source's columns
        in a struct named after it (so that `orders.id` still reads orders' id and equal names never
        collide), the output event time, and the position at which the row became known: a joined
        pair when its later row arrived; a padded row at the first settled commit whose clock
        closed its window (final emission) or decided it (eager), never before its own arrival;
        at a closed input's last commit when only the input's end closed it."""
        L, R = self.left, self.right
        parts = []
        for part in emitted:
            has_l, has_r = self._col(L, TS).isNotNull(), self._col(R, TS).isNotNull()
            at_l, at_r = (arrival.position_struct(*self._position(side)) for side in (L, R))
            own = F.when(has_l & has_r, F.greatest(at_l, at_r)).when(has_l, at_l).otherwise(at_r)
            parts.append(
                part.select(
                    *self._source_columns(plan),
                    F.col(OUT_T).alias(T),
                    own.alias("_sj_own"),
                    F.col(DUE),
                )
            )
        rows = arrival.when_clock_passes(
            spark, reduce(DataFrame.unionByName, parts), F.col(DUE), F.col("_sj_own"), timeline, final
        )
        emit = F.col(arrival.EMIT)
        return rows.select(
            *self.sources(),
            T,
            emit["ts"].alias(TS),
            emit["src"].cast("int").alias(SRC),
            emit["v"].alias(V),
        )

    def _source_columns(self, plan: Plan) -> list[Column]:
        """A struct per source of the joined form (`emitted`), named after it: the right side's
        columns; the left's, or, when the left holds an earlier link's rows, its structs as they are."""
        columns = [self._col(self.left, s).alias(s) for s in self.left_sources]
        for side in () if self.left_sources else (self.left,):
            columns.append(
                F.struct(*[self._col(side, c).alias(c) for c in plan.source(side).schema.fieldNames()]).alias(
                    side
                )
            )
        source = plan.source(self.right)
        columns.append(
            F.struct(*[self._col(self.right, c).alias(c) for c in source.schema.fieldNames()]).alias(
                self.right
            )
        )
        return columns

    # ------------------------------------------------------------------ time

    def margins(self, side: str) -> tuple[int, int]:
        """How far before a slice's start and after its end `side`'s rows must be read."""
        if side == self.left:
            return max(self.upper, 0), max(-self.lower, 0)
        return max(-self.lower, 0), max(self.upper, 0)

    def closed(self, side: str, time: Column, watermark: int | None, waiting: Sequence[int] = ()) -> Column:
        """A row's window has closed: no partner still to come can be on time. A right row within
        the bounds of a `waiting` left row's time stays open (`run`)."""
        if watermark is None:
            return F.lit(False)
        edge = time + F.lit(self.upper) if side == self.left else time - F.lit(self.lower)
        closed = edge < F.lit(watermark)
        if side == self.right and waiting:
            closed = closed & ~_within(waiting, self.lower, self.upper)(time)
        return closed

    def preserves(self, side: str) -> bool:
        return preserves(self.type, side, self.left, self.right)

    # ------------------------------------------------------------------ matching

    def _col(self, side: str, name: str) -> Column:
        return F.col(f"{side}.`{name}`")

    def reads_rows_once(self) -> bool:
        """An equi join (a CROSS join's nested loop reads one side once more for its unmatched
        rows) without eager pads (a second join of the same rows)."""
        return bool(self.equi) and self.emit == "final"

    def condition(self) -> Column:
        cond = F.lit(True)
        for left_col, right_col in self.equi:
            cond = cond & (F.expr(left_col) == F.expr(right_col))
        lt, rt = self._col(self.left, T), self._col(self.right, T)
        cond = cond & (rt >= lt + F.lit(self.lower)) & (rt <= lt + F.lit(self.upper))
        if self.residual:
            cond = cond & F.expr(self.residual)
        return cond

    def _position(self, side: str) -> tuple[Column, Column, Column]:
        return self._col(side, TS), self._col(side, SRC), self._col(side, V)

    def evaluate(
        self,
        rows: dict[str, DataFrame],
        watermark: int | None,
        candidates: Callable[[str, int], int],
        slices: Slices = ALL_TIME,
        keep_state: bool = False,
        clock: tuple[int | None, int | None] = (None, None),
        persist: bool = False,
        waiting: Sequence[int] = (),
    ) -> Evaluation:
        """Join on-time rows; emit pairs involving a new row and padded rows whose window closed
        (final emission) or whose eager decision falls in this step.

        `rows[side]` holds the side's on-time rows with `_sj_new` and `_sj_matched` (and, for eager
        emission, `_sj_through`); `watermark` is the watermark after every settled row;
        `candidates(side, k)` counts the side's rows in slice k not matched before this step;
        `clock` is the streams' clock before and after this step (eager emission). With replay
        `slices`, only output rows whose event time lies in them are kept, and each row is accounted
        for in the slice of its event time. The counts are observed in the pass that writes the
        emitted rows (`SliceCounts`): read them after it. `persist`: more than that pass reads the
        join (the next state, a chain's next link), so it is kept in memory (`cached`). `waiting`:
        see `run`.
        """
        L, R = self.left, self.right
        left, right = rows[L].alias(L), rows[R].alias(R)
        lt, rt = self._col(L, T), self._col(R, T)
        has_l, has_r = self._col(L, TS).isNotNull(), self._col(R, TS).isNotNull()

        joined = left.join(right, self.condition(), "full_outer")
        out_t = F.when(has_l & has_r, F.greatest(lt, rt)).when(has_l, lt).otherwise(rt)
        only_l, only_r = has_l & ~has_r, has_r & ~has_l
        due = F.when(only_l, lt + F.lit(self.upper + self.grace)).when(
            only_r, rt - F.lit(self.lower - self.grace)
        )
        joined = joined.withColumns({OUT_T: out_t, DUE: due})
        if persist or keep_state:
            joined = joined.persist()
        closed_l, closed_r = self.closed(L, lt, watermark), self.closed(R, rt, watermark, waiting)
        fresh_l, fresh_r = ~self._col(L, MATCHED), ~self._col(R, MATCHED)
        stats = self.unmatched_counts(joined, slices, closed_l, closed_r)
        pair = has_l & has_r & (self._col(L, NEW) | self._col(R, NEW))
        keep = pair
        if self.emit == "final":
            if self.preserves(L):
                keep = keep | (only_l & closed_l & fresh_l)
            if self.preserves(R):
                keep = keep | (only_r & closed_r & fresh_r)
        emitted = [stats.rows.where(keep & slices.inside(F.col(OUT_T), self.reach))]
        if self.emit == "eager":
            emitted += self._eager_pads(left, right, slices, clock)

        state = self._next_state(rows, joined, watermark, waiting) if keep_state else None
        return Evaluation(emitted, self.side_counts(stats, candidates), state, cached=[joined])

    def unmatched_counts(
        self, joined: DataFrame, slices: Slices, closed_l: Column, closed_r: Column
    ) -> SliceCounts:
        """Each side's rows in the full outer `joined` still without a partner (none in it, none
        before), by slice of their time, and how many of them closed (`closed_l`, `closed_r`),
        counted in the first pass over `joined` (go on with `.rows`; `side_counts` reads them)."""
        counted = {}
        for side, other, prefix, closed in (
            (self.left, self.right, "l", closed_l),
            (self.right, self.left, "r", closed_r),
        ):
            alone = (
                self._col(side, TS).isNotNull() & self._col(other, TS).isNull() & ~self._col(side, MATCHED)
            )
            number = slices.number(self._col(side, T))
            counted[f"{prefix}_unmatched"] = (number, alone)
            counted[f"{prefix}_closed"] = (number, alone & closed)
        return SliceCounts(joined, len(slices), observed=bool(self.equi), **counted)

    def side_counts(
        self, stats: SliceCounts, candidates: Callable[[str, int], int]
    ) -> Deferred[dict[str, SideCounts]]:
        """Each side's `SideCounts` per slice, from `unmatched_counts`; `candidates` as for
        `evaluate`."""

        def counts() -> list[dict[str, SideCounts]]:
            tallied = stats.get()
            return [
                {
                    side: SideCounts(
                        joined=candidates(side, k) - by_side[f"{prefix}_unmatched"],
                        unmatched_emitted=by_side[f"{prefix}_closed"] if self.preserves(side) else 0,
                        unmatched_dropped=0 if self.preserves(side) else by_side[f"{prefix}_closed"],
                        open=by_side[f"{prefix}_unmatched"] - by_side[f"{prefix}_closed"],
                    )
                    for side, prefix in ((self.left, "l"), (self.right, "r"))
                }
                for k, by_side in sorted(tallied.items())
            ]

        return Deferred(counts)

    def _eager_pads(
        self, left: DataFrame, right: DataFrame, slices: Slices, clock: tuple[int | None, int | None]
    ) -> list[DataFrame]:
        """Outer rows decided in this step with no partner arrived before their decision, padded.

        A row of time t is decided at the first position (its own or later) where the clock passes
        `due` = min(t, the last instant its window is open); that is in this step iff the clock
        after it passes `due` and, for a row an earlier step kept, the clock before it did not. A
        partner arrived before the decision iff it came before the row, or the clock after the
        partner's commit had not passed `due`. An earlier step's row already has `_sj_matched` if
        a partner came in an earlier step, which was before its decision.
        """
        before, after = clock
        if after is None:
            return []
        pads = []
        for mine, theirs in ((self.left, self.right), (self.right, self.left)):
            if not self.preserves(mine):
                continue
            t = self._col(mine, T)
            if mine == self.left:
                due = F.least(t, t + F.lit(self.upper + self.grace))
            else:
                due = F.least(t, t - F.lit(self.lower - self.grace))
            new = F.col(f"{mine}.{NEW}")
            undecided = new if before is None else new | (due >= F.lit(before))
            decided = (due < F.lit(after)) & undecided & ~self._col(mine, MATCHED)
            partner_clock = self._col(theirs, THROUGH)
            in_time = position_le(self._position(theirs), self._position(mine)) | (
                partner_clock.isNotNull() & (partner_clock <= due)
            )
            if mine == self.left:
                joined = left.where(decided).join(right, self.condition() & in_time, "left_outer")
            else:
                joined = left.join(right.where(decided), self.condition() & in_time, "right_outer")
            padded = joined.where(self._col(theirs, TS).isNull()).withColumns({OUT_T: t, DUE: due})
            pads.append(padded.where(slices.inside(F.col(OUT_T), self.reach)))
        return pads

    def numbered(self, rows: DataFrame) -> DataFrame:
        """On-time rows with a number each (`ROW`), by which the next state finds them in the join."""
        return rows.withColumn(ROW, F.monotonically_increasing_id())

    def _next_state(
        self, rows: dict[str, DataFrame], joined: DataFrame, watermark: int | None, waiting: Sequence[int]
    ) -> dict[str, DataFrame]:
        """Rows whose window is still open, with `_sj_matched` updated; closed rows are evicted.

        Every on-time row is in the full outer `joined`: once per partner, or once padded. So each
        side's next state is read from it, grouping by the row's number (`ROW`, so identical rows
        stay as many as they were): one aggregate over the cached join, no second join."""
        state = {}
        for side, other in ((self.left, self.right), (self.right, self.left)):
            columns = [c for c in rows[side].columns if c != ROW]
            time = self._col(side, T)
            open_ = joined.where(
                self._col(side, TS).isNotNull() & ~self.closed(side, time, watermark, waiting)
            )
            kept = open_.groupBy(self._col(side, ROW)).agg(
                F.any_value(F.struct(*[self._col(side, c).alias(c) for c in columns])).alias("_sj_kept"),
                F.bool_or(self._col(other, TS).isNotNull()).alias("_sj_paired"),
            )
            state[side] = kept.select(*kept_row("_sj_kept", columns, F.col("_sj_paired")))
        return state


def _within(times: Sequence[int], lower: int, upper: int):
    """A vectorised UDF: is a right row's time within [t + lower, t + upper] of one of `times`?
    The intervals are merged first, so each row takes one binary search."""
    starts: list[int] = []
    ends: list[int] = []
    for t in sorted(times):
        if starts and t + lower <= ends[-1]:
            ends[-1] = max(ends[-1], t + upper)
        else:
            starts.append(t + lower)
            ends.append(t + upper)
    low, high = np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64)

    @F.pandas_udf(BooleanType())  # type: ignore[call-overload]  # pyspark's overloads miss this form
    def within(time: pd.Series) -> pd.Series:
        at = time.to_numpy(dtype=np.int64)
        k = np.searchsorted(low, at, side="right") - 1
        return pd.Series((k >= 0) & (at <= high[np.maximum(k, 0)]))

    return within


@dataclass
class IntervalStep:
    """What `IntervalJoin.run` decided: `StepResult`'s parts, the rows still in joined form
    (aliased by source name, with OUT_T and DUE)."""

    emitted: list[DataFrame]
    late: DataFrame
    by_slice: Sequence[dict[str, SourceCounts]]
    state: dict[str, DataFrame] | None
    max_event: int | None
    watermark: int | None
    cached: list[DataFrame]


register("interval")(IntervalJoin.build)
