"""UNNEST and table-function joins on Spark: each row joined with the rows made from it (the families' declarations: streamjoin/joins/lateral/__init__.py)."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, StructType

from streamjoin import arrival, functions
from streamjoin.arrival import REJECT, T, user_columns
from streamjoin.joins.base import (
    Counters,
    Deferred,
    JoinOperator,
    SliceCounts,
    StepInput,
    StepResult,
)
from streamjoin.joins.lateral import FunctionLink
from streamjoin.metrics import SourceCounts
from streamjoin.plan import BoundJoin, Plan

_ORDINAL = functions.ORDINAL  # a made row's number among its row's, from 0; NULL: none made


@dataclass(frozen=True)
class Expansion:
    """How rows are made from a stream row: `source` names the stream, `name` the made rows
    (`as`); `family` says from what (`function`: a table function of `lateral`, its arguments;
    otherwise the array or map expression `lateral[0]`); `made` is their columns as the job names
    them. Lateral joins and lookup joins (whose array is the database's answer) each hold one."""

    source: str
    name: str
    family: str  # unnest | function | lookup
    lateral: tuple[str, ...]
    made: StructType
    function: str | None = None

    def as_row(self, rows: DataFrame, *keep: str) -> DataFrame:
        """Settled rows as the expansion takes them: the event time, `keep` columns, and the row's
        own columns as one struct named by its source (how `select` and `where` name them)."""
        own = F.struct(*[F.col(f"`{c}`") for c in user_columns(rows)])
        return rows.select(F.col(T), *keep, own.alias(self.source))

    def expanded(self, row: DataFrame) -> DataFrame:
        """Per made row (and per row that made none): the row's event time, the row as a struct
        named by its source, the made row as a struct named by `name` (NULL for none), and
        `_ORDINAL`."""
        fields = self.made.fieldNames()
        if self.family != "function":  # an array (or map) expression over the row
            (expression,) = self.lateral
            kind = row.select(F.expr(expression)).schema[0].dataType
            if isinstance(kind, ArrayType):
                made = row.select("*", F.posexplode_outer(F.expr(expression)).alias(_ORDINAL, "_sj_v"))
                parts = (
                    [F.col("_sj_v")[f] for f in kind.elementType.fieldNames()]
                    if isinstance(kind.elementType, StructType)
                    else [F.col("_sj_v")]
                )
            else:  # a map (the plan refuses other types)
                made = row.select(
                    "*", F.posexplode_outer(F.expr(expression)).alias(_ORDINAL, "_sj_k", "_sj_v")
                )
                parts = [F.col("_sj_k"), F.col("_sj_v")]
        else:
            assert self.function is not None  # the family says which
            udtf = functions.numbered(
                functions.load(self.function, f"join {self.name!r}"), self.function, tuple(fields)
            )
            call = udtf(*[F.expr(a).outer() for a in self.lateral]).alias("_sj_made")
            made = row.alias("_sj_row").lateralJoin(call)
            parts = [F.col(f"_sj_made.`{f}`") for f in fields]
        item = F.when(
            F.col(_ORDINAL).isNotNull(), F.struct(*[p.alias(f) for p, f in zip(parts, fields, strict=True)])
        )
        return made.select(F.col(T), F.col(self.source), item.alias(self.name), F.col(_ORDINAL))


def made_rows_step(
    plan: Plan,
    inputs: StepInput,
    expansion: Expansion,
    join_type: str,
    made: DataFrame,
    lookups: int | None = None,
) -> StepResult:
    """A lateral step's result from the rows `made` (`Expansion.expanded`): INNER drops a row that
    made none, LEFT keeps it padded; what each row made is counted per slice as the output is
    written. Nothing is late, nothing is kept. `lookups`: answers fetched from a database."""
    source, slices = expansion.source, inputs.slices
    owner = slices.number(F.col(T))
    first, none = F.col(_ORDINAL) == F.lit(0), F.col(_ORDINAL).isNull()
    tally = SliceCounts(made, len(slices), joined=(owner, first), unmatched=(owner, none))
    padded = join_type == "left"
    kept = tally.rows if padded else tally.rows.where(~none)
    emitted = kept.where(slices.inside(F.col(T)))

    def counts() -> list[dict[str, SourceCounts]]:
        return [
            {
                source: SourceCounts(
                    joined=counted["joined"],
                    unmatched_emitted=counted["unmatched"] if padded else 0,
                    unmatched_dropped=0 if padded else counted["unmatched"],
                )
            }
            for counted in tally.get().values()
        ]

    nothing = inputs.settled[source].drop(REJECT).where(F.lit(False))
    return StepResult(
        output=plan.project(emitted, F.col(T)),
        late=arrival.side_rows(nothing, source, F.lit("late")),
        by_slice=Deferred(counts),
        state={source: nothing} if inputs.keep_state else None,
        max_event=inputs.timeline.max_event,
        counters=[Counters(totals={"lookups": lookups}), *[Counters()] * (len(slices) - 1)]
        if lookups is not None
        else (),
    )


@dataclass(frozen=True)
class LateralJoin(JoinOperator):
    expansion: Expansion
    type: str  # inner | left

    @classmethod
    def build(cls, plan: Plan, join: BoundJoin) -> LateralJoin:
        assert join.made is not None  # the plan gives a lateral join the schema of its made rows
        function = join.spec.function if isinstance(join.spec, FunctionLink) else None
        expansion = Expansion(join.left[0], join.right, join.family, join.made_from, join.made, function)
        return cls(expansion, join.spec.type)

    def reads_rows_once(self) -> bool:
        return True

    def step(self, spark: SparkSession, plan: Plan, inputs: StepInput) -> StepResult:
        """Expand every settled row, count what each made per slice as the output is written."""
        rows = inputs.settled[self.expansion.source].drop(REJECT)
        made = self.expansion.expanded(self.expansion.as_row(rows))
        return made_rows_step(plan, inputs, self.expansion, self.type, made)
