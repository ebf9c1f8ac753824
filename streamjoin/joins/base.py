"""The join-operator interface: what a join family implements and the runners call.

A family's step module holds one operator class. Built from a bound plan (`build`), it tells a replay
how far around a slice each source must be read (`margins`) and decides one step
(`step`): given the settled rows of the step, its timeline, what an earlier step left (live
state) and what is known of the table sources, it returns what to write and how every input row
was accounted for (`StepResult`). A family registers its builder as the `operator` of its
`family.Family` (streamjoin/family.py); `streamjoin.kernel.family` looks it up, so adding a family
is one package (docs/architecture.md, "A family is a plug-in").
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from functools import reduce
from typing import Generic, Protocol, TypeVar

from py4j.protocol import Py4JError
from pyspark.sql import Column, DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from streamjoin.arrival import ALL_TIME, Slices, Timeline
from streamjoin.changelog import TableInput
from streamjoin.metrics import LinkCounts, SourceCounts
from streamjoin.plan import BoundJoin, Plan
from streamjoin.timeutil import END_OF_INPUT as END_OF_INPUT

MATCHED = "_sj_matched"  # a kept row found a partner in an earlier step (state rows of every family)
OUT_T = "_sj_out_t"  # an emitted row's event time, UTC microseconds
# A chain's stream row that a table link may keep waiting: the largest accepted event time before
# its position (the job's clock there), so that a later stream-stream link judges it late or on
# time as at its arrival, whichever live step hands it on.
CLOCK = "_sj_clock"


@dataclass(frozen=True)
class SideCounts:
    """What became of one input's on-time rows in one step."""

    joined: int = 0
    unmatched_emitted: int = 0
    unmatched_dropped: int = 0
    open: int = 0


@dataclass
class Evaluation:
    """The rows a step emits (in joined form, aliased by source name) and what they account for."""

    emitted: list[DataFrame]
    counts: Sequence[dict[str, SideCounts]]  # per slice of the step, by input (maybe `Deferred`)
    state: dict[str, DataFrame] | None
    cached: list[DataFrame] = field(default_factory=list)  # persisted here; unpersist after writing
    links: list[list[LinkCounts]] = field(default_factory=list)  # chains: per slice, per link


@dataclass(frozen=True)
class Counters:
    """What an operator counts in one slice beyond its sources' buckets, stored with that slice's
    (or micro-batch's) metrics row by `streamjoin.accounting.account`: per link of a chain, and
    named totals, each one its family declares (`family.Total`), kept in `RunMetrics.totals` and
    the metrics table's column of its name."""

    links: tuple[LinkCounts, ...] = ()
    totals: dict[str, int] = field(default_factory=dict)


class Write(enum.StrEnum):
    """How a runner writes a table a step asks for (`TableWrite`), beside its output and side tables."""

    APPEND = "append"  # appended with the step's other writes, exactly once, before the output
    REPLACE = "replace"  # the output's rows replaced by these (a keyed result as of the step)
    MERGE = "merge"  # each key's latest change applied to the output (MERGE by `KeyedOutput.key`)


@dataclass(frozen=True)
class TableWrite:
    """A write a step asks its runner to make with the step's own, exactly once with them: rows
    appended to a table the operator keeps (`location`, e.g. a lookup join's journal, written
    before the output so that a step run again finds them), or the output itself replaced or
    merged into (`location` None: whichever output the runner writes; `keyed` says how to MERGE)."""

    rows: DataFrame
    how: Write = Write.APPEND
    location: str | None = None
    keyed: KeyedOutput | None = None


Marks = dict[str, int]  # small values an operator keeps between live steps (`StepInput.marks`)


@dataclass(frozen=True)
class StepInput:
    """What a runner hands an operator for one step.

    `sources`: every source's input by name: a stream's accepted, settled rows (a DataFrame), a
    table's changelog and what is known of it (`TableInput`). `timeline`: the largest accepted
    event time before each settled commit and after all of them (from the live runner's batches,
    or the arrival index in a replay). `state`: the rows an earlier step left open (live runner
    only), and `marks` what else it kept (`StepResult.marks`). `slices`: a replay's slices; only
    rows inside them are emitted, each accounted for apart (the default, one slice of every time,
    is a live micro-batch's). `keep_state`: a live step, whose state the runner keeps for the
    next. `final`: the input has ended (a replay of a closed history): every window closes, every
    stream row is decided, every table change settled.
    """

    sources: Mapping[str, DataFrame | TableInput]
    timeline: Timeline
    mode: str
    state: dict[str, DataFrame] | None = None
    slices: Slices = ALL_TIME
    keep_state: bool = False
    marks: Marks = field(default_factory=dict)
    final: bool = False

    @property
    def settled(self) -> dict[str, DataFrame]:
        """The stream sources' settled rows, by name."""
        return {name: rows for name, rows in self.sources.items() if isinstance(rows, DataFrame)}

    @property
    def tables(self) -> dict[str, TableInput]:
        """The table sources' inputs, by name."""
        return {name: table for name, table in self.sources.items() if isinstance(table, TableInput)}

    def with_rows(self, settled: dict[str, DataFrame], **changes) -> StepInput:
        """The input with `settled` as its stream rows (the tables kept), and other `changes`."""
        return replace(self, sources={**self.tables, **settled}, **changes)


@dataclass
class StepResult:
    """What one step emits, what it asks its runner to write and keep, and how its rows were
    accounted for.

    `output`: the rows of the output (for a keyed result, `JoinOperator.keyed_output`: its
    changes, written to `<output>_changes`). `late`: late rows, in the side table's form.
    `by_slice`: per slice of the step (`Slices`), what became of each source's rows. `state` and
    `marks`: what the live runner keeps for the next step (None, {}: nothing). `writes`: more
    tables to write with the step's own (`TableWrite`). `counters`: per slice, what the operator
    counts beside its sources (`Counters`). `cached`: frames the step persisted, unpersisted by
    the runner once it has written."""

    output: DataFrame
    late: DataFrame
    by_slice: Sequence[dict[str, SourceCounts]]
    state: dict[str, DataFrame] | None
    max_event: int | None
    watermark: int | None = None
    marks: Marks = field(default_factory=dict)
    writes: list[TableWrite] = field(default_factory=list)
    counters: Sequence[Counters] = ()
    cached: list[DataFrame] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, SourceCounts]:
        """The counts of a step over one slice (a live micro-batch, or a one-slice replay)."""
        (only,) = self.by_slice
        return only

    def counted(self, k: int) -> Counters:
        """Slice `k`'s counters (none counted: empty)."""
        return self.counters[k] if self.counters else Counters()

    def total(self, name: str) -> int:
        """The named counter summed over the step's slices."""
        return sum(c.totals.get(name, 0) for c in self.counters)


@dataclass(frozen=True)
class KeyedOutput:
    """Emitted rows that are changes to a keyed result (table-table joins). The runners append
    them to `<output>_changes`; the output table is the result itself, replaced or merged into as
    the step asks (`TableWrite`: a replay's result as of its versions, each key's latest change live)."""

    key: str  # the result key column
    op: str  # the column saying `upsert` or `delete`
    order: tuple[str, ...]  # columns ordering one key's changes, the latest last
    bookkeeping: tuple[str, ...] = ()  # columns of a change the result table does not have

    def latest(self, changes: DataFrame) -> DataFrame:
        """Each key's latest change, in the result's columns plus `op`."""
        by_key = Window.partitionBy(self.key).orderBy(*[F.col(c).desc() for c in self.order])
        newest = changes.withColumn("_sj_n", F.row_number().over(by_key)).where(F.col("_sj_n") == 1)
        return newest.drop("_sj_n", *self.bookkeeping)

    def count(self, changes: DataFrame) -> dict[str, int]:
        """How many `upsert` and `delete` changes (absent ops count 0)."""
        grouped = changes.groupBy(self.op).agg(F.count(F.lit(1)).alias("n")).collect()
        counted = {r[self.op]: r["n"] for r in grouped}
        return {op: counted.get(op, 0) for op in ("upsert", "delete")}


class JoinOperator(Protocol):
    """One join of a job, as its family decides it. Families subclass it for the defaults: a
    family without stream margins, state of its own or a keyed result keeps them."""

    def margins(self, side: str) -> tuple[int, int]:
        """How far (micros) before a slice's start and after its end `side`'s rows must be read."""
        return 0, 0

    def step(self, spark: SparkSession, plan: Plan, inputs: StepInput) -> StepResult:
        """Decide one step: lateness, the join, what is emitted, and the accounting per slice."""
        ...

    def then(self, plan: Plan, join: BoundJoin) -> JoinOperator | None:
        """This operator's output joined with the next link of the chain, as one operator; None
        while the family cannot take that link (`streamjoin.kernel.family` refuses the job)."""
        return None

    def reads_rows_once(self) -> bool:
        """The pass that writes its output reads each settled stream row once (an equi join):
        the runners then count the rows read in that pass (`SliceCounts`). A nested-loop join
        reads a side more than once, and Spark would count those rows as often."""
        return False

    def keyed_output(self, plan: Plan) -> KeyedOutput | None:
        """How emitted rows change a keyed result; None: they are rows of the output, appended."""
        return None

    def state_fields(self) -> tuple[StructField, ...]:
        """The operator's own columns on the state rows it keeps between live steps (beside the
        source's columns and the arrival columns)."""
        return ()

    def open_in_state(self) -> Column:
        """Which of its state rows are still undecided (counted `open`)."""
        return F.lit(True)

    def derived_state(self, plan: Plan) -> dict[str, StructType]:
        """Rows it keeps between live steps that are not a stream source's own (a chain's joined
        rows waiting for a later link): by name, the schema of their columns beside the arrival
        columns and `state_fields`. The state and its `StepInput.state` hold them by that name."""
        return {}


def preserves(join_type: str, side: str, left: str, right: str) -> bool:
    """A join of `join_type` between streams `left` and `right` writes `side`'s rows that find no
    partner, padded (FULL both, LEFT the left, RIGHT the right)."""
    return (
        join_type == "full"
        or (join_type == "left" and side == left)
        or (join_type == "right" and side == right)
    )


def tally_by_slice(rows: DataFrame, owner: Column, **aggregates: Column) -> dict[int, dict[str, int]]:
    """`aggregates` over the rows each slice owns, by slice number (rows without an owner are not
    counted); a slice that owns no row is absent."""
    return tally_parts({"": (rows, owner)}, **aggregates)[""]


def tally_parts(
    parts: dict[str, tuple[DataFrame, Column]], **aggregates: Column
) -> dict[str, dict[int, dict[str, int]]]:
    """`tally_by_slice` of several frames, by name (each with its owner column), in one Spark job."""
    grouped = reduce(
        DataFrame.unionByName,
        [
            rows.where(owner.isNotNull())
            .groupBy(owner.alias("_sj_slice"))
            .agg(*[column.alias(name) for name, column in aggregates.items()])
            .withColumn("_sj_part", F.lit(part))
            for part, (rows, owner) in parts.items()
        ],
    )
    tallied: dict[str, dict[int, dict[str, int]]] = {part: {} for part in parts}
    for r in grouped.collect():
        tallied[r["_sj_part"]][r["_sj_slice"]] = {name: r[name] for name in aggregates}
    return tallied


def kept_row(kept: str, columns: Sequence[str], paired: Column) -> list[Column]:
    """A state row's `columns` from the struct column `kept` (an aggregate's copy of the row), with
    MATCHED also true when `paired` (it found a partner in this step): one projection."""
    return [
        (F.col(f"{kept}.{MATCHED}") | paired).alias(MATCHED) if c == MATCHED else F.col(f"{kept}.`{c}`")
        for c in columns
    ]


Item = TypeVar("Item")


class Deferred(Sequence[Item], Generic[Item]):
    """A list computed on first use. A step's counts are observed in the pass that writes its rows
    (`SliceCounts`), which runs after the step returns: a runner reads them after writing."""

    def __init__(self, compute: Callable[[], list[Item]]) -> None:
        self._compute: Callable[[], list[Item]] | None = compute
        self._items: list[Item] = []

    def _get(self) -> list[Item]:
        if self._compute is not None:
            self._items, self._compute = self._compute(), None
        return self._items

    def __getitem__(self, index):
        return self._get()[index]

    def __len__(self) -> int:
        return len(self._get())

    def __iter__(self) -> Iterator[Item]:
        return iter(self._get())

    def __eq__(self, other: object) -> bool:
        return self._get() == (list(other) if isinstance(other, Sequence) else other)

    def __repr__(self) -> str:
        return f"Deferred({self._get()!r})"


@dataclass
class _Pass:
    """The Spark job tag of one counted pass, and the jobs of it already found to have run each
    stage once (a finished job's stages never run again, so each is asked about only once)."""

    tag: str
    clean: set[int] = field(default_factory=set)


_PASS: ContextVar[_Pass | None] = ContextVar("streamjoin_pass", default=None)


@contextmanager
def counted_pass(spark: SparkSession) -> Iterator[None]:
    """Tag the Spark jobs of one step and its writes (a replay, a live micro-batch), so that the
    `SliceCounts` made in it can tell whether Spark re-ran part of the pass that counted them."""
    tag = f"streamjoin-{uuid.uuid4().hex}"
    spark.sparkContext.addJobTag(tag)
    token = _PASS.set(_Pass(tag))
    try:
        yield
    finally:
        _PASS.reset(token)
        spark.sparkContext.removeJobTag(tag)


def _rerun(spark: SparkSession, counted: _Pass) -> bool:
    """A stage of a job of the pass ran more than once (a retry after a lost executor's shuffle
    output, say), or Spark no longer knows the job: observed counts may hold some rows twice."""
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    for job in tracker.getJobIdsForTag(counted.tag):
        if job in counted.clean:
            continue
        known = tracker.getJobInfo(job)
        if known.isEmpty():
            return True
        info = known.get()
        for stage in info.stageIds():
            attempt = tracker.getStageInfo(stage)  # empty: skipped (its shuffle output reused)
            if attempt.isDefined() and attempt.get().currentAttemptId() > 0:
                return True
        if info.status().toString() == "SUCCEEDED":
            counted.clean.add(job)
    return False


class SliceCounts:
    """How many rows of `frame` meet each named condition, per slice, counted in whichever pass
    over them runs first: the frame to go on with is `rows`, which carries a Spark observation, so
    the counts of rows that are written anyway cost no pass of their own.

    `counts[name]` is (the slice number of a row, NULL outside every slice; the condition).
    `observed=False` where the plan may read `rows` more than once in one pass (a nested-loop
    join, eager pads): Spark would count those rows as often. `get` reads the observation once a
    pass over `rows` ran. Before that, when Spark pruned the observed plan (one it proved empty),
    re-ran a stage of the pass (within `counted_pass`) or may run tasks twice (speculation), or
    with more counts than an observation should carry (a backfill of many slices), it counts with
    an aggregate of its own: the same numbers, one pass more. Only a pass that reads every row may
    come first (a write, a count, a persist's materialization; never `first()` or `limit`)."""

    MAX_OBSERVED = 512

    def __init__(
        self, frame: DataFrame, slices: int, /, observed: bool = True, **counts: tuple[Column, Column]
    ) -> None:
        owners: dict[str, str] = {}  # a slice-number expression -> the column holding it
        numbered = frame
        conditions = {}
        for name, (owner, condition) in counts.items():
            column = owners.get(str(owner))
            if column is None:
                column = owners[str(owner)] = f"_sj_slice{len(owners)}"
                numbered = numbered.withColumn(column, owner)
            conditions[name] = (column, condition)
        self._slices = slices
        self._numbered = numbered
        self._conditions = conditions
        self._observation: Observation | None = None
        self._pass = _PASS.get()
        speculative = frame.sparkSession.conf.get("spark.speculation", "false") == "true"
        if observed and not speculative and slices * len(conditions) <= self.MAX_OBSERVED:
            self._observation = Observation(f"sj_{uuid.uuid4().hex}")
            numbered = numbered.observe(self._observation, *self._aggregates())
        self.rows = numbered.drop(*owners.values())
        self._names = list(counts)
        self._values: dict[int, dict[str, int]] | None = None

    def _aggregates(self) -> list[Column]:
        """The observation's counters: one per name per slice (built only when observed, each a
        few calls into the JVM)."""
        return [
            F.count_if((F.col(column) == F.lit(k)) & condition).alias(f"{name}#{k}")
            for k in range(self._slices)
            for name, (column, condition) in self._conditions.items()
        ] or [F.count(F.lit(1)).alias("_sj_rows")]

    def get(self) -> dict[int, dict[str, int]]:
        """{slice number: {name: count}} for every slice."""
        if self._values is None:
            observed = self._observed()
            if observed is None:
                observed = self._counted()
            self._values = {
                k: {name: observed[f"{name}#{k}"] for name in self._names} for k in range(self._slices)
            }
        return self._values

    def _counted(self) -> dict[str, int]:
        """The counts by an aggregation of their own, grouped by slice: a counter per name, not per
        slice, for each row (a backfill's group may hold hundreds of slices)."""
        values = {f"{name}#{k}": 0 for k in range(self._slices) for name in self._names}
        by_owner: dict[str, list[Column]] = {}
        for name, (column, condition) in self._conditions.items():
            by_owner.setdefault(column, []).append(F.count_if(condition).alias(name))
        for column, aggregates in by_owner.items():
            owned = self._numbered.where(F.col(column).isNotNull()).groupBy(column).agg(*aggregates)
            for row in owned.collect():
                values.update({f"{name}#{row[column]}": row[name] for name in row.asDict() if name != column})
        return values

    def _observed(self) -> dict[str, int] | None:
        """The observation's values, if a pass over the rows ran with it."""
        if self._observation is None:
            return None
        java = self._observation._jo
        if java is None or not java.future().isCompleted():
            return None
        if self._pass is not None and _rerun(self._numbered.sparkSession, self._pass):
            return None
        try:
            return self._observation.get
        except Py4JError:  # completed without values: the observed plan was pruned
            return None
