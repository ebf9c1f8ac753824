"""Table-table joins (ksqlDB primary-key 1:1 and foreign-key 1:N): a result table and its changelog.

The result is itself a table, keyed by the left table's primary key (a FULL primary-key join keys
a right-only row by the right key). After every input commit, in arrival-position order, each
result row the commit touches is recomputed from both tables as they are at that position:

- the row appears or its values change: an `upsert`;
- the row disappears (a tombstone on either side, a foreign key moved away, `where` no longer
  holds): a `delete`, ksqlDB's output tombstone, emitted only if the row existed.

Primary-key join: the equalities pair the left table's whole primary key with the right table's.
Foreign-key join: any left columns equal the right table's whole primary key; a change of a right
row updates every left row pointing at it at that moment (ksqlDB's 1:N table, row 8). INNER needs
both rows (and the residual), LEFT the left row, FULL (primary key only) either.

Each result change carries the position of the input commit that caused it, so the sequence of
changes per key is a function of the two tables' logs alone: the live runner and a replay produce
the same sequence, however commits were grouped into micro-batches. A change is settled once both
tables are known past its commit (`clock_skew`, as for enrichment joins).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from streamjoin import arrival, changelog
from streamjoin.arrival import REJECT, SRC, TS, V
from streamjoin.errors import UnsupportedJobError
from streamjoin.joins.base import (
    END_OF_INPUT,
    JoinOperator,
    KeyedOutput,
    StepInput,
    StepResult,
    register,
    tally_by_slice,
)
from streamjoin.metrics import SourceCounts
from streamjoin.plan import BoundJoin, BoundSource, Plan
from streamjoin.timeutil import to_micros

POINT = "_sj_point"  # struct(commit timestamp, source index, commit version) of the input commit
RESULT_KEY = "result_key"  # the result row's key, a struct named after the left table's key columns
OP = "op"  # upsert | delete
_EXISTS, _VALUE = "_sj_exists", "_sj_value"


@dataclass(frozen=True)
class TableTableJoin(JoinOperator):
    left: str
    right: str
    type: str  # inner | left | full
    kind: str  # primary-key | foreign-key
    left_key: tuple[str, ...]
    right_key: tuple[str, ...]
    pairs: tuple[tuple[str, str], ...]  # (left column, right key column) for every right key column
    residual: str | None
    clock_skew: dict[str, int]  # microseconds, per table

    @classmethod
    def from_plan(cls, join: BoundJoin, left: BoundSource, right: BoundSource) -> TableTableJoin:
        """The join's kind from its equalities; refuses many-to-many joins and FULL foreign-key joins."""
        pairs = tuple((lc.split(".", 1)[1], rc.split(".", 1)[1]) for lc, rc in join.equi)
        where = f"join of table {left.name!r} with table {right.name!r}"
        right_columns = [rc for _, rc in pairs]
        if sorted(set(right_columns)) != sorted(right.spec.key) or len(right_columns) != len(
            set(right_columns)
        ):
            raise UnsupportedJobError(
                f"{where}: the condition must equate the right table's whole primary key "
                f"({', '.join(right.spec.key)}) with columns of {left.name!r}, once each (found {', '.join(right_columns)}). "
                "Table-table joins are primary-key (1:1) or foreign-key (1:N), as in ksqlDB; a many-to-many join "
                "would keep every pair of matching rows as state and is refused: aggregate one side to its key first"
            )
        primary = sorted(lc for lc, _ in pairs) == sorted(left.spec.key)
        if not primary and join.spec.type == "full":
            raise UnsupportedJobError(
                f"{where}: a foreign-key join supports INNER and LEFT (ksqlDB), not FULL"
            )
        if join.residual and join.spec.type == "full":
            raise UnsupportedJobError(
                f"{where}: a FULL table-table join takes key equalities only (the result has one row per key); "
                f"move {join.residual} to 'where'"
            )
        return cls(
            left=left.name,
            right=right.name,
            type=join.spec.type,
            kind="primary-key" if primary else "foreign-key",
            left_key=left.spec.key,
            right_key=right.spec.key,
            pairs=pairs,
            residual=join.residual,
            clock_skew={
                left.name: to_micros(left.spec.clock_skew),
                right.name: to_micros(right.spec.clock_skew),
            },
        )

    def known_until(self, newest: dict[str, int | None]) -> int | None:
        """The commit timestamp up to which both tables' logs are complete: each table's newest
        change, or the newest change of either minus the table's clock skew (None: no change yet)."""
        clock = max((ts for ts in newest.values() if ts is not None), default=None)
        if clock is None:
            return None
        return min(changelog.known_until(ts, clock, self.clock_skew[name]) for name, ts in newest.items())

    # ------------------------------------------------------------------ the changelog of the result

    def changes(self, plan: Plan, left: DataFrame, right: DataFrame) -> DataFrame:
        """Every result change, with its key, op, the selected values and the causing position.

        `left`/`right` are each table's applied changes (changelog.read, accepted).
        """
        L, R = self.left, self.right
        lv = changelog.versions(left, self.left_key, "position").alias(L)
        rv = changelog.versions(right, self.right_key, "position").alias(R)
        key_names = list(self.left_key)
        left_points = left.select(*[F.col(f"`{k}`") for k in key_names], _position().alias(POINT))
        # The result keys each right change touches, and how a point finds its right row.
        if self.kind == "primary-key":  # the right key is the result key
            by_right = {rc: lc for lc, rc in self.pairs}
            right_points = right.select(
                *[F.col(f"`{rc}`").alias(by_right[rc]) for rc in self.right_key], _position().alias(POINT)
            )
            at_right = reduce(
                Column.__and__, [F.col(f"p.`{lc}`") == F.col(f"{R}.`{rc}`") for lc, rc in self.pairs]
            )
        else:  # every left row pointing at the right key at that position
            to_left = reduce(
                Column.__and__, [F.col(f"{L}.`{lc}`") == F.col(f"r.`{rc}`") for lc, rc in self.pairs]
            )
            touched = right.alias("r").join(lv, to_left & changelog.valid_at(_position("r"), f"{L}."))
            right_points = touched.select(
                *[F.col(f"{L}.`{k}`").alias(k) for k in key_names], _position("r").alias(POINT)
            )
            at_right = reduce(
                Column.__and__, [F.col(f"{L}.`{lc}`") == F.col(f"{R}.`{rc}`") for lc, rc in self.pairs]
            )
        points = left_points.unionByName(right_points).distinct().alias("p")
        at_left = reduce(Column.__and__, [F.col(f"p.`{k}`") == F.col(f"{L}.`{k}`") for k in key_names])
        right_condition = at_right & changelog.valid_at(F.col(f"p.{POINT}"), f"{R}.")
        if self.residual:
            right_condition = right_condition & F.expr(self.residual)
        joined = points.join(
            lv, at_left & changelog.valid_at(F.col(f"p.{POINT}"), f"{L}."), "left_outer"
        ).join(rv, right_condition, "left_outer")
        has_l, has_r = F.col(f"{L}.{TS}").isNotNull(), F.col(f"{R}.{TS}").isNotNull()
        exists = {"inner": has_l & has_r, "left": has_l, "full": has_l | has_r}[self.type]
        if plan.spec.where:
            exists = exists & F.coalesce(F.expr(plan.spec.where), F.lit(False))
        values = [F.expr(e) for e in plan.select]
        key = F.struct(*[F.col(f"p.`{k}`").alias(k) for k in key_names])
        rows = joined.select(
            key.alias(RESULT_KEY), F.col(f"p.{POINT}").alias(POINT), exists.alias(_EXISTS), *values
        )
        outputs = [F.col(f"`{c}`") for c in plan.output_columns]
        rows = rows.select(
            RESULT_KEY,
            POINT,
            _EXISTS,
            F.when(F.col(_EXISTS), F.to_json(F.struct(*outputs))).alias(_VALUE),
            *[
                F.when(F.col(_EXISTS), c).alias(name)
                for c, name in zip(outputs, plan.output_columns, strict=False)
            ],
        )
        by_key = Window.partitionBy(RESULT_KEY).orderBy(POINT)
        before, was = F.lag(_VALUE).over(by_key), F.coalesce(F.lag(_EXISTS).over(by_key), F.lit(False))
        op = F.when(F.col(_EXISTS) & (~was | (before != F.col(_VALUE))), F.lit("upsert")).when(
            ~F.col(_EXISTS) & was, F.lit("delete")
        )
        return rows.withColumn(OP, op).where(F.col(OP).isNotNull()).drop(_EXISTS, _VALUE)

    # ------------------------------------------------------------------ the operator

    @classmethod
    def build(cls, plan: Plan, join: BoundJoin) -> TableTableJoin:
        return cls.from_plan(join, plan.source(join.left[0]), plan.source(join.right))

    def keyed_output(self, plan: Plan) -> KeyedOutput:
        """The result table's changes, keyed by RESULT_KEY; a key's changes in position order."""
        bookkeeping = ("change_source", "change_version")
        return KeyedOutput(RESULT_KEY, OP, (plan.spec.output.time, *bookkeeping), bookkeeping)

    def step(self, spark: SparkSession, plan: Plan, inputs: StepInput) -> StepResult:
        """Table-table: the result's changes settled after `after` (and, in a replay, inside the slice)
        and the result table as of the settled bound. Nothing is late: tables have no lateness."""
        tables, slices, after, final = inputs.tables, inputs.slices, inputs.after, inputs.final
        known = self.known_until({name: t.newest_ts for name, t in tables.items()})
        bound = END_OF_INPUT if final else known
        applied = {name: t.changes.where(F.col(REJECT).isNull()).drop(REJECT) for name, t in tables.items()}
        changes = self.changes(plan, applied[self.left], applied[self.right])
        when = F.col(f"{POINT}.ts")
        settled = changes.where(F.lit(False) if bound is None else when <= F.lit(bound))
        emitted = settled
        if after is not None:
            emitted = emitted.where(when > F.lit(after))
        emitted = emitted.where(slices.inside(when))
        out_time = plan.spec.output.time
        output = emitted.select(
            RESULT_KEY,
            OP,
            *[F.col(f"`{c}`") for c in plan.output_columns],
            F.timestamp_micros(when).alias(out_time),
            F.col(f"{POINT}.src").alias("change_source"),
            F.col(f"{POINT}.v").alias("change_version"),
        )
        result = (
            KeyedOutput(RESULT_KEY, OP, (POINT,))
            .latest(settled)
            .where(F.col(OP) == "upsert")
            .select(
                RESULT_KEY,
                *[F.col(f"`{c}`") for c in plan.output_columns],
                F.timestamp_micros(when).alias(out_time),
            )
        )
        applied_by_slice = {
            name: tally_by_slice(
                table.changes, table.owner, applied=F.count(F.when(F.col(REJECT).isNull(), 1))
            )
            for name, table in tables.items()
        }
        by_slice = [
            {name: SourceCounts(**tally.get(k, {"applied": 0})) for name, tally in applied_by_slice.items()}
            for k in range(len(slices))
        ]
        no_late_rows = arrival.side_rows(tables[self.left].changes.limit(0), self.left, F.lit("late"))
        return StepResult(
            output=output,
            late=no_late_rows,
            by_slice=by_slice,
            state=None,
            max_event=None,
            watermark=known,
            result=result,
        )


def _position(alias: str | None = None) -> Column:
    prefix = f"{alias}." if alias else ""
    return F.struct(
        F.col(f"{prefix}{TS}").alias("ts"),
        F.col(f"{prefix}{SRC}").alias("src"),
        F.col(f"{prefix}{V}").alias("v"),
    )


register("table-table")(TableTableJoin.build)
