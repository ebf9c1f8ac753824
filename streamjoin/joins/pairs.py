"""What the stream-stream families that judge lateness by a watermark share (interval and window
joins): a row below the watermark at its position is late; the on-time rows (with the rows an
earlier live step kept) are handed to the family's own pairing (`Pairing.evaluate`); each side's
rows without a partner are counted in the pass that writes the output.

A family uses these functions on itself (it satisfies `Pairing`); none extends another.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Protocol

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from streamjoin import arrival
from streamjoin.arrival import ALL_TIME, REJECT, TS, Slices, T
from streamjoin.joins.base import (
    CLOCK,
    END_OF_INPUT,
    MATCHED,
    OUT_T,
    Deferred,
    Evaluation,
    SideCounts,
    SliceCounts,
    StepInput,
    StepResult,
    preserves,
)
from streamjoin.metrics import SourceCounts
from streamjoin.plan import Plan

NEW = "_sj_new"  # the row settled in this step (every row, in a replay)
THROUGH = "_sj_through"  # eager emission: the clock after the row's commit (NULL: an earlier step's row)


@dataclass(frozen=True)
class Evaluate:
    """How one step's pairing is asked. `watermark`: the watermark after every settled row;
    `candidates(side, k)`: the side's on-time rows in slice k not matched before this step;
    `slices`: only output rows whose event time lies in them are kept, each row accounted for in
    the slice of its event time; `keep_state`: return the rows still open; `clock`: the streams'
    clock before and after this step (eager emission); `persist`: more than the output's pass
    reads the join (the next state, a chain's next link), so it is kept in memory (`cached`);
    `waiting`: event times of left rows a link before still holds (a right row one of them could
    join stays open)."""

    watermark: int | None
    candidates: Callable[[str, int], int]
    slices: Slices = ALL_TIME
    keep_state: bool = False
    clock: tuple[int | None, int | None] = (None, None)
    persist: bool = False
    waiting: Sequence[int] = ()


class Pairing(Protocol):
    """A stream-stream family as these functions use it."""

    @property
    def left(self) -> str: ...

    @property
    def right(self) -> str: ...

    @property
    def type(self) -> str: ...

    @property
    def grace(self) -> int: ...  # microseconds

    @property
    def emit(self) -> str: ...

    @property
    def equi(self) -> tuple[tuple[str, str], ...]: ...

    def evaluate(self, rows: dict[str, DataFrame], asked: Evaluate) -> Evaluation:
        """Pair the on-time rows (`rows[side]`, with NEW and MATCHED; THROUGH for eager emission)."""
        ...

    def numbered(self, rows: DataFrame) -> DataFrame:
        """On-time rows as the family's next state finds them in its join."""
        ...

    def open_in_state(self) -> Column: ...

    def reads_rows_once(self) -> bool: ...


@dataclass
class PairStep:
    """What `decide` decided: `StepResult`'s parts, the rows still in the family's joined form
    (aliased by source name, with OUT_T and DUE)."""

    emitted: list[DataFrame]
    late: DataFrame
    by_slice: Sequence[dict[str, SourceCounts]]
    state: dict[str, DataFrame] | None
    max_event: int | None
    watermark: int | None
    cached: list[DataFrame]


def result(plan: Plan, ran: PairStep) -> StepResult:
    """A step's result: the emitted rows projected (`where`, `select`, the output time)."""
    return StepResult(
        output=project(plan, ran.emitted),
        late=ran.late,
        by_slice=ran.by_slice,
        state=ran.state,
        max_event=ran.max_event,
        watermark=ran.watermark,
        cached=ran.cached,
    )


def project(plan: Plan, emitted: list[DataFrame]) -> DataFrame:
    """Emitted rows (in joined form, with OUT_T) as output rows."""
    return reduce(DataFrame.unionByName, [plan.project(part, F.col(OUT_T)) for part in emitted])


def col(side: str, name: str) -> Column:
    """Column `name` of the side aliased `side` in a join."""
    return F.col(f"{side}.`{name}`")


@dataclass
class _Side:
    """One side's on-time rows for the pairing, its late rows, and its counts."""

    on_time: DataFrame
    late: DataFrame
    tallies: list[SliceCounts]


def _side(join: Pairing, name: str, rows: DataFrame, inputs: StepInput, per_commit: DataFrame) -> _Side:
    """A side's settled rows judged late or on time by the watermark at their position (or, for
    rows a table link held, by their own clock `CLOCK`), and the rows an earlier step kept."""
    slices, slice_of = inputs.slices, inputs.slices.number(F.col(T))
    late = arrival.is_late()
    timed = arrival.with_per_commit(rows, per_commit)
    if CLOCK in rows.columns:  # held by a table link: judged at its own position, whenever it comes
        clock_mark = F.lit(None) if inputs.mode == "complete" else F.col(CLOCK) - F.lit(join.grace)
        timed = timed.withColumn(arrival.WM, clock_mark.cast("long"))
    observed = join.reads_rows_once()
    tally = SliceCounts(
        timed, len(slices), observed=observed, late=(slice_of, late), candidates=(slice_of, ~late)
    )
    marked = tally.rows
    late_rows = arrival.side_rows(
        marked.where(late & slices.inside(F.col(T))), name, F.lit("late"), F.col(arrival.WM)
    )
    fresh = (
        marked.where(~late).drop(arrival.WM, REJECT).withColumns({NEW: F.lit(True), MATCHED: F.lit(False)})
    )
    tallies = [tally]
    if inputs.state is not None:
        kept = SliceCounts(
            inputs.state[name], len(slices), observed=observed, candidates=(slice_of, join.open_in_state())
        )
        tallies.append(kept)
        eager = {THROUGH: F.lit(None).cast("long")} if join.emit == "eager" else {}
        earlier = kept.rows.withColumns({NEW: F.lit(False)} | eager)
        fresh = earlier.unionByName(fresh, allowMissingColumns=True)
    return _Side(join.numbered(fresh) if inputs.keep_state else fresh, late_rows, tallies)


def decide(
    spark: SparkSession, join: Pairing, inputs: StepInput, persist: bool = False, waiting: Sequence[int] = ()
) -> PairStep:
    """A step up to the rows it emits, in the family's joined form (`PairStep.emitted`),
    unprojected: lateness by the streams' watermark, the family's pairing, the counts per slice.
    `persist` and `waiting`: see `Evaluate`."""
    timeline, final = inputs.timeline, inputs.final
    marks, max_event = timeline.watermarks(join.grace), timeline.max_event
    closing = None if max_event is None else max_event - join.grace
    per_commit = {arrival.WM: {} if inputs.mode == "complete" else marks}
    if join.emit == "eager":
        per_commit[THROUGH] = timeline.through
    table = arrival.per_commit_table(spark, per_commit)
    sides = {name: _side(join, name, rows, inputs, table) for name, rows in inputs.settled.items()}

    def tallied(name: str, k: int, field: str) -> int:
        return sum(t.get()[k].get(field, 0) for t in sides[name].tallies)

    asked = Evaluate(
        END_OF_INPUT if final else closing,
        lambda name, k: tallied(name, k, "candidates"),
        slices=inputs.slices,
        keep_state=inputs.keep_state,
        clock=(timeline.start, END_OF_INPUT if final else max_event),
        persist=persist,
        waiting=waiting,
    )
    evaluation = join.evaluate({name: side.on_time for name, side in sides.items()}, asked)
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
                for name, side in counted.items()
            }
            for k, counted in enumerate(evaluation.counts)
        ]
    )
    state = evaluation.state
    return PairStep(
        emitted=evaluation.emitted,
        late=reduce(DataFrame.unionByName, [side.late for side in sides.values()]),
        by_slice=by_slice,
        state=None if state is None else {name: rows.drop(NEW, THROUGH) for name, rows in state.items()},
        max_event=max_event,
        watermark=closing,
        cached=evaluation.cached,
    )


def unmatched_counts(
    join: Pairing, joined: DataFrame, slices: Slices, closed_l: Column, closed_r: Column
) -> SliceCounts:
    """Each side's rows in the full outer `joined` still without a partner (none in it, none
    before), by slice of their time, and how many of them closed (`closed_l`, `closed_r`),
    counted in the first pass over `joined` (go on with `.rows`; `side_counts` reads them)."""
    counted = {}
    for side, other, prefix, closed in (
        (join.left, join.right, "l", closed_l),
        (join.right, join.left, "r", closed_r),
    ):
        alone = col(side, TS).isNotNull() & col(other, TS).isNull() & ~col(side, MATCHED)
        number = slices.number(col(side, T))
        counted[f"{prefix}_unmatched"] = (number, alone)
        counted[f"{prefix}_closed"] = (number, alone & closed)
    return SliceCounts(joined, len(slices), observed=bool(join.equi), **counted)


def side_counts(
    join: Pairing, stats: SliceCounts, candidates: Callable[[str, int], int]
) -> Deferred[dict[str, SideCounts]]:
    """Each side's `SideCounts` per slice, from `unmatched_counts`; `candidates` as in `Evaluate`."""

    def counts() -> list[dict[str, SideCounts]]:
        result = []
        for k, by_side in sorted(stats.get().items()):
            sides = {}
            for side, prefix in ((join.left, "l"), (join.right, "r")):
                kept = preserves(join.type, side, join.left, join.right)
                closed = by_side[f"{prefix}_closed"]
                sides[side] = SideCounts(
                    joined=candidates(side, k) - by_side[f"{prefix}_unmatched"],
                    unmatched_emitted=closed if kept else 0,
                    unmatched_dropped=0 if kept else closed,
                    open=by_side[f"{prefix}_unmatched"] - closed,
                )
            result.append(sides)
        return result

    return Deferred(counts)
