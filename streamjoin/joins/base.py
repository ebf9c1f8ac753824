"""The join-operator interface: what a join family implements and the runners call.

A family module holds one operator class. Built from a bound plan (`build`), it tells a replay
how far around a slice each source must be read (`margins`) and decides one step
(`step`): given the settled rows of the step, its timeline, what an earlier step left (live
state) and what is known of the table sources, it returns what to write and how every input row
was accounted for (`StepResult`). A family registers its builder under the plan's family names
(`register`); `streamjoin.kernel.family` looks it up, so adding a family is one module and its
registration in `streamjoin/joins/__init__.py` (docs/architecture.md, "How to add a join family").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from streamjoin.arrival import ALL_TIME, Slices, Timeline
from streamjoin.changelog import TableInput
from streamjoin.metrics import LinkCounts, SourceCounts
from streamjoin.plan import BoundJoin, Plan

# The watermark of an input that has ended (Flink's final watermark): every window is closed.
END_OF_INPUT = 2**62
MATCHED = "_sj_matched"  # a kept row found a partner in an earlier step (state rows of every family)
OUT_T = "_sj_out_t"  # an emitted row's event time, UTC microseconds


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
    counts: list[dict[str, SideCounts]]  # per slice of the step, by input
    state: dict[str, DataFrame] | None
    cached: list[DataFrame] = field(default_factory=list)  # persisted here; unpersist after writing
    links: list[list[LinkCounts]] = field(default_factory=list)  # chains: per slice, per link


@dataclass(frozen=True)
class StepInput:
    """What a runner hands an operator for one step.

    `settled`: accepted, settled stream rows by source name. `timeline`: the largest accepted event
    time before each of their commits and after all settled commits (from the live runner's
    batches, or the arrival index in a replay). `state`: the rows an earlier step left open (live
    runner only). `slices`: a replay's slices; only rows inside them are emitted, each accounted
    for apart (the default, one slice of every time, is a live micro-batch's). `tables`: what is
    known of each table source. `after`: the bound up to which an earlier step already emitted
    table-table result changes. `final`: the input has ended (a replay of a closed history):
    every window closes, every stream row is decided, every table change settled.
    """

    settled: dict[str, DataFrame]
    timeline: Timeline
    mode: str
    state: dict[str, DataFrame] | None = None
    slices: Slices = ALL_TIME
    keep_state: bool = False
    tables: dict[str, TableInput] = field(default_factory=dict)
    after: int | None = None
    final: bool = False


@dataclass
class StepResult:
    """What one step emits and how its rows were accounted for."""

    output: DataFrame
    late: DataFrame
    by_slice: list[dict[str, SourceCounts]]  # per slice of the step (`Slices`), by source name
    state: dict[str, DataFrame] | None
    max_event: int | None
    watermark: int | None = None
    result: DataFrame | None = None  # table-table joins: the result table as of the settled bound
    cached: list[DataFrame] = field(default_factory=list)  # persisted by the step; unpersist after writing
    links: list[list[LinkCounts]] = field(default_factory=list)  # chains: per slice, per link

    @property
    def counts(self) -> dict[str, SourceCounts]:
        """The counts of a step over one slice (a live micro-batch, or a one-slice replay)."""
        (only,) = self.by_slice
        return only


@dataclass(frozen=True)
class KeyedOutput:
    """Emitted rows that are changes to a keyed result (table-table joins). The runners append
    them to `<output>_changes`; the output table is the result itself: a replay replaces it with
    the step's `result`, the live runner applies each key's latest change (MERGE by `key`)."""

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


Builder = Callable[[Plan, BoundJoin], JoinOperator]
FAMILIES: dict[str, Builder] = {}  # plan family name -> builder


def register(*names: str) -> Callable[[Builder], Builder]:
    """Register an operator builder under the plan's family names (`BoundJoin.family`)."""

    def add(builder: Builder) -> Builder:
        for name in names:
            FAMILIES[name] = builder
        return builder

    return add


def tally_by_slice(rows: DataFrame, owner: Column, **aggregates: Column) -> dict[int, dict[str, int]]:
    """`aggregates` over the rows each slice owns, by slice number (rows without an owner are not
    counted); a slice that owns no row is absent."""
    grouped = (
        rows.where(owner.isNotNull())
        .groupBy(owner.alias("_sj_slice"))
        .agg(*[column.alias(name) for name, column in aggregates.items()])
    )
    return {r["_sj_slice"]: {name: r[name] for name in aggregates} for r in grouped.collect()}
