"""A stream-stream join whose joined rows are then looked up in tables: ksqlDB's
`FROM A JOIN B WITHIN ... JOIN C` with C a table, Flink's interval join followed by a temporal join.

The chain is a fold: the interval join (`joins/interval.py`) decides its step as it would alone,
and its emitted rows become the rows of one stream, `JOINED` (`IntervalJoin.as_rows`): each source's
columns in a struct named after it, the output event time, and the position at which the row became
known. The enrichment links (`joins/temporal.py`) then decide those rows exactly as they decide a
source's rows, from that time and position: a row is looked up in a table as it was at its
emission (arrival links), or at its event time (temporal links), and waits in the state while a
table is not final for it. Every position is a function of the Delta log, so the chain's rows are
the same live and replayed (docs/semantics.md, "Chains").
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import reduce
from typing import TYPE_CHECKING

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from streamjoin.arrival import T
from streamjoin.joins.base import MATCHED, JoinOperator, StepInput, StepResult, tally_by_slice
from streamjoin.joins.temporal import Enrichment
from streamjoin.metrics import LinkCounts
from streamjoin.plan import BoundJoin, Plan

if TYPE_CHECKING:
    from streamjoin.joins.interval import IntervalJoin

JOINED = "_sj_joined"  # the stream of the first link's emitted rows
PAIR = "_sj_pair"  # an emitted row is a joined pair (else a padded row)


@dataclass(frozen=True)
class Chain(JoinOperator):
    """An interval join, then enrichment links over its emitted rows."""

    head: IntervalJoin
    tail: Enrichment

    @classmethod
    def after(cls, head: IntervalJoin, plan: Plan, join: BoundJoin) -> Chain:
        """`head`'s rows looked up by `join` (the job's second link)."""
        return cls(head, Enrichment.over(JOINED, plan, join, first=2))

    def then(self, plan: Plan, join: BoundJoin) -> Chain | None:
        tail = self.tail.then(plan, join)
        return None if tail is None else replace(self, tail=tail)

    def margins(self, side: str) -> tuple[int, int]:
        return self.head.margins(side)

    def state_fields(self) -> tuple[StructField, ...]:
        return self.head.state_fields()

    def open_in_state(self) -> Column:
        return ~F.col(MATCHED)

    def derived_state(self, plan: Plan) -> dict[str, StructType]:
        """The joined rows waiting for a table: a struct of each stream's columns."""
        return {
            JOINED: StructType(
                [StructField(side, plan.source(side).schema) for side in (self.head.left, self.head.right)]
            )
        }

    def step(self, spark: SparkSession, plan: Plan, inputs: StepInput) -> StepResult:
        """The interval join's step, then the enrichment links over what it emitted and the
        joined rows an earlier step left waiting; the accounting of both, link by link."""
        head_state = tail_state = None
        if inputs.state is not None:
            head_state = {name: inputs.state[name] for name in (self.head.left, self.head.right)}
            tail_state = {JOINED: inputs.state[JOINED]}
        ran = self.head.run(spark, replace(inputs, state=head_state))
        rows = self.head.as_rows(spark, plan, ran.emitted, inputs.timeline, inputs.final).persist()
        slices = inputs.slices
        emitted = tally_by_slice(
            rows,
            slices.number(F.col(T)),
            matched=F.count(F.when(F.col(PAIR), 1)),
            padded=F.count(F.when(~F.col(PAIR), 1)),
        )
        carried = (
            {}
            if tail_state is None
            else tally_by_slice(tail_state[JOINED], slices.number(F.col(T)), waiting=F.count(F.lit(1)))
        )
        looked_up = self.tail.step(
            spark, plan, replace(inputs, settled={JOINED: rows.drop(PAIR)}, state=tail_state)
        )
        by_slice, links = [], []
        head = self.head
        for k, (sources, tables) in enumerate(zip(ran.by_slice, looked_up.by_slice, strict=True)):
            by_slice.append({**sources, **{name: c for name, c in tables.items() if name != JOINED}})
            pairs, pads = (emitted[k]["matched"], emitted[k]["padded"]) if k in emitted else (0, 0)
            first, *rest = looked_up.links[k]
            first = replace(
                first, carried_in=carried.get(k, {"waiting": 0})["waiting"], open=tables[JOINED].open
            )
            links.append(
                [
                    LinkCounts(
                        f"1. {head.type.upper()} JOIN {head.right}",
                        reached=pairs + pads,
                        matched=pairs,
                        padded=pads,
                    ),
                    first,
                    *rest,
                ]
            )
        state = None
        if ran.state is not None and looked_up.state is not None:
            state = {**ran.state, **looked_up.state}
        return StepResult(
            output=looked_up.output,
            late=reduce(DataFrame.unionByName, [ran.late, looked_up.late]),
            by_slice=by_slice,
            state=state,
            max_event=ran.max_event,
            watermark=ran.watermark,
            cached=[*ran.cached, rows, *looked_up.cached],
            links=links,
        )
