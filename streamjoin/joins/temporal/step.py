"""Stream-table, temporal and ASOF joins on Spark: each stream row enriched with its table as of its point in time, link by link (the families' declarations: streamjoin/joins/temporal/__init__.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import reduce

from pyspark.sql import Column, DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StructField

from streamjoin import arrival, changelog
from streamjoin.arrival import ALL_TIME, REJECT, SRC, TS, Slices, T, V, watermarks
from streamjoin.changelog import TableInput
from streamjoin.joins.base import (
    CLOCK,
    MATCHED,
    OUT_T,
    Counters,
    Evaluation,
    JoinOperator,
    SideCounts,
    StepInput,
    StepResult,
    tally_by_slice,
)
from streamjoin.joins.chain import Chain
from streamjoin.joins.chaining import Accepts, LinkInput, LinkRun, Upstream, declare
from streamjoin.joins.temporal import ENRICHMENTS, Enriching, looks_back
from streamjoin.metrics import LinkCounts, SourceCounts
from streamjoin.plan import BoundJoin, BoundSource, NamedTime, Plan
from streamjoin.timeutil import to_micros

DECIDED = "_sj_decided"
_NEAREST = "_sj_nearest"
_ROW = "_sj_row"  # a stream row's number within one step
_COMPLETE = "_sj_complete"  # emitted, and matched at every link
_ALIVE = "_sj_alive"  # not dropped by an INNER link
_HELD = "_sj_held"  # an ASOF link over the history cannot answer the row yet


def _reached(link: int) -> str:
    """The flag of rows that reached link `link` (0-based) alive."""
    return f"_sj_reached_{link}"


def _matched(link: int) -> str:
    """The flag of rows that reached link `link` alive and matched there."""
    return f"_sj_matched_{link}"


def _assumed(link: int) -> str:
    """The flag of rows that reached link `link` alive before the earliest time its table can be
    told, looked up in its earliest known state instead (`TableInput.known_from`)."""
    return f"_sj_assumed_{link}"


def _assumed_alive(link: int) -> str:
    """The flag of assumed rows that link `link` passed on (an INNER link drops those without a match)."""
    return f"_sj_assumed_alive_{link}"


@dataclass(frozen=True)
class TemporalJoin:
    """One enrichment link: a stream row (or a row of the chain so far, which carries its stream
    row's time and position) looks up one table's version at its point in time."""

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
    over_history: bool = False  # ASOF among every version of the table (as_of: event_time)
    named_time: NamedTime | None = None  # as_of: <source>.<column>; else the row's event time

    @classmethod
    def from_plan(cls, join: BoundJoin, table: BoundSource, stream: str) -> TemporalJoin:
        spec = join.link(Enriching)
        return cls(
            stream=stream,
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
            over_history=join.family == "asof" and spec.as_of == "event_time",
            named_time=join.named_time,
        )

    @property
    def order(self) -> str:
        """How versions are ordered: by arrival, or by version time (event-time temporal)."""
        return "event_time" if self.variant == "temporal" or self.over_history else "arrival"

    @property
    def by_watermark(self) -> bool:
        """Versions timed by a column, final below the table's watermark (late below it at arrival)."""
        return self.versioned_by_column and (self.variant == "temporal" or self.over_history)

    # ------------------------------------------------------------------ the table

    def versions(self, spark: SparkSession, table: TableInput, mode: str) -> TableVersions:
        """The table's on-time changes as versions, its late changes, and its counts per slice.
        Commit-time versions are never late; neither is anything in complete mode."""
        marks, largest = watermarks(table.commits, None, self.grace)
        if not self.by_watermark or mode == "complete":
            marks = {}
        changes = arrival.with_per_commit(table.changes, arrival.per_commit_table(spark, {arrival.WM: marks}))
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
        known = changelog.known_until(table.newest_ts, table.stream_clock, self.clock_skew)
        known_from = table.known_from if self.order == "event_time" and not self.over_history else None
        return TableVersions(versions, tally, late_rows, self.horizon(known, largest), known_from)

    def horizon(self, known: int | None, largest_version_time: int | None) -> int | None:
        """How far the table's answer is final: the table's watermark (largest version time minus
        grace) for versions from a column, else the commit time its log is known up to."""
        if self.by_watermark:
            return None if largest_version_time is None else largest_version_time - self.grace
        return known

    def decided(self, horizon: int | None) -> Column:
        """The stream row's answer can no longer change (module docstring); an ASOF link over the
        history decides after its lookup (`unsettled`)."""
        if horizon is None:
            return F.lit(False)
        if self.over_history:
            return F.lit(True)
        point = self.point(qualified=False)
        if self.named_time is not None:  # a row without its named time matches nothing: decided as at T
            point = F.coalesce(point, F.col(T))
        if self.by_watermark:
            return point < F.lit(horizon)  # strictly: a change at the watermark is still on time
        return (point if self.variant == "temporal" else F.col(TS)) <= F.lit(horizon)

    def point(self, qualified: bool = True) -> Column:
        """The time (UTC micros) a row looks its version up at: its event time, or the time `as_of`
        names, in the stream's own columns or in its source's struct (a chain's joined rows);
        `qualified` by the stream's alias, as in the lookup."""
        alias = (self.stream,) if qualified else ()
        if self.named_time is None:
            return F.col(".".join(f"`{part}`" for part in (*alias, T)))
        nested = () if self.named_time.source == self.stream else (self.named_time.source,)
        return self.named_time.micros((*alias, *nested))

    def unsettled(self, horizon: int | None) -> Column | None:
        """For an ASOF link over the history, on the looked-up rows: a row or version still to come
        may be nearer. None for every other link (decided before the lookup)."""
        if not self.over_history:
            return None
        assert self.inequality is not None  # every ASOF join has its one inequality
        if horizon is None:  # no version yet: decided() already kept every row back
            return F.lit(True)
        left_col, op, _ = self.inequality
        if looks_back(op):  # nearest preceding: every row still to come lies at or above the watermark
            return ~(F.unix_micros(F.expr(left_col).cast("timestamp")) < F.lit(horizon))
        return ~(self.matched() & (self._col(self.table, T) < F.lit(horizon)))

    # ------------------------------------------------------------------ matching

    def _col(self, side: str, name: str) -> Column:
        return F.col(f"{side}.`{name}`")

    def condition(self, known_from: int | None = None) -> Column:
        """Equal keys, the version valid at the row's point in time (not before `known_from`, the
        earliest time the table can be told at, if given), the residual, and for ASOF the inequality."""
        S, R = self.stream, self.table
        if self.over_history:  # every version, at its own version time
            cond = ~self._col(R, changelog.DELETED)
        else:
            point = self.point() if self.order == "event_time" else self._col(S, TS)
            if known_from is not None:
                point = F.greatest(point, F.lit(known_from))
            cond = changelog.valid_at(point, prefix=f"{R}.")
        for left_col, right_col in self.equi:
            cond = cond & (F.expr(left_col) == F.expr(right_col))
        if self.inequality:
            left_col, op, right_col = self.inequality
            cond = cond & F.expr(f"{left_col} {op} {right_col}")
        if self.residual:
            cond = cond & F.expr(self.residual)
        return cond

    def matched(self) -> Column:
        """A looked-up row found its version (a padded one has none)."""
        return self._col(self.table, TS).isNotNull()

    def lookup(
        self,
        rows: DataFrame,
        versions: DataFrame,
        row_columns: list[Column],
        alive: Column,
        known_from: int | None = None,
    ) -> DataFrame:
        """Each row (columns qualified by source name) with its matching versions, or padded with
        NULLs; rows not `alive` (dropped by an earlier link) match nothing. `row_columns` identify
        a row (ASOF keeps the nearest candidate per row). `known_from`: as in `condition`."""
        joined = rows.join(versions.alias(self.table), self.condition(known_from) & alive, "left_outer")
        return self._nearest(joined, row_columns) if self.inequality else joined

    def _nearest(self, joined: DataFrame, row_columns: list[Column]) -> DataFrame:
        """Per row, keep only its nearest candidate; of candidates with the same value, the latest
        arrival (RisingWave), then, within one commit, the table row's content."""
        R = self.table
        assert self.inequality is not None  # called for ASOF joins only, which have their inequality
        _, op, right_col = self.inequality
        tie = F.to_json(F.struct(*[self._col(R, c) for c in _user_columns(joined, R)]))
        commit, version = self._col(R, TS), self._col(R, V)
        by_row = Window.partitionBy(*row_columns)
        if looks_back(op):
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


@dataclass(frozen=True)
class TableVersions:
    """One link's table in a step: its versions, counts per slice, late changes and horizon."""

    versions: DataFrame
    tally: dict[int, dict[str, int]]
    late: DataFrame
    horizon: int | None
    known_from: int | None = None  # `TableInput.known_from`, for a link that looks up at an event time


@dataclass
class EnrichmentStep:
    """What `Enrichment.run` decided: `StepResult`'s parts, the rows still in joined form."""

    emitted: list[DataFrame]
    late: DataFrame
    by_slice: Sequence[dict[str, SourceCounts]]
    state: dict[str, DataFrame] | None
    watermark: int | None
    cached: list[DataFrame]
    links: list[list[LinkCounts]]


@dataclass(frozen=True)
class Enrichment(JoinOperator):
    """A stream enriched by one table, or by several in the order written (ksqlDB's
    `A JOIN B JOIN C` with B and C tables). Each link looks up its own table at the stream row's
    point in time, and may use the columns of earlier links in its condition. A row is decided
    once every link's table is final for it; an INNER link without a match drops the row, a LEFT
    link pads it. Every emitted row keeps its stream row's event time and position, so the chain
    is a function of the Delta log as a single link is."""

    stream: str
    links: tuple[TemporalJoin, ...]
    number: int = 1  # the job's number of its first link (a chain's links after a stream-stream join)
    # A replay emits rows this far (before, after) around its slices: a chain's stream-stream
    # link after this one reads them there as partners of the rows it owns.
    reach: tuple[int, int] = (0, 0)
    upstream: tuple[str, ...] = ()  # after another link: the sources whose columns its rows hold

    @classmethod
    def build(cls, plan: Plan, join: BoundJoin) -> Enrichment:
        stream = join.left[0]
        return cls(stream, (TemporalJoin.from_plan(join, plan.source(join.right), stream),))

    @classmethod
    def following(cls, plan: Plan, join: BoundJoin, upstream: Upstream) -> Enrichment:
        """The rows an earlier link emitted (`upstream`) looked up by `join`."""
        link = TemporalJoin.from_plan(join, plan.source(join.right), upstream.name)
        return cls(upstream.name, (link,), upstream.number, upstream=upstream.sources)

    def then(self, plan: Plan, join: BoundJoin) -> JoinOperator | None:
        """One more enrichment link, or a `Chain` (ksqlDB's `FROM a JOIN b JOIN c WITHIN ...`, b a
        table); None for what its declaration does not take."""
        return Chain.of(self).then(plan, join)

    # ------------------------------------------------------------------ as a link of a chain

    def family(self) -> str:
        return self.links[-1].variant

    def joins(self) -> int:
        return len(self.links)

    def input(self) -> str:
        return self.stream

    def reads(self) -> tuple[str, ...]:
        return (*(() if self.upstream else (self.stream,)), *(link.table for link in self.links))

    def sources(self) -> tuple[str, ...]:
        """The sources whose columns its emitted rows hold: the stream's, then each link's table."""
        return (*(self.upstream or (self.stream,)), *(link.table for link in self.links))

    def carries(self) -> tuple[StructField, ...]:
        """Over a source, each row's clock at its position (`CLOCK`), for a stream-stream link after it."""
        return () if self.upstream else (StructField(CLOCK, LongType()),)

    def read_margins(self, side: str) -> tuple[int, int] | None:
        """Its stream is read as far as the link after it reads the enriched rows (`reach`)."""
        return self.reach if side == self.stream and not self.upstream else None

    def reaching(self, reach: tuple[int, int]) -> Enrichment:
        return replace(self, reach=reach)

    def absorb(self, plan: Plan, join: BoundJoin) -> Enrichment | None:
        """The chain of tables extended by one more enrichment link."""
        if join.family not in ENRICHMENTS:
            return None
        link = TemporalJoin.from_plan(join, plan.source(join.right), self.stream)
        return replace(self, links=(*self.links, link))

    def run_link(self, spark: SparkSession, plan: Plan, given: LinkInput) -> LinkRun:
        """`run` over the rows the link before emitted, or (first) over its stream's rows, each
        given the clock at its position (`CLOCK`), keeping the rows the tables hold back (`held`)
        for the link after it; counts its stream (first) and its tables, and each table link."""
        inputs, S = given.step, self.stream
        state = None if inputs.state is None else {S: inputs.state[S]}
        if given.rows is None:
            clocks = arrival.per_commit_table(spark, {CLOCK: inputs.timeline.before})
            rows, keep_state = arrival.with_per_commit(inputs.settled[S], clocks), True
            carried: dict[int, dict[str, int]] = {}
        else:
            rows, keep_state = given.rows, inputs.keep_state
            carried = (
                {}
                if state is None
                else tally_by_slice(state[S], inputs.slices.number(F.col(T)), n=F.count(F.lit(1)))
            )
        ran = self.run(spark, inputs.with_rows({S: rows}, state=state, keep_state=keep_state))
        sources, links = [], []
        for s, counted in enumerate(ran.by_slice):
            sources.append({name: c for name, c in counted.items() if given.rows is None or name != S})
            first, *rest = ran.links[s]
            links.append(
                [replace(first, carried_in=carried.get(s, {"n": 0})["n"], open=counted[S].open), *rest]
            )
        held = None if inputs.final or given.rows is not None or ran.state is None else ran.state[S]
        return LinkRun(ran.emitted, ran.late, sources, links, ran.state, ran.cached, held=held)

    def as_rows(
        self, spark: SparkSession, plan: Plan, emitted: list[DataFrame], inputs: StepInput
    ) -> DataFrame:
        """Emitted rows (`run`'s joined form) as the rows of one stream, for a chain's next link:
        each source's columns in a struct named after it, and the stream row's event time,
        position and clock (`CLOCK`): an enriched row is known at its stream row's position."""
        S = self.stream
        sources = [
            F.struct(*[self._col(S, c).alias(c) for c in plan.source(S).schema.fieldNames()]).alias(S),
            *[
                F.struct(
                    *[self._col(link.table, c).alias(c) for c in plan.source(link.table).schema.fieldNames()]
                ).alias(link.table)
                for link in self.links
            ],
        ]
        own = [self._col(S, c).alias(c) for c in (T, TS, SRC, V, CLOCK)]
        return reduce(DataFrame.unionByName, [part.select(*sources, *own) for part in emitted])

    def output(self, plan: Plan, emitted: list[DataFrame]) -> DataFrame:
        """Emitted rows (`run`'s joined form) as output rows: `where`, `select`, the output time."""
        return reduce(DataFrame.unionByName, [plan.project(part, F.col(OUT_T)) for part in emitted])

    def state_fields(self) -> tuple[StructField, ...]:
        """The interval family's shape: undecided stream rows, never matched."""
        return (StructField(MATCHED, BooleanType()),)

    def open_in_state(self) -> Column:
        return ~F.col(MATCHED)

    def step(self, spark: SparkSession, plan: Plan, inputs: StepInput) -> StepResult:
        """Stream rows against each link's table versions: table lateness, versions, the lookups,
        accounting. Stream rows are never late in these joins; a table's changes are, when their
        version time is below the table's watermark at their arrival (exact mode)."""
        ran = self.run(spark, inputs)
        return StepResult(
            output=self.output(plan, ran.emitted),
            late=ran.late,
            by_slice=ran.by_slice,
            state=ran.state,
            max_event=None,
            watermark=ran.watermark,
            cached=ran.cached,
            counters=[Counters(links=tuple(own)) for own in ran.links],
        )

    def run(self, spark: SparkSession, inputs: StepInput) -> EnrichmentStep:
        """`step` up to the rows it emits, in joined form (aliased by source name, with OUT_T)."""
        tables = [link.versions(spark, inputs.tables[link.table], inputs.mode) for link in self.links]
        rows = inputs.settled[self.stream]
        if inputs.state is not None:  # the live runner's undecided rows
            rows = (
                inputs.state[self.stream]
                .drop(MATCHED)
                .unionByName(rows.drop(REJECT) if REJECT in rows.columns else rows)
            )
        is_decided = (
            F.lit(True)
            if inputs.final
            else reduce(
                Column.__and__, [link.decided(t.horizon) for link, t in zip(self.links, tables, strict=True)]
            )
        )
        unsettled = [
            None if inputs.final else link.unsettled(t.horizon)
            for link, t in zip(self.links, tables, strict=True)
        ]
        evaluation = self.evaluate(
            rows,
            [t.versions for t in tables],
            is_decided,
            slices=inputs.slices,
            keep_state=inputs.keep_state,
            unsettled=unsettled,
            known_from=[t.known_from for t in tables],
        )
        by_slice = []
        for k, sides in enumerate(evaluation.counts):
            decided = sides[self.stream]
            counts = {
                self.stream: SourceCounts(
                    joined=decided.joined,
                    unmatched_emitted=decided.unmatched_emitted,
                    unmatched_dropped=decided.unmatched_dropped,
                    open=decided.open,
                )
            }
            for link, table in zip(self.links, tables, strict=True):
                counts[link.table] = SourceCounts(**table.tally.get(k, {"late": 0, "applied": 0}))
            by_slice.append(counts)
        next_state = None
        if evaluation.state is not None:  # the same shape as interval state: undecided rows are never matched
            next_state = {
                name: rows.withColumn(MATCHED, F.lit(False)) for name, rows in evaluation.state.items()
            }
        horizons = [t.horizon for t in tables]
        return EnrichmentStep(
            emitted=evaluation.emitted,
            late=reduce(DataFrame.unionByName, [t.late for t in tables]),
            by_slice=by_slice,
            state=next_state,
            watermark=None if None in horizons else min(h for h in horizons if h is not None),
            cached=evaluation.cached,
            links=evaluation.links,
        )

    def evaluate(
        self,
        rows: DataFrame,
        versions: list[DataFrame],
        decided: Column,
        slices: Slices = ALL_TIME,
        keep_state: bool = False,
        unsettled: list[Column | None] | None = None,
        known_from: list[int | None] | None = None,
    ) -> Evaluation:
        """Look the decided stream rows up in each link's `versions` in turn; keep the rest (live state).

        `unsettled[n]`, on link n's lookup result, holds back a row that link cannot answer yet (an
        ASOF link over the history): the row then stays undecided, as if `decided` had said so.
        `known_from[n]`: the earliest time link n's table can be told at; a row looked up before it
        is looked up at it and counted as assumed there, neither matched nor padded nor dropped.

        With replay `slices`, only rows whose event time lies in them (or within `reach` around
        them) are emitted, and each stream row in them is counted once, in the slice of its event
        time: joined when one of its output rows matched at every link, unmatched_emitted when all
        of them were padded somewhere, unmatched_dropped when an INNER link left it without output.
        """
        S = self.stream
        marked = rows.withColumn(DECIDED, decided)
        # With a row number that survives the lookups, to count stream rows rather than output rows.
        ready = marked.where(F.col(DECIDED) & slices.inside(F.col(T), self.reach)).select(
            *(F.col(f"`{c}`") for c in rows.columns), F.monotonically_increasing_id().alias(_ROW)
        )
        waits = unsettled or [None] * len(self.links)
        knowns = known_from or [None] * len(self.links)
        joined = self._looked_up(ready, versions, waits, knowns)
        # Persisted: the counts below and the runner's write read the lookups once, not twice.
        joined = joined.persist()
        emitted = joined.where(~F.col(_HELD) & F.col(_ALIVE))  # _HELD stays false unless a link waits
        assuming = any(known is not None for known in knowns)
        counts, links = self._counted(marked, joined, slices, assuming)
        state = None
        if keep_state:
            undecided = marked.where(~F.col(DECIDED)).drop(DECIDED)
            if any(w is not None for w in waits):
                waiting = joined.where(F.col(_HELD)).select(
                    *[self._col(S, c) for c in rows.columns], F.col(_ROW)
                )
                undecided = undecided.unionByName(waiting.dropDuplicates([_ROW]).drop(_ROW))
            state = {S: undecided}
        return Evaluation([emitted], counts, state, cached=[joined], links=links)

    def _looked_up(
        self,
        ready: DataFrame,
        versions: list[DataFrame],
        waits: list[Column | None],
        knowns: list[int | None],
    ) -> DataFrame:
        """The decided rows (`ready`) looked up at each link in turn, with the flags the counts
        read: reached, matched (and assumed) per link, alive, held (`evaluate`), OUT_T, complete."""
        S = self.stream
        identity = [self._col(S, _ROW)]
        # Rows an INNER link finds no match for stay, not alive (no later link matches them), so
        # that one pass over the result counts what every link did.
        joined = ready.withColumns({_ALIVE: F.lit(True), _HELD: F.lit(False)}).alias(S)
        complete = F.lit(True)
        # Only a backfill run with --assume-earliest-known counts assumed rows; other runs carry no
        # flag for them, and every such count is 0.
        assuming = any(known is not None for known in knowns)
        for n, (link, table, wait, known) in enumerate(zip(self.links, versions, waits, knowns, strict=True)):
            flags_in = {_reached(n): F.col(_ALIVE)}
            if assuming:
                before_known = (
                    F.lit(False) if known is None else F.coalesce(link.point() < F.lit(known), F.lit(False))
                )
                flags_in[_assumed(n)] = F.col(_ALIVE) & before_known
            joined = link.lookup(joined.withColumns(flags_in), table, identity, F.col(_ALIVE), known)
            identity += [F.col(f"{link.table}.`{c}`") for c in table.columns]
            matched = F.col(_ALIVE) & link.matched()
            updates = {_matched(n): matched & ~F.col(_assumed(n)) if assuming else matched}
            if wait is not None:
                updates[_HELD] = F.col(_HELD) | (F.col(_reached(n)) & wait)
            if link.type == "inner":
                updates[_ALIVE] = matched
            joined = joined.withColumns(updates)
            if assuming:
                joined = joined.withColumn(_assumed_alive(n), F.col(_assumed(n)) & F.col(_ALIVE))
            complete = complete & link.matched()
        if any(w is not None for w in waits):  # a row held at one of its output rows is held at all
            joined = joined.withColumn(
                _HELD, F.max(F.col(_HELD).cast("int")).over(Window.partitionBy(_ROW)) == 1
            )
        return joined.withColumns({OUT_T: self._col(S, T), _COMPLETE: F.col(_ALIVE) & complete})

    def _counted(
        self, marked: DataFrame, joined: DataFrame, slices: Slices, assuming: bool
    ) -> tuple[list[dict[str, SideCounts]], list[list[LinkCounts]]]:
        """Per slice, the stream's `SideCounts` and each link's `LinkCounts`: one Spark job counts
        the stream rows decided and open before the lookups, and of the decided ones (by their
        row number) those held back, and what the rest did at each link."""
        per_link = (_reached, _matched, _assumed, _assumed_alive) if assuming else (_reached, _matched)
        flags = [_ALIVE, _COMPLETE] + [f(n) for n in range(len(self.links)) for f in per_link]
        before, looked_up = self._tallied(marked, joined, slices, flags)
        counts, links = [], []
        for k in range(len(slices)):
            decided_rows, open_rows = (before[k]["decided"], before[k]["open"]) if k in before else (0, 0)
            summed = looked_up.get(k) or dict.fromkeys(["held", *flags], 0)
            waiting_rows = summed["held"]  # decided before the lookups, held back by one
            decided_rows, open_rows = decided_rows - waiting_rows, open_rows + waiting_rows
            out_rows, complete_rows = summed[_ALIVE], summed[_COMPLETE]
            counts.append(
                {
                    self.stream: SideCounts(
                        joined=complete_rows,
                        unmatched_emitted=out_rows - complete_rows,
                        unmatched_dropped=decided_rows - out_rows,
                        open=open_rows,
                    )
                }
            )
            links.append(
                [
                    self._link_counts(
                        n,
                        summed[_reached(n)],
                        summed[_matched(n)],
                        *((summed[_assumed(n)], summed[_assumed_alive(n)]) if assuming else ()),
                    )
                    for n in range(len(self.links))
                ]
            )
        return counts, links

    def _tallied(
        self, marked: DataFrame, joined: DataFrame, slices: Slices, flags: list[str]
    ) -> tuple[dict[int, Row], dict[int, Row]]:
        """By slice: the rows decided and open before the lookups; and the rows held back, and the
        sum of each of `flags` over the rows not held (a row counts once, by its number)."""
        per_row = joined.groupBy(slices.number(F.col(OUT_T)).alias("slice"), F.col(_ROW)).agg(
            *[F.max(F.col(flag).cast("int")).alias(flag) for flag in (_HELD, *flags)]
        )
        answered = F.col(_HELD) == 0  # a row held at one of its output rows is held at all
        looked_up = per_row.groupBy("slice").agg(
            F.sum(_HELD).alias("held"),
            *[F.sum(F.when(answered, F.col(flag)).otherwise(0)).alias(flag) for flag in flags],
        )
        before = marked.groupBy(slices.number(F.col(T)).alias("slice")).agg(
            F.count(F.when(F.col(DECIDED), 1)).alias("decided"),
            F.count(F.when(~F.col(DECIDED), 1)).alias("open"),
        )
        stats: dict[int, Row] = {}  # by slice: counts before the lookups
        by_slice: dict[int, Row] = {}  # by slice: counts of the lookups
        for r in (
            before.withColumn("_sj_part", F.lit(0))
            .unionByName(looked_up.withColumn("_sj_part", F.lit(1)), allowMissingColumns=True)
            .collect()
        ):
            (by_slice if r["_sj_part"] else stats)[r["slice"]] = r
        return stats, by_slice

    def _link_counts(
        self, n: int, reached: int, matched: int, assumed: int = 0, assumed_alive: int = 0
    ) -> LinkCounts:
        """Link n's counts; its assumed rows (`evaluate`'s `known_from`) count apart, and those it
        passed on are what it emits besides its matched and padded rows."""
        link = self.links[n]
        unmatched = reached - matched - assumed
        padded = unmatched if link.type == "left" else 0
        return LinkCounts(
            f"{self.number + n}. {link.type.upper()} JOIN {link.table}",
            reached=reached,
            matched=matched,
            padded=padded,
            dropped=unmatched if link.type == "inner" else 0,
            emitted=matched + padded + assumed_alive if assumed else None,
            assumed=assumed,
        )

    def _col(self, side: str, name: str) -> Column:
        return F.col(f"{side}.`{name}`")


def _user_columns(joined: DataFrame, alias: str) -> list[str]:
    """The table's user columns in a joined frame (by the table's alias)."""
    return [f.name for f in joined.select(f"{alias}.*").schema.fields if not f.name.startswith("_sj_")]


declare(
    *ENRICHMENTS,
    accepts=(
        Accepts(ENRICHMENTS),
        Accepts(
            ("interval",),
            when="keyed, with final emission",
            allows=lambda join: join.spec.type != "cross" and join.spec.settings().get("emit") != "eager",
            at_start=True,
            last=True,
        ),
    ),
    after=Enrichment.following,
)
