"""Chains that start with a stream-stream join: ksqlDB's `FROM A JOIN B WITHIN ... JOIN C WITHIN ...`
and `... JOIN C` with C a table, Flink's interval join followed by another interval join or by a
temporal join.

The chain is a fold: the first interval join (`joins/interval.py`) decides its step as it would
alone, and its emitted rows become the rows of one stream (`IntervalJoin.as_rows`): each source's
columns in a struct named after it, the output event time, and the position at which the row became
known. Each later stream-stream link joins those rows with its own stream exactly as it would join
two sources (lateness by its grace at the rows' positions, matching, closing), and emits rows of the
same form; the enrichment links (`joins/temporal.py`) at the end look them up in tables as they
would a source's rows. Every position is a function of the Delta log, so the chain's rows are the
same live and replayed (docs/semantics.md, "Chains after a stream-stream join").
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
from streamjoin.joins.temporal import ENRICHMENTS, Enrichment
from streamjoin.metrics import LinkCounts, SourceCounts
from streamjoin.plan import BoundJoin, Plan

if TYPE_CHECKING:
    from streamjoin.joins.interval import IntervalJoin


def derived(link: int) -> str:
    """The stream of rows the links before `link` (the job's number, from 2) emitted: its input."""
    return f"_sj_link{link}"


@dataclass(frozen=True)
class Chain(JoinOperator):
    """Interval joins in turn, each after the first joining the rows the one before emitted with a
    stream; then, optionally, enrichment links over what the last one emitted."""

    joins: tuple[IntervalJoin, ...]
    tail: Enrichment | None = None

    @classmethod
    def of(cls, head: IntervalJoin) -> Chain:
        return cls((head,))

    def then(self, plan: Plan, join: BoundJoin) -> Chain | None:
        """The chain with one more link: a stream-stream link while no table link came before it,
        enrichment links after; None for any other (the job is refused)."""
        if self.tail is not None:
            tail = self.tail.then(plan, join)
            return None if tail is None else replace(self, tail=tail)
        number = len(self.joins) + 1
        last = self.joins[-1]
        if join.family in ENRICHMENTS:
            return replace(self, tail=Enrichment.over(derived(number), plan, join, first=number)).reaching()
        if join.family == "interval" and join.spec.type != "cross":
            link = last.following(join, derived(number), last.sources())
            return replace(self, joins=(*self.joins, link)).reaching()
        return None

    def reaching(self) -> Chain:
        """Each interval join emitting as far around the slices as the links after it read."""
        joins, reach = list(self.joins), (0, 0)
        if self.tail is not None:
            reach = self.tail.margins(self.tail.stream)
        for k in range(len(joins) - 1, -1, -1):
            joins[k] = replace(joins[k], reach=reach)
            if k > 0:
                before, after = joins[k].margins(joins[k].left)
                reach = (reach[0] + before, reach[1] + after)
        return replace(self, joins=tuple(joins))

    def margins(self, side: str) -> tuple[int, int]:
        """A stream's own link's margins plus what every later link reads around the slices."""
        for k, join in enumerate(self.joins):
            if side == join.right or (k == 0 and side == join.left):
                before, after = join.margins(side)
                return before + join.reach[0], after + join.reach[1]
        return (0, 0) if self.tail is None else self.tail.margins(side)

    def state_fields(self) -> tuple[StructField, ...]:
        return self.joins[0].state_fields()

    def open_in_state(self) -> Column:
        return ~F.col(MATCHED)

    def derived_state(self, plan: Plan) -> dict[str, StructType]:
        """The rows an earlier link emitted that a later one keeps: a struct of each source's columns."""
        inputs = [(join.left, self.joins[k - 1]) for k, join in enumerate(self.joins) if k > 0]
        if self.tail is not None:
            inputs.append((self.tail.stream, self.joins[-1]))
        return {
            name: StructType([StructField(s, plan.source(s).schema) for s in before.sources()])
            for name, before in inputs
        }

    def step(self, spark: SparkSession, plan: Plan, inputs: StepInput) -> StepResult:
        """Each interval join's step over the rows the one before emitted, then the enrichment
        links over the last one's; the accounting of every source and link."""
        state, slices = inputs.state, inputs.slices
        by_slice: list[dict[str, SourceCounts]] = [{} for _ in range(len(slices))]
        links: list[list[LinkCounts]] = [[] for _ in range(len(slices))]
        late, cached, next_state = [], [], {}
        rows: DataFrame | None = None  # what the link before emitted, as the rows of one stream
        for k, join in enumerate(self.joins):
            settled = {join.left: inputs.settled[join.left] if rows is None else rows}
            settled[join.right] = inputs.settled[join.right]
            own_state = None if state is None else {name: state[name] for name in settled}
            ran = join.run(spark, replace(inputs, settled=settled, state=own_state), persist=True)
            label = _link_name(k + 1, join)
            late.append(
                ran.late
                if k == 0
                else ran.late.withColumn(
                    "source",
                    F.when(F.col("source") == join.left, f"rows at {label}").otherwise(F.col("source")),
                )
            )
            cached += ran.cached
            next_state.update(ran.state or {})
            emitted = join.tally(ran.emitted, slices)
            carried = (
                {}
                if k == 0 or own_state is None
                else tally_by_slice(
                    own_state[join.left].where(~F.col(MATCHED)), slices.number(F.col(T)), n=F.count(F.lit(1))
                )
            )
            for s, sources in enumerate(ran.by_slice):
                pairs, pads = emitted.get(s, (0, 0))
                by_slice[s].update({name: c for name, c in sources.items() if k == 0 or name != join.left})
                if k == 0:
                    links[s].append(LinkCounts(label, reached=pairs + pads, matched=pairs, padded=pads))
                    continue
                mine = sources[join.left]
                links[s].append(
                    LinkCounts(
                        label,
                        reached=mine.late + mine.joined + mine.unmatched_emitted + mine.unmatched_dropped,
                        matched=mine.joined,
                        padded=mine.unmatched_emitted,
                        dropped=mine.late + mine.unmatched_dropped,
                        carried_in=carried.get(s, {"n": 0})["n"],
                        open=mine.open,
                        emitted=pairs + pads,
                    )
                )
            if k + 1 < len(self.joins) or self.tail is not None:
                rows = join.as_rows(spark, plan, ran.emitted, inputs.timeline, inputs.final).persist()
                cached.append(rows)
            else:
                output = join.output(plan, ran.emitted)
        head = self.joins[0]
        if self.tail is not None:
            assert rows is not None
            output = self._look_up(spark, plan, inputs, rows, by_slice, links, late, cached, next_state)
        return StepResult(
            output=output,
            late=reduce(DataFrame.unionByName, late),
            by_slice=by_slice,
            state=next_state if inputs.keep_state else None,
            max_event=inputs.timeline.max_event,
            watermark=None if inputs.timeline.max_event is None else inputs.timeline.max_event - head.grace,
            cached=cached,
            links=links,
        )

    def _look_up(
        self,
        spark: SparkSession,
        plan: Plan,
        inputs: StepInput,
        rows: DataFrame,
        by_slice: list[dict[str, SourceCounts]],
        links: list[list[LinkCounts]],
        late: list[DataFrame],
        cached: list[DataFrame],
        next_state: dict[str, DataFrame],
    ) -> DataFrame:
        """The enrichment links over the last interval join's rows and those an earlier step left
        waiting for a table; adds their accounting, late table changes, cache and state."""
        tail = self.tail
        assert tail is not None
        waiting = None if inputs.state is None else {tail.stream: inputs.state[tail.stream]}
        carried = (
            {}
            if waiting is None
            else tally_by_slice(waiting[tail.stream], inputs.slices.number(F.col(T)), n=F.count(F.lit(1)))
        )
        looked_up = tail.step(spark, plan, replace(inputs, settled={tail.stream: rows}, state=waiting))
        for s, tables in enumerate(looked_up.by_slice):
            by_slice[s].update({name: c for name, c in tables.items() if name != tail.stream})
            first, *rest = looked_up.links[s]
            first = replace(first, carried_in=carried.get(s, {"n": 0})["n"], open=tables[tail.stream].open)
            links[s] += [first, *rest]
        late.append(looked_up.late)
        cached += looked_up.cached
        next_state.update(looked_up.state or {})
        return looked_up.output


def _link_name(number: int, join: IntervalJoin) -> str:
    """How explain and the metrics name a link: "2. LEFT JOIN payments"."""
    return f"{number}. {join.type.upper()} JOIN {join.right}"
