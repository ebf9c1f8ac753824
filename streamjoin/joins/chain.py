"""Chains: ksqlDB's `FROM A JOIN B WITHIN ... JOIN C WITHIN ...`, `... JOIN C` with C a table, and
`FROM A JOIN B JOIN C WITHIN ...` with B a table; Flink's interval join followed by another interval
join or by a temporal join.

A chain is a fold over links (`joins/chaining.py`). The first link decides its part of the step as it
would alone, over sources; the rows it emits become the rows of one stream (`ChainLink.as_rows`): each
source's columns in a struct named after it, the output event time, and the position at which the
row became known. Each later link takes those rows as it would a source's, and emits rows of the
same form; the last link's rows are the output. Every position is a function of the Delta log, so
the chain's rows are the same live and replayed (docs/semantics.md, "Chains after a stream-stream
join"). Which link may follow which is what each family declares (`chaining.declare`); this module
names no family.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from streamjoin.joins.base import Counters, JoinOperator, StepInput, StepResult
from streamjoin.joins.chaining import ChainLink, LinkInput, LinkRun, Upstream, accepted, derived, later_link
from streamjoin.metrics import LinkCounts, SourceCounts
from streamjoin.plan import BoundJoin, Plan


@dataclass(frozen=True)
class Chain(JoinOperator):
    """Links in turn, each after the first taking the rows the one before emitted. `ended`: the
    last link's declaration said nothing may follow it."""

    links: tuple[ChainLink, ...]
    ended: bool = False

    @classmethod
    def of(cls, first: ChainLink) -> Chain:
        return cls((first,))

    def then(self, plan: Plan, join: BoundJoin) -> JoinOperator | None:
        """The chain with `join` decided by its last link (`ChainLink.absorb`) or as one more link, if
        the last link's family declares it takes `join` (`chaining.accepted`); None otherwise (the
        job is refused). A chain of one link is that link."""
        last = self.links[-1]
        rule = None if self.ended else accepted(last.family(), join, at_start=len(self.links) == 1)
        if rule is None:
            return None
        grown = last.absorb(plan, join)
        if grown is not None:
            chain = replace(self, links=(*self.links[:-1], grown))
        else:
            number = last.number + last.joins()
            link = later_link(plan, join, Upstream(derived(number), last.sources(), number))
            if link is None:
                return None
            chain = replace(self, links=(*self.links, link), ended=rule.last)
        return chain.reaching() if len(chain.links) > 1 else chain.links[0]

    def reaching(self) -> Chain:
        """Each link emitting as far around the slices as the links after it read its rows: the
        sum of their margins for their input."""
        links, reach = list(self.links), (0, 0)
        for k in range(len(links) - 1, -1, -1):
            links[k] = links[k].reaching(reach)
            before, after = links[k].margins(links[k].input())
            reach = (reach[0] + before, reach[1] + after)
        return replace(self, links=tuple(links))

    def margins(self, side: str) -> tuple[int, int]:
        """A stream's margins at the link that reads it, plus what the links after it read around
        the slices."""
        for link in self.links:
            around = link.read_margins(side)
            if around is not None:
                return around
        return 0, 0

    def state_fields(self) -> tuple[StructField, ...]:
        """The first link's, and the columns any link's rows carry (`ChainLink.carries`)."""
        fields: dict[str, StructField] = {}
        for f in (*self.links[0].state_fields(), *(f for link in self.links for f in link.carries())):
            fields.setdefault(f.name, f)
        return tuple(fields.values())

    def open_in_state(self) -> Column:
        return self.links[0].open_in_state()

    def derived_state(self, plan: Plan) -> dict[str, StructType]:
        """The rows an earlier link emitted that a later one keeps: a struct of each source's columns."""
        return {
            link.input(): StructType([StructField(s, plan.source(s).schema) for s in before.sources()])
            for before, link in zip(self.links, self.links[1:], strict=False)
        }

    def step(self, spark: SparkSession, plan: Plan, inputs: StepInput) -> StepResult:
        """Each link over the rows the link before emitted (the first over sources), the last
        link's rows projected; the accounting of every source and link."""
        total = _Total.of(len(inputs.slices), self.state_fields())
        given = LinkInput(inputs)
        output: DataFrame | None = None
        for k, link in enumerate(self.links):
            ran = link.run_link(spark, plan, given)
            total.add(ran)
            if k + 1 < len(self.links):
                rows = link.as_rows(spark, plan, ran.emitted, inputs).persist()
                total.cached.append(rows)
                given = LinkInput(inputs, rows, ran.held)
            else:
                output = link.output(plan, ran.emitted)
        assert output is not None  # a chain has links
        return StepResult(
            output=output,
            late=reduce(DataFrame.unionByName, total.late),
            by_slice=total.by_slice,
            state=total.state if inputs.keep_state else None,
            max_event=inputs.timeline.max_event,
            watermark=total.watermark,
            cached=total.cached,
            counters=[Counters(links=tuple(own)) for own in total.links],
        )


@dataclass
class _Total:
    """What a chain's links decided in one step, added up link by link."""

    by_slice: list[dict[str, SourceCounts]]
    links: list[list[LinkCounts]]
    fields: tuple[StructField, ...]  # every state row carries these (`Chain.state_fields`)
    late: list[DataFrame] = field(default_factory=list)
    cached: list[DataFrame] = field(default_factory=list)
    state: dict[str, DataFrame] = field(default_factory=dict)
    watermark: int | None = None

    @classmethod
    def of(cls, slices: int, fields: tuple[StructField, ...]) -> _Total:
        return cls([{} for _ in range(slices)], [[] for _ in range(slices)], fields)

    def add(self, ran: LinkRun) -> None:
        """One link's counts, late rows, cache and state (each state row given the chain's fields
        it lacks, NULL); the chain's watermark is its first link's that judges lateness."""
        for s, (sources, links) in enumerate(zip(ran.sources, ran.links, strict=True)):
            self.by_slice[s].update(sources)
            self.links[s] += links
        self.late.append(ran.late)
        self.cached += ran.cached
        for name, rows in (ran.state or {}).items():
            missing = {
                f.name: F.lit(None).cast(f.dataType) for f in self.fields if f.name not in rows.columns
            }
            self.state[name] = rows.withColumns(missing) if missing else rows
        if self.watermark is None:
            self.watermark = ran.watermark
