"""Chains with stream-stream links: ksqlDB's `FROM A JOIN B WITHIN ... JOIN C WITHIN ...`, `... JOIN C`
with C a table, and `FROM A JOIN B JOIN C WITHIN ...` with B a table; Flink's interval join followed
by another interval join or by a temporal join.

The chain is a fold: the first interval join (`joins/interval.py`) decides its step as it would
alone, and its emitted rows become the rows of one stream (`IntervalJoin.as_rows`): each source's
columns in a struct named after it, the output event time, and the position at which the row became
known. Each later stream-stream link joins those rows with its own stream exactly as it would join
two sources (lateness by its grace at the rows' positions, matching, closing), and emits rows of the
same form; the enrichment links (`joins/temporal.py`) at the end look them up in tables as they
would a source's rows. Every position is a function of the Delta log, so the chain's rows are the
same live and replayed (docs/semantics.md, "Chains after a stream-stream join").

Table links may also come first (`head`): the stream's rows looked up in tables, each enriched row
at its stream row's position, then one stream-stream link, the chain's last. A table link can keep
a row waiting (its table not yet known up to the row), so the stream-stream link judges each row's
lateness at the row's own position (the clock there travels with it, `CLOCK`), and a right row does
not close while a waiting row on time at that position could still join it (docs/semantics.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import reduce
from typing import TYPE_CHECKING

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from streamjoin import arrival
from streamjoin.arrival import T
from streamjoin.joins.base import (
    CLOCK,
    MATCHED,
    Counters,
    JoinOperator,
    StepInput,
    StepResult,
    tally_by_slice,
)
from streamjoin.joins.temporal import ENRICHMENTS, Enrichment
from streamjoin.links import IntervalLink
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
    stream; then, optionally, enrichment links over what the last one emitted. Or (`head`)
    enrichment links over a stream, then one interval join of their rows with another stream."""

    joins: tuple[IntervalJoin, ...]
    tail: Enrichment | None = None
    head: Enrichment | None = None

    @classmethod
    def of(cls, first: IntervalJoin) -> Chain:
        return cls((first,))

    @classmethod
    def after_enrichment(cls, head: Enrichment, plan: Plan, join: BoundJoin) -> Chain | None:
        """`head`'s enriched rows joined with a stream: keyed, final emission (an eager decision
        would depend on when a table let a row through); None for any other (the job is refused)."""
        from streamjoin.joins.interval import IntervalJoin  # the interval module builds on this one

        if join.spec.type == "cross" or join.link(IntervalLink).emit == "eager":
            return None
        number = head.first + len(head.links)
        link = replace(IntervalJoin.from_plan(join), left=derived(number), left_sources=head.sources())
        return cls((link,), head=head).reaching()

    def then(self, plan: Plan, join: BoundJoin) -> Chain | None:
        """The chain with one more link: a stream-stream link while no table link came before it,
        enrichment links after; None for any other (the job is refused), and for any link after
        the stream-stream link that follows table links."""
        if self.head is not None:
            return None
        if self.tail is not None:
            tail = self.tail.then(plan, join)
            return replace(self, tail=tail) if isinstance(tail, Enrichment) else None
        number = len(self.joins) + 1
        last = self.joins[-1]
        if join.family in ENRICHMENTS:
            return replace(self, tail=Enrichment.over(derived(number), plan, join, first=number)).reaching()
        if join.family == "interval" and join.spec.type != "cross":
            link = last.following(join, derived(number), last.sources())
            return replace(self, joins=(*self.joins, link)).reaching()
        return None

    def reaching(self) -> Chain:
        """Each interval join emitting as far around the slices as the links after it read, and
        the head's table links passing on their stream's rows as far as the first join reads them."""
        joins, reach = list(self.joins), (0, 0)
        if self.tail is not None:
            reach = self.tail.margins(self.tail.stream)
        for k in range(len(joins) - 1, -1, -1):
            joins[k] = replace(joins[k], reach=reach)
            before, after = joins[k].margins(joins[k].left)
            reach = (reach[0] + before, reach[1] + after)
        head = None if self.head is None else replace(self.head, reach=reach)
        return replace(self, joins=tuple(joins), head=head)

    def margins(self, side: str) -> tuple[int, int]:
        """A stream's own link's margins plus what every later link reads around the slices."""
        if self.head is not None and side == self.head.stream:  # its enriched rows are the first join's left
            side = self.joins[0].left
        for k, join in enumerate(self.joins):
            if side == join.right or (k == 0 and side == join.left):
                before, after = join.margins(side)
                return before + join.reach[0], after + join.reach[1]
        return (0, 0) if self.tail is None else self.tail.margins(side)

    def state_fields(self) -> tuple[StructField, ...]:
        """The interval join's; after table links, also each waiting row's clock (`CLOCK`)."""
        fields = self.joins[0].state_fields()
        return fields if self.head is None else (*fields, StructField(CLOCK, LongType()))

    def open_in_state(self) -> Column:
        return ~F.col(MATCHED)

    def derived_state(self, plan: Plan) -> dict[str, StructType]:
        """The rows an earlier link emitted that a later one keeps: a struct of each source's columns."""
        inputs: list[tuple[str, IntervalJoin | Enrichment]] = [
            (join.left, self.joins[k - 1]) for k, join in enumerate(self.joins) if k > 0
        ]
        if self.head is not None:
            inputs.append((self.joins[0].left, self.head))
        if self.tail is not None:
            inputs.append((self.tail.stream, self.joins[-1]))
        return {
            name: StructType([StructField(s, plan.source(s).schema) for s in before.sources()])
            for name, before in inputs
        }

    def step(self, spark: SparkSession, plan: Plan, inputs: StepInput) -> StepResult:
        """The table links of the head, if any; each interval join's step over the rows the link
        before emitted; then the enrichment links over the last one's; the accounting of every
        source and link."""
        state, slices = inputs.state, inputs.slices
        by_slice: list[dict[str, SourceCounts]] = [{} for _ in range(len(slices))]
        links: list[list[LinkCounts]] = [[] for _ in range(len(slices))]
        late: list[DataFrame] = []
        cached: list[DataFrame] = []
        next_state: dict[str, DataFrame] = {}
        rows: DataFrame | None = None  # what the link before emitted, as the rows of one stream
        waiting: list[int] = []  # event times of rows the head's tables keep waiting (`_enrich`)
        if self.head is not None:
            rows, waiting = self._enrich(spark, plan, inputs, by_slice, links, late, cached, next_state)
        for k, join in enumerate(self.joins):
            derived_left = rows is not None
            settled = {join.left: rows if rows is not None else inputs.settled[join.left]}
            settled[join.right] = inputs.settled[join.right]
            own_state = None if state is None else {name: state[name] for name in settled}
            if own_state is not None and self.head is not None:  # the clock only waiting rows carry
                own_state[join.right] = own_state[join.right].drop(CLOCK)
            ran = join.run(
                spark, replace(inputs, settled=settled, state=own_state), persist=True, waiting=waiting
            )
            label = _link_name(self._number(k), join)
            late.append(
                ran.late.withColumn(
                    "source",
                    F.when(F.col("source") == join.left, f"rows at {label}").otherwise(F.col("source")),
                )
                if derived_left
                else ran.late
            )
            cached += ran.cached
            next_state.update(ran.state or {})
            if self.head is not None and ran.state is not None:
                next_state[join.right] = ran.state[join.right].withColumn(CLOCK, F.lit(None).cast("long"))
            emitted = join.tally(ran.emitted, slices)
            carried = (
                {}
                if not derived_left or own_state is None
                else tally_by_slice(
                    own_state[join.left].where(~F.col(MATCHED)), slices.number(F.col(T)), n=F.count(F.lit(1))
                )
            )
            for s, sources in enumerate(ran.by_slice):
                pairs, pads = emitted.get(s, (0, 0))
                by_slice[s].update(
                    {name: c for name, c in sources.items() if not derived_left or name != join.left}
                )
                if not derived_left:
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
        first = self.joins[0]
        if self.tail is not None:
            assert rows is not None
            output = self._look_up(spark, plan, inputs, rows, by_slice, links, late, cached, next_state)
        return StepResult(
            output=output,
            late=reduce(DataFrame.unionByName, late),
            by_slice=by_slice,
            state=next_state if inputs.keep_state else None,
            max_event=inputs.timeline.max_event,
            watermark=None if inputs.timeline.max_event is None else inputs.timeline.max_event - first.grace,
            cached=cached,
            counters=[Counters(links=tuple(own)) for own in links],
        )

    def _number(self, k: int) -> int:
        """The job's number of interval join k (from 0): after the head's table links."""
        return k + 1 + (0 if self.head is None else len(self.head.links))

    def _enrich(
        self,
        spark: SparkSession,
        plan: Plan,
        inputs: StepInput,
        by_slice: list[dict[str, SourceCounts]],
        links: list[list[LinkCounts]],
        late: list[DataFrame],
        cached: list[DataFrame],
        next_state: dict[str, DataFrame],
    ) -> tuple[DataFrame, list[int]]:
        """The head's table links over the stream's settled rows, each given the clock at its
        position (`CLOCK`), and the rows they left waiting (live state); adds their accounting,
        late table changes, cache and state. Returns the enriched rows as one stream, and the event
        times of the waiting rows that would be on time at the stream-stream link (its right rows
        must not close while one of those could still come and join them)."""
        head, first = self.head, self.joins[0]
        assert head is not None
        S = head.stream
        clocks = arrival.per_commit_table(spark, {CLOCK: inputs.timeline.before})
        rows = arrival.with_per_commit(inputs.settled[S], clocks)
        own = None if inputs.state is None else {S: inputs.state[S]}
        ran = head.run(spark, replace(inputs, settled={S: rows}, state=own, keep_state=True))
        assert ran.state is not None  # asked for (keep_state): the rows the tables keep waiting
        for s, counted in enumerate(ran.by_slice):
            by_slice[s].update(counted)
            linked, *rest = ran.links[s]
            links[s] += [replace(linked, open=counted[S].open), *rest]
        late.append(ran.late)
        cached += ran.cached
        next_state[S] = ran.state[S]
        waiting: list[int] = []
        if not inputs.final:
            held = ran.state[S]
            if inputs.mode == "exact":  # a row late at the stream-stream link joins nothing there
                held = held.where(F.col(CLOCK).isNull() | (F.col(T) >= F.col(CLOCK) - F.lit(first.grace)))
            waiting = sorted(r[0] for r in held.select(T).distinct().collect())
        enriched = head.as_rows(plan, ran.emitted).persist()
        cached.append(enriched)
        return enriched, waiting

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
            first, *rest = looked_up.counted(s).links
            first = replace(first, carried_in=carried.get(s, {"n": 0})["n"], open=tables[tail.stream].open)
            links[s] += [first, *rest]
        late.append(looked_up.late)
        cached += looked_up.cached
        next_state.update(looked_up.state or {})
        return looked_up.output


def _link_name(number: int, join: IntervalJoin) -> str:
    """How explain and the metrics name a link: "2. LEFT JOIN payments"."""
    return f"{number}. {join.type.upper()} JOIN {join.right}"
