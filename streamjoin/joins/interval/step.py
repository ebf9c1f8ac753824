"""The interval join on Spark: pairs of two streams' rows within their time bounds, decided as the watermark passes (the family's declaration: streamjoin/joins/interval/__init__.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import reduce

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, StructField

from streamjoin import arrival
from streamjoin.arrival import SRC, TS, Slices, T, V, position_le
from streamjoin.joins.base import (
    CLOCK,
    MATCHED,
    OUT_T,
    Evaluation,
    JoinOperator,
    StepInput,
    StepResult,
    kept_row,
    preserves,
    tally_by_slice,
)
from streamjoin.joins.chain import Chain
from streamjoin.joins.chaining import Accepts, LinkInput, LinkRun, Upstream, declare
from streamjoin.joins.interval import IntervalLink
from streamjoin.joins.pairs import (
    NEW,
    THROUGH,
    Evaluate,
    PairStep,
    col,
    decide,
    project,
    result,
    side_counts,
    unmatched_counts,
)
from streamjoin.joins.temporal import ENRICHMENTS
from streamjoin.metrics import LinkCounts
from streamjoin.plan import BoundJoin, Plan
from streamjoin.timeutil import to_micros

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
    number: int = 1  # the job's number of this join

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

    def then(self, plan: Plan, join: BoundJoin) -> JoinOperator | None:
        """Its joined rows joined with another stream, or looked up in a table: a `Chain`."""
        return Chain.of(self).then(plan, join)

    @classmethod
    def following(cls, plan: Plan, join: BoundJoin, upstream: Upstream) -> IntervalJoin:
        """The interval join of `join` whose left input is the rows an earlier link emitted."""
        return replace(
            cls.from_plan(join), left=upstream.name, left_sources=upstream.sources, number=upstream.number
        )

    # ------------------------------------------------------------------ as a link of a chain

    def family(self) -> str:
        return "interval"

    def joins(self) -> int:
        return 1

    def input(self) -> str:
        return self.left

    def reads(self) -> tuple[str, ...]:
        return (self.right,) if self.left_sources else (self.left, self.right)

    def sources(self) -> tuple[str, ...]:
        """The sources whose columns its emitted rows hold, in the order written."""
        return (*(self.left_sources or (self.left,)), self.right)

    def carries(self) -> tuple[StructField, ...]:
        return ()

    def read_margins(self, side: str) -> tuple[int, int] | None:
        if side not in self.reads():
            return None
        before, after = self.margins(side)
        return before + self.reach[0], after + self.reach[1]

    def reaching(self, reach: tuple[int, int]) -> IntervalJoin:
        return replace(self, reach=reach)

    def absorb(self, plan: Plan, join: BoundJoin) -> None:
        return None

    def label(self) -> str:
        """How explain and the metrics name it: "2. LEFT JOIN payments"."""
        return f"{self.number}. {self.type.upper()} JOIN {self.right}"

    def run_link(self, spark: SparkSession, plan: Plan, given: LinkInput) -> LinkRun:
        """`run` over its left input (a source, or the rows the link before emitted, whose late
        rows it names after itself), keeping right rows open for the rows the link before still
        holds (`held`); counts its link: what it emitted, and of rows after a link what became of
        them."""
        inputs = given.step
        after_link = given.rows is not None
        left = given.rows if given.rows is not None else inputs.settled[self.left]
        settled = {self.left: left, self.right: inputs.settled[self.right]}
        state = None if inputs.state is None else {name: inputs.state[name] for name in settled}
        if state is not None:  # a source's state rows carry no clock (`Link.carries`)
            state[self.right] = state[self.right].drop(CLOCK)
        waiting = self._waiting(given)
        ran = self.run(spark, inputs.with_rows(settled, state=state), persist=True, waiting=waiting)
        late = ran.late
        if after_link:
            named = F.when(F.col("source") == self.left, f"rows at {self.label()}").otherwise(F.col("source"))
            late = late.withColumn("source", named)
        links = self._link_counts(ran, None if not after_link else state, inputs.slices)
        sources = [
            {name: c for name, c in counted.items() if not after_link or name != self.left}
            for counted in ran.by_slice
        ]
        return LinkRun(ran.emitted, late, sources, links, ran.state, ran.cached, watermark=ran.watermark)

    def _waiting(self, given: LinkInput) -> list[int]:
        """The event times of the rows the link before holds (`LinkInput.held`) that will be on
        time here when they come (exact mode: by their clock, `CLOCK`, and this link's grace)."""
        if given.held is None or given.step.final:
            return []
        held = given.held
        if given.step.mode == "exact":  # a row late here joins nothing
            held = held.where(F.col(CLOCK).isNull() | (F.col(T) >= F.col(CLOCK) - F.lit(self.grace)))
        return sorted(r[0] for r in held.select(T).distinct().collect())

    def _link_counts(
        self, ran: PairStep, state: dict[str, DataFrame] | None, slices: Slices
    ) -> list[list[LinkCounts]]:
        """Per slice, its `LinkCounts`: the pairs and padded rows it emitted; after a link, what
        became of the rows it took (`state`: those an earlier step left, counted `carried_in`)."""
        emitted = self.tally(ran.emitted, slices)
        carried = (
            {}
            if state is None
            else tally_by_slice(
                state[self.left].where(~F.col(MATCHED)), slices.number(F.col(T)), n=F.count(F.lit(1))
            )
        )
        links = []
        for s, sources in enumerate(ran.by_slice):
            pairs, pads = emitted.get(s, (0, 0))
            if self.left_sources == ():
                links.append([LinkCounts(self.label(), reached=pairs + pads, matched=pairs, padded=pads)])
                continue
            mine = sources[self.left]
            links.append(
                [
                    LinkCounts(
                        self.label(),
                        reached=mine.late + mine.joined + mine.unmatched_emitted + mine.unmatched_dropped,
                        matched=mine.joined,
                        padded=mine.unmatched_emitted,
                        dropped=mine.late + mine.unmatched_dropped,
                        carried_in=carried.get(s, {"n": 0})["n"],
                        open=mine.open,
                        emitted=pairs + pads,
                    )
                ]
            )
        return links

    def step(self, spark: SparkSession, plan: Plan, inputs: StepInput) -> StepResult:
        """Lateness by the streams' watermark, the join, padding of closed windows, the accounting."""
        return result(plan, self.run(spark, inputs))

    def output(self, plan: Plan, emitted: list[DataFrame]) -> DataFrame:
        """Emitted rows (`run`'s joined form) as output rows: `where`, `select`, the output time."""
        return project(plan, emitted)

    def tally(self, emitted: list[DataFrame], slices: Slices) -> dict[int, tuple[int, int]]:
        """(pairs, padded rows) among emitted rows (`run`'s joined form), by slice of their time."""
        both = col(self.left, TS).isNotNull() & col(self.right, TS).isNotNull()
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
    ) -> PairStep:
        """`step` up to the rows it emits, in joined form (`PairStep.emitted`), unprojected.
        `persist`: the emitted rows are read more than once. `waiting`: event times of left rows an
        earlier link still holds, on time here when they come (a chain's table links): a right row
        one of them could join stays open. Left rows that carry their clock (`CLOCK`) are judged
        late or on time by it (`pairs.decide`)."""
        return decide(spark, self, inputs, persist, waiting)

    def as_rows(
        self, spark: SparkSession, plan: Plan, emitted: list[DataFrame], inputs: StepInput
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
            has_l, has_r = col(L, TS).isNotNull(), col(R, TS).isNotNull()
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
            spark,
            reduce(DataFrame.unionByName, parts),
            F.col(DUE),
            F.col("_sj_own"),
            inputs.timeline,
            inputs.final,
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
        columns = [col(self.left, s).alias(s) for s in self.left_sources]
        for side in () if self.left_sources else (self.left,):
            columns.append(
                F.struct(*[col(side, c).alias(c) for c in plan.source(side).schema.fieldNames()]).alias(side)
            )
        source = plan.source(self.right)
        columns.append(
            F.struct(*[col(self.right, c).alias(c) for c in source.schema.fieldNames()]).alias(self.right)
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

    def reads_rows_once(self) -> bool:
        """An equi join (a CROSS join's nested loop reads one side once more for its unmatched
        rows) without eager pads (a second join of the same rows)."""
        return bool(self.equi) and self.emit == "final"

    def condition(self) -> Column:
        cond = F.lit(True)
        for left_col, right_col in self.equi:
            cond = cond & (F.expr(left_col) == F.expr(right_col))
        lt, rt = col(self.left, T), col(self.right, T)
        cond = cond & (rt >= lt + F.lit(self.lower)) & (rt <= lt + F.lit(self.upper))
        if self.residual:
            cond = cond & F.expr(self.residual)
        return cond

    def _position(self, side: str) -> tuple[Column, Column, Column]:
        return col(side, TS), col(side, SRC), col(side, V)

    def evaluate(self, rows: dict[str, DataFrame], asked: Evaluate) -> Evaluation:
        """Join on-time rows; emit pairs involving a new row and padded rows whose window closed
        (final emission) or whose eager decision falls in this step.

        `rows[side]` holds the side's on-time rows with `_sj_new` and `_sj_matched` (and, for eager
        emission, `_sj_through`); `asked` says the watermark, the slices and the rest (`Evaluate`).
        The counts are observed in the pass that writes the emitted rows (`SliceCounts`): read them
        after it."""
        watermark, slices, waiting = asked.watermark, asked.slices, asked.waiting
        L, R = self.left, self.right
        left, right = rows[L].alias(L), rows[R].alias(R)
        lt, rt = col(L, T), col(R, T)
        has_l, has_r = col(L, TS).isNotNull(), col(R, TS).isNotNull()

        joined = left.join(right, self.condition(), "full_outer")
        out_t = F.when(has_l & has_r, F.greatest(lt, rt)).when(has_l, lt).otherwise(rt)
        only_l, only_r = has_l & ~has_r, has_r & ~has_l
        due = F.when(only_l, lt + F.lit(self.upper + self.grace)).when(
            only_r, rt - F.lit(self.lower - self.grace)
        )
        joined = joined.withColumns({OUT_T: out_t, DUE: due})
        if asked.persist or asked.keep_state:
            joined = joined.persist()
        closed_l, closed_r = self.closed(L, lt, watermark), self.closed(R, rt, watermark, waiting)
        fresh_l, fresh_r = ~col(L, MATCHED), ~col(R, MATCHED)
        stats = unmatched_counts(self, joined, slices, closed_l, closed_r)
        pair = has_l & has_r & (col(L, NEW) | col(R, NEW))
        keep = pair
        if self.emit == "final":
            if self.preserves(L):
                keep = keep | (only_l & closed_l & fresh_l)
            if self.preserves(R):
                keep = keep | (only_r & closed_r & fresh_r)
        emitted = [stats.rows.where(keep & slices.inside(F.col(OUT_T), self.reach))]
        if self.emit == "eager":
            emitted += self._eager_pads(left, right, slices, asked.clock)

        state = self._next_state(rows, joined, watermark, waiting) if asked.keep_state else None
        return Evaluation(emitted, side_counts(self, stats, asked.candidates), state, cached=[joined])

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
            t = col(mine, T)
            if mine == self.left:
                due = F.least(t, t + F.lit(self.upper + self.grace))
            else:
                due = F.least(t, t - F.lit(self.lower - self.grace))
            new = F.col(f"{mine}.{NEW}")
            undecided = new if before is None else new | (due >= F.lit(before))
            decided = (due < F.lit(after)) & undecided & ~col(mine, MATCHED)
            partner_clock = col(theirs, THROUGH)
            in_time = position_le(self._position(theirs), self._position(mine)) | (
                partner_clock.isNotNull() & (partner_clock <= due)
            )
            if mine == self.left:
                joined = left.where(decided).join(right, self.condition() & in_time, "left_outer")
            else:
                joined = left.join(right.where(decided), self.condition() & in_time, "right_outer")
            padded = joined.where(col(theirs, TS).isNull()).withColumns({OUT_T: t, DUE: due})
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
            time = col(side, T)
            open_ = joined.where(col(side, TS).isNotNull() & ~self.closed(side, time, watermark, waiting))
            kept = open_.groupBy(col(side, ROW)).agg(
                F.any_value(F.struct(*[col(side, c).alias(c) for c in columns])).alias("_sj_kept"),
                F.bool_or(col(other, TS).isNotNull()).alias("_sj_paired"),
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


declare(
    "interval",
    accepts=(
        Accepts(("interval",), when="not CROSS", allows=lambda join: join.spec.type != "cross"),
        Accepts(ENRICHMENTS),
    ),
    after=IntervalJoin.following,
)
