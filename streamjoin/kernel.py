"""The relational kernel both runners call: settled rows in, lateness decided, joined rows out.

A runner decides which rows are settled in a step (a replay: all of them; the live runner: those
each micro-batch settles) and hands them here with the commits they came from. Everything that
decides which rows come out (rejection, lateness, the join family's semantics, projection) is in
this call and in the join operator it hands the step to (`streamjoin/joins/`), never in a runner.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streamjoin import arrival, delta_io
from streamjoin import family as registry
from streamjoin.arrival import REJECT
from streamjoin.joins.base import END_OF_INPUT, JoinOperator, StepInput, StepResult, Write
from streamjoin.joins.chaining import refusal
from streamjoin.plan import Plan
from streamjoin.spec import Output

__all__ = [
    "END_OF_INPUT",
    "StepInput",
    "StepResult",
    "append_writes",
    "family",
    "rejected_side_rows",
    "runnable",
    "split_rejected",
    "step",
    "update_output",
]


def family(plan: Plan) -> JoinOperator:
    """The join operator of a plan: the first link's family, extended link by link (a chain is a
    fold over its links); refuses, before any data moves, a link the one before does not take
    (what each family declares, `joins.chaining`)."""
    first, *rest = plan.joins
    operator = registry.operator(first.family)(plan, first)
    for step, join in enumerate(rest, 2):
        extended = operator.then(plan, join)
        if extended is None:
            raise refusal(plan, step)
        operator = extended
    return operator


def runnable(spark: SparkSession, plan: Plan) -> JoinOperator:
    """Every check a runner makes of a job before data moves, in one place so that `validate-job`
    and `explain` refuse what the runners would: an operator runs the join, and every source
    records its change data feed. Returns the operator."""
    operator = family(plan)
    for source in plan.sources:
        delta_io.require_change_feed(spark, source.spec.location)
    return operator


def reach_external(spark: SparkSession, plan: Plan) -> None:
    """Before a live run's first batch: the external systems its joins ask for every new commit
    answer now (a family's `reach`: a lookup join's database), so one that is down is refused in
    one line at the start."""
    for join in plan.joins:
        plugin = registry.of(join.family)
        if plugin is not None and plugin.reach is not None:
            registry.resolved(plugin.reach)(spark, plan, join)


def split_rejected(rows: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(accepted, rejected) rows of a prepared source DataFrame."""
    return rows.where(F.col(REJECT).isNull()), rows.where(F.col(REJECT).isNotNull())


def rejected_side_rows(name: str, rejected: DataFrame) -> DataFrame:
    """Rejected rows in side-table form, with the reason they were refused."""
    return arrival.side_rows(rejected, name, F.col(REJECT))


def step(spark: SparkSession, plan: Plan, inputs: StepInput) -> StepResult:
    """Run one step of the job's join (`StepInput` says what the runner hands it)."""
    return family(plan).step(spark, plan, inputs)


def append_writes(result: StepResult, append: Callable[[DataFrame, str], None] | None = None) -> list[str]:
    """Append the tables a step asks for (`Write.APPEND`), before its output is written: a step run
    again after a failure then reads them back. `append(rows, location)`: the runner's write (the
    live runner's exactly once with its batch); by default a plain append. Returns the locations."""
    written = []
    for write in result.writes:
        if write.how == Write.APPEND:
            assert write.location is not None  # an appended table is the operator's own
            if append is None:
                delta_io.append(write.rows, write.location, merge_schema=True)
            else:
                append(write.rows, write.location)
            written.append(write.location)
    return written


def update_output(result: StepResult, out: Output) -> bool:
    """Replace or merge into the output `out` as the step asks (`Write.REPLACE`, `Write.MERGE`),
    after its rows (a keyed result's changes) are written; whether it asked. Either is idempotent:
    a step run again writes the same table."""
    asked = False
    for write in result.writes:
        if write.how == Write.REPLACE:
            delta_io.overwrite(write.rows, out.location, out.partition_by)
        elif write.how == Write.MERGE:
            assert write.keyed is not None  # a merge says by which key
            delta_io.merge_latest(write.rows, out.location, write.keyed.key, write.keyed.op)
        asked = asked or write.how != Write.APPEND
    return asked
