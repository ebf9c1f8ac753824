"""The table-table join on Spark: the joined result of two changelogs, kept as its changes (the family's declaration: streamjoin/joins/table_table/__init__.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace
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
    TableWrite,
    Write,
    tally_parts,
)
from streamjoin.joins.chaining import Accepts, accepted, declare
from streamjoin.metrics import SourceCounts
from streamjoin.plan import BoundJoin, Plan
from streamjoin.timeutil import to_micros

POINT = "_sj_point"  # struct(commit timestamp, source index, commit version) of the input commit
RESULT_KEY = "result_key"  # the result row's key, a struct named after the left table's key columns
OP = "op"  # upsert | delete
_EXISTS, _VALUE = "_sj_exists", "_sj_value"


@dataclass(frozen=True)
class TableLink:
    """One table joined to the result so far: `table` by its whole primary key, from columns of
    one earlier table (`parent`)."""

    table: str
    type: str  # inner | left | full
    parent: str
    pairs: tuple[tuple[str, str], ...]  # (parent column, table key column) for every key column
    residual: str | None
    by_parent_key: bool  # the parent's columns are its whole primary key (1:1), else a foreign key (1:N)


@dataclass(frozen=True)
class TableTableJoin(JoinOperator):
    """A table (`left`) joined to one or more tables in turn (ksqlDB's N-way table joins)."""

    left: str
    left_key: tuple[str, ...]
    links: tuple[TableLink, ...]
    clock_skew: dict[str, int]  # microseconds, per table

    @staticmethod
    def link_of(join: BoundJoin, plan: Plan) -> TableLink:
        """One link from its equalities; refuses many-to-many joins and FULL foreign-key joins."""
        right = plan.source(join.right)
        owners = sorted({lc.split(".", 1)[0] for lc, _ in join.equi})
        where = f"join of {' / '.join(join.left)} with table {right.name!r}"
        if len(owners) != 1:
            raise UnsupportedJobError(
                f"{where}: the condition must take the right table's key from the columns of one earlier table, "
                f"not of {', '.join(owners)}; join the tables one at a time, each link on one table's columns"
            )
        parent = plan.source(owners[0])
        pairs = tuple((lc.split(".", 1)[1], rc.split(".", 1)[1]) for lc, rc in join.equi)
        right_columns = [rc for _, rc in pairs]
        if sorted(set(right_columns)) != sorted(right.spec.key) or len(right_columns) != len(
            set(right_columns)
        ):
            raise UnsupportedJobError(
                f"{where}: the condition must equate the right table's whole primary key "
                f"({', '.join(right.spec.key)}) with columns of {parent.name!r}, once each (found {', '.join(right_columns)}). "
                "Table-table joins are primary-key (1:1) or foreign-key (1:N), as in ksqlDB; a many-to-many join "
                "would keep every pair of matching rows as state and is refused: aggregate one side to its key first"
            )
        primary = sorted(lc for lc, _ in pairs) == sorted(parent.spec.key)
        if not primary and join.spec.type == "full":
            raise UnsupportedJobError(
                f"{where}: a foreign-key join supports INNER and LEFT (ksqlDB), not FULL"
            )
        if join.residual and join.spec.type == "full":
            raise UnsupportedJobError(
                f"{where}: a FULL table-table join takes key equalities only (the result has one row per key); "
                f"move {join.residual} to 'where'"
            )
        return TableLink(right.name, join.spec.type, parent.name, pairs, join.residual, primary)

    def then(self, plan: Plan, join: BoundJoin) -> TableTableJoin | None:
        """One more table: INNER or LEFT, each link keyed by the first table's key (a FULL link is a
        job's only join: its result key may come from either table); None for what its declaration
        does not take (a stream)."""
        if accepted("table-table", join, at_start=True) is None:
            return None
        if join.spec.type == "full" or any(link.type == "full" for link in self.links):
            raise UnsupportedJobError(
                f"job {plan.spec.name!r}: join {len(self.links) + 1} (JOIN {join.right}): a FULL table-table join "
                "must be the job's only join (its result is keyed by either table's key); chain INNER and LEFT "
                "table joins, or write the FULL join's result to a table and join that in a second job"
            )
        link = self.link_of(join, plan)
        right = plan.source(join.right)
        return replace(
            self,
            links=(*self.links, link),
            clock_skew={**self.clock_skew, right.name: to_micros(right.spec.clock_skew)},
        )

    def known_until(self, newest: dict[str, int | None]) -> int | None:
        """The commit timestamp up to which every table's log is complete: each table's newest
        change, or the newest change of any minus the table's clock skew (None: no change yet)."""
        clock = max((ts for ts in newest.values() if ts is not None), default=None)
        if clock is None:
            return None
        return min(changelog.known_until(ts, clock, self.clock_skew[name]) for name, ts in newest.items())

    # ------------------------------------------------------------------ the changelog of the result

    def changes(self, plan: Plan, applied: dict[str, DataFrame]) -> DataFrame:
        """Every result change, with its key, op, the selected values and the causing position.

        `applied`: each table's applied changes (changelog.read, accepted), by name.
        """
        L = self.left
        key_names = list(self.left_key)
        versions = {
            name: changelog.versions(applied[name], plan.source(name).spec.key, "position").alias(name)
            for name in applied
        }
        points = applied[L].select(*[F.col(f"`{k}`") for k in key_names], _position().alias(POINT))
        for link in self.links:
            points = points.unionByName(self._touched(plan, link, applied[link.table], versions))
        points = points.distinct().alias("p")
        at = F.col(f"p.{POINT}")
        at_left = reduce(Column.__and__, [F.col(f"p.`{k}`") == F.col(f"{L}.`{k}`") for k in key_names])
        joined = points.join(versions[L], at_left & changelog.valid_at(at, f"{L}."), "left_outer")
        has = {L: F.col(f"{L}.{TS}").isNotNull()}
        exists = has[L]
        for link in self.links:
            condition = self._link_condition(link) & changelog.valid_at(at, f"{link.table}.")
            if link.residual:
                condition = condition & F.expr(link.residual)
            joined = joined.join(versions[link.table], condition, "left_outer")
            has[link.table] = F.col(f"{link.table}.{TS}").isNotNull()
            if link.type == "inner":
                exists = exists & has[link.table]
            elif link.type == "full":  # the job's only link (`then`)
                exists = exists | has[link.table]
        if plan.spec.where:
            exists = exists & F.coalesce(F.expr(plan.spec.where), F.lit(False))
        values = [F.expr(e) for e in plan.select]
        key = F.struct(*[F.col(f"p.`{k}`").alias(k) for k in key_names])
        rows = joined.select(key.alias(RESULT_KEY), at.alias(POINT), exists.alias(_EXISTS), *values)
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

    def _link_condition(self, link: TableLink) -> Column:
        """How a result row finds the link's table row: by the first table's key where the link
        joins by it (so a FULL join finds a right row without a left one), else by the parent's
        columns."""
        owner = "p" if link.parent == self.left and link.by_parent_key else link.parent
        return reduce(
            Column.__and__,
            [F.col(f"{owner}.`{pc}`") == F.col(f"{link.table}.`{rc}`") for pc, rc in link.pairs],
        )

    def _touched(
        self, plan: Plan, link: TableLink, changes: DataFrame, versions: dict[str, DataFrame]
    ) -> DataFrame:
        """The result keys each change of the link's table touches, at its position: by the first
        table's key itself where the link joins by it; else every row of the first table that
        leads to it at that moment, back along the links (a foreign key, or a table further on)."""
        key_names = list(self.left_key)
        if link.parent == self.left and link.by_parent_key:
            by_table = {rc: pc for pc, rc in link.pairs}
            return changes.select(
                *[F.col(f"`{rc}`").alias(by_table[rc]) for rc in plan.source(link.table).spec.key],
                _position().alias(POINT),
            )
        parents = {step.table: step for step in self.links}
        at = _position("c")
        reached = changes.alias("c")
        child, step = "c", link
        while True:  # join the parent's rows valid at the change's position that point at the child
            on = reduce(
                Column.__and__,
                [F.col(f"{step.parent}.`{pc}`") == F.col(f"{child}.`{rc}`") for pc, rc in step.pairs],
            )
            reached = reached.join(versions[step.parent], on & changelog.valid_at(at, f"{step.parent}."))
            if step.parent == self.left:
                break
            child, step = step.parent, parents[step.parent]
        return reached.select(*[F.col(f"{self.left}.`{k}`").alias(k) for k in key_names], at.alias(POINT))

    # ------------------------------------------------------------------ the operator

    @classmethod
    def build(cls, plan: Plan, join: BoundJoin) -> TableTableJoin:
        left, right = plan.source(join.left[0]), plan.source(join.right)
        return cls(
            left=left.name,
            left_key=left.spec.key,
            links=(cls.link_of(join, plan),),
            clock_skew={
                left.name: to_micros(left.spec.clock_skew),
                right.name: to_micros(right.spec.clock_skew),
            },
        )

    def keyed_output(self, plan: Plan) -> KeyedOutput:
        """The result table's changes, keyed by RESULT_KEY; a key's changes in position order."""
        bookkeeping = ("change_source", "change_version")
        return KeyedOutput(RESULT_KEY, OP, (plan.spec.output.time, *bookkeeping), bookkeeping)

    def step(self, spark: SparkSession, plan: Plan, inputs: StepInput) -> StepResult:
        """Table-table: the result's changes settled after the bound an earlier live step emitted up
        to (its mark `bound`; in a replay, those inside the slices), and the output updated: a
        replay replaces it with the result table as of the settled bound, a live step merges each
        key's latest change into it. Nothing is late: tables have no lateness."""
        tables, slices, after = inputs.tables, inputs.slices, inputs.marks.get("bound")
        known = self.known_until({name: t.newest_ts for name, t in tables.items()})
        bound = END_OF_INPUT if inputs.final else known
        applied = {name: t.changes.where(F.col(REJECT).isNull()).drop(REJECT) for name, t in tables.items()}
        when = F.col(f"{POINT}.ts")
        settled = self.changes(plan, applied).where(F.lit(False) if bound is None else when <= F.lit(bound))
        emitted = settled if after is None else settled.where(when > F.lit(after))
        output = emitted.where(slices.inside(when)).select(
            RESULT_KEY,
            OP,
            *[F.col(f"`{c}`") for c in plan.output_columns],
            F.timestamp_micros(when).alias(plan.spec.output.time),
            F.col(f"{POINT}.src").alias("change_source"),
            F.col(f"{POINT}.v").alias("change_version"),
        )
        keyed = self.keyed_output(plan)
        update = (
            TableWrite(keyed.latest(output), Write.MERGE, keyed=keyed)
            if inputs.keep_state
            else TableWrite(self._result(plan, settled), Write.REPLACE)
        )
        applied_by_slice = tally_parts(
            {name: (table.changes, table.owner) for name, table in tables.items()},
            applied=F.count(F.when(F.col(REJECT).isNull(), 1)),
        )
        by_slice = [
            {name: SourceCounts(**tally.get(k, {"applied": 0})) for name, tally in applied_by_slice.items()}
            for k in range(len(slices))
        ]
        no_late_rows = arrival.side_rows(tables[self.left].changes.limit(0), self.left, F.lit("late"))
        written_up_to = known if known is not None else after
        return StepResult(
            output=output,
            late=no_late_rows,
            by_slice=by_slice,
            state=None,
            max_event=None,
            watermark=written_up_to,
            marks={} if written_up_to is None else {"bound": written_up_to},
            writes=[update],
        )

    def _result(self, plan: Plan, settled: DataFrame) -> DataFrame:
        """The result table as of the settled changes: each key's latest, unless a delete."""
        return (
            KeyedOutput(RESULT_KEY, OP, (POINT,))
            .latest(settled)
            .where(F.col(OP) == "upsert")
            .select(
                RESULT_KEY,
                *[F.col(f"`{c}`") for c in plan.output_columns],
                F.timestamp_micros(F.col(f"{POINT}.ts")).alias(plan.spec.output.time),
            )
        )


def _position(alias: str | None = None) -> Column:
    prefix = f"{alias}." if alias else ""
    return F.struct(
        F.col(f"{prefix}{TS}").alias("ts"),
        F.col(f"{prefix}{SRC}").alias("src"),
        F.col(f"{prefix}{V}").alias("v"),
    )


declare("table-table", accepts=(Accepts(("table-table",), when="INNER or LEFT, the first join not FULL"),))
