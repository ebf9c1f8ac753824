"""Lookup joins on Spark: each row's key asked of the database once, the answers recorded in the job's journal (the family's declaration: streamjoin/joins/lookup/__init__.py)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from functools import reduce

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from streamjoin import database, delta_io
from streamjoin.arrival import REJECT, V
from streamjoin.database import Lookup
from streamjoin.joins.base import JoinOperator, StepInput, StepResult, TableWrite
from streamjoin.joins.lateral.step import Expansion, made_rows_step
from streamjoin.joins.lookup import LookupLink
from streamjoin.plan import BoundJoin, Plan

_KEY, _FOUND = "_sj_key", "_sj_found"
PUSHED_KEYS = 1000  # up to this many keys a step asks the database for them by name; more: the whole table


def journal_schema(made: StructType) -> StructType:
    """The journal's rows: one answer per (source, commit version, key)."""
    return StructType(
        [
            StructField("source", StringType()),
            StructField("version", LongType()),
            StructField("key", StringType()),  # the lookup key's values as JSON, in the database's types
            StructField("rows", ArrayType(made)),  # the database rows with that key (none: [])
            StructField("looked_up_at", TimestampType()),
            StructField("looked_up_by", StringType()),  # live | replay
            StructField("lookup_id", StringType()),  # one per recording step (orders racing records)
        ]
    )


@dataclass(frozen=True)
class LookupJoin(JoinOperator):
    """A lateral join whose made rows are the database's answer for the row's key, as recorded."""

    expansion: Expansion  # the database rows, an array per row (`_FOUND`), made as UNNEST makes them
    type: str  # inner | left
    lookup: Lookup
    keys: tuple[tuple[str, str], ...]  # (stream column, database column)
    residual: str | None  # the condition's other terms, over the row and the database row
    journal: str

    @classmethod
    def build(cls, plan: Plan, join: BoundJoin) -> LookupJoin:
        assert join.made is not None  # the plan binds lookup joins so
        keys = tuple((a.split(".", 1)[1].strip("`"), b.split(".", 1)[1].strip("`")) for a, b in join.equi)
        return cls(
            expansion=Expansion(join.left[0], join.right, "lookup", (_FOUND,), join.made),
            type=join.spec.type,
            lookup=join.link(LookupLink).lookup,
            keys=keys,
            residual=join.residual,
            journal=plan.spec.output.side("lookups"),
        )

    @property
    def source(self) -> str:
        return self.expansion.source

    @property
    def name(self) -> str:
        return self.expansion.name

    @property
    def made(self) -> StructType:
        return self.expansion.made

    def reads_rows_once(self) -> bool:
        return True

    def step(self, spark: SparkSession, plan: Plan, inputs: StepInput) -> StepResult:
        """Each settled row with the answers recorded for its commit and key, counted as a lateral
        join counts its made rows; the answers it fetched, for its runner to append to the journal
        with the step's other writes, before the output (`TableWrite`)."""
        rows = inputs.settled[self.source].drop(REJECT)
        made, lookups, fetched = self._made(spark, inputs, rows)
        result = made_rows_step(plan, inputs, self.expansion, self.type, made, lookups)
        return replace(result, writes=[] if fetched is None else [TableWrite(fetched, location=self.journal)])

    def _made(
        self, spark: SparkSession, inputs: StepInput, rows: DataFrame
    ) -> tuple[DataFrame, int, DataFrame | None]:
        """The rows with the database rows recorded for their commit and key (fetched first where
        the journal has none), expanded as UNNEST expands an array; how many answers were fetched,
        and those answers in the journal's form (None: none fetched)."""
        types = {f.name: f.dataType for f in self.made.fields}
        values = [F.col(f"`{stream}`").cast(types[column]).alias(column) for stream, column in self.keys]
        # A key that is not a value of the database column's type (a cast giving NULL) finds nothing.
        usable = reduce(lambda a, b: a & b, [value.isNotNull() for value in values])
        keyed = rows.withColumn(_KEY, F.when(usable, F.to_json(F.struct(*values))))
        wanted = keyed.where(usable).select(F.col(V), F.col(_KEY), *values).distinct().persist()
        try:
            answers, lookups, fetched = self._answered(spark, inputs, wanted)
        finally:
            wanted.unpersist()
        found = answers.select(
            F.col("version").alias(V), F.col("key").alias(_KEY), F.col("rows").alias(_FOUND)
        )
        row = self.expansion.as_row(keyed, V, _KEY).join(found, [V, _KEY], "left")
        everything = F.coalesce(F.col(_FOUND), F.array().cast(ArrayType(self.made)))
        row = row.withColumn(_FOUND, everything)
        if self.residual:  # the other terms, per database row (named by `as` in the condition)
            row = row.withColumn(_FOUND, F.expr(f"filter({_FOUND}, `{self.name}` -> {self.residual})"))
        return self.expansion.expanded(row.drop(V, _KEY)), lookups, fetched

    def _answered(
        self, spark: SparkSession, inputs: StepInput, wanted: DataFrame
    ) -> tuple[DataFrame, int, DataFrame | None]:
        """The answers for the (commit, key) pairs `wanted`: the journal's, and those it lacks
        fetched from the database; how many were fetched, and those (None: none)."""
        bounds = wanted.agg(F.min(V), F.max(V)).first()
        assert bounds is not None  # an aggregate without grouping returns one row
        if bounds[0] is None:
            return self._answers(spark, None), 0, None
        versions = (bounds[0], bounds[1])
        answers = self._answers(spark, versions)
        known = answers.select(F.col("version").alias(V), F.col("key").alias(_KEY))
        missing = wanted.join(known, [V, _KEY], "left_anti").persist()
        try:
            lookups = missing.count()
            if not lookups:
                return answers, 0, None
            fetched = self._fetched(spark, missing, "live" if inputs.keep_state else "replay", lookups)
        finally:
            missing.unpersist()
        return self._answers(spark, versions, fetched), lookups, fetched

    def _answers(
        self, spark: SparkSession, versions: tuple[int, int] | None, fetched: DataFrame | None = None
    ) -> DataFrame:
        """The answers for this source's commits in `versions` (None: no commit), the first
        recorded of each (commit, key): (version, key, rows); from the journal, and from `fetched`
        (answers not in it when the step began). The journal is read when the rows are, which may
        be after the runner appended `fetched` to it: the same answers then, taken once."""
        recorded = fetched
        if versions is not None and delta_io.exists(spark, self.journal):
            journal = delta_io.read_snapshot(spark, self.journal).where(
                (F.col("source") == F.lit(self.source)) & F.col("version").between(*versions)
            )
            recorded = journal if fetched is None else journal.unionByName(fetched, allowMissingColumns=True)
        if recorded is None:
            return spark.createDataFrame([], journal_schema(self.made)).select("version", "key", "rows")
        first = F.min_by(F.col("rows"), F.struct("looked_up_at", "lookup_id"))
        return recorded.groupBy("version", "key").agg(first.alias("rows"))

    def _fetched(self, spark: SparkSession, missing: DataFrame, runner: str, count: int) -> DataFrame:
        """Ask the database for the keys of `missing` (`count` of them: by name when few, else the
        whole table): one answer per (commit, key), in the journal's form, read once (the rows
        written and the journal's record are the same answers however often Spark reads them).
        The only place a lookup connects: commits whose answers the journal holds need no database."""
        why = f"lookup join {self.name!r} ({count} key(s) of commits the journal {self.journal} does not hold yet)"
        db = database.asked(spark, self.lookup, why, self.made)
        columns = [column for _, column in self.keys]
        keys = missing.select(*columns).distinct()
        named = keys.limit(PUSHED_KEYS + 1).collect()
        if len(named) <= PUSHED_KEYS:  # a filter the JDBC source sends to the database
            wanted = reduce(
                lambda a, b: a | b,
                [
                    reduce(lambda x, y: x & y, [F.col(f"`{c}`") == F.lit(r[c]) for c in columns])
                    for r in named
                ],
            )
            matched = db.where(wanted)
        else:
            matched = db.join(keys, columns, "left_semi")
        key = F.to_json(F.struct(*[F.col(f"`{c}`").alias(c) for c in columns]))
        grouped = matched.groupBy(key.alias(_KEY)).agg(
            F.collect_list(F.struct(*[F.col(f"`{f}`") for f in self.made.fieldNames()])).alias("rows")
        )
        answers = missing.join(grouped, _KEY, "left").select(
            F.lit(self.source).alias("source"),
            F.col(V).cast(LongType()).alias("version"),
            F.col(_KEY).alias("key"),
            F.coalesce(F.col("rows"), F.array().cast(ArrayType(self.made))).alias("rows"),
            F.current_timestamp().alias("looked_up_at"),
            F.lit(runner).alias("looked_up_by"),
            F.lit(uuid.uuid4().hex).alias("lookup_id"),
        )
        return answers.localCheckpoint(eager=True)


def check_database(spark: SparkSession, plan: Plan, bound: BoundJoin) -> None:
    """Connect to the lookup join's database now: a live run asks it for every new commit, so one
    that is down (or lost a column the journal recorded) is refused before the first batch, in one line."""
    assert isinstance(bound.spec, LookupLink) and bound.made is not None  # a bound lookup link
    database.asked(
        spark, bound.spec.lookup, f"job {plan.spec.name!r}, lookup join {bound.right!r}", bound.made
    )
