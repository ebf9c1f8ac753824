"""Lookup joins (Flink's JDBC lookup join), made replayable by a journal of the answers.

Each stream row is enriched with the rows of an external database table whose key columns equal
the row's, as the database holds them when the row is processed (`lookup: {url, table}`, `on`
with at least one equality; Flink's `JOIN customers FOR SYSTEM_TIME AS OF o.proc_time`).

No seed system can replay such a join: the database has moved on. Here every answer is recorded
in the journal `<output>_lookups`, keyed by the row's commit (source, version) and its lookup key:
the first run that processes a commit (the live runner, as rows arrive) asks the database once per
key of the commit and appends the answers; every later run of that commit (a replay, a backfill,
`verify`, a restarted batch) reads them back, so it writes the rows the live run wrote. A run
that meets commits the journal does not hold (a backfill of history no live run processed) asks
the database as it is now, records those answers too, and says how many it fetched
(`RunMetrics.lookups`, in its summary). Rows of one commit with one key share one answer; if two
runs raced to record one, the first recorded wins for everyone.

INNER drops a row without a database row (or none passing the condition's other terms), LEFT
keeps it once, padded. A row with a NULL key is rejected (`null_key`), as in every keyed join.
Decided as the row is processed: nothing is late, nothing waits, no state is kept. Output event
time: the row's own.

Two runs recording answers for the same commits at the same moment (a backfill over a range the
live runner is still writing, which docs/backfills.md, "Who writes an output", rules out) could
each read its own answer before seeing the other's; the journal then settles on the earlier
`looked_up_at` for later runs.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import reduce
from typing import Any

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
from sqlglot import exp

from streamjoin import database, delta_io, family
from streamjoin.arrival import REJECT, V
from streamjoin.database import Lookup
from streamjoin.enums import JoinType, LinkKind
from streamjoin.errors import JobError
from streamjoin.joins.base import JoinOperator, StepInput, StepResult, TableWrite
from streamjoin.joins.lateral import Expansion, made_rows_step
from streamjoin.links import Link
from streamjoin.plan import BoundJoin, Plan, check_qualifiers, conjuncts, equality, qualify
from streamjoin.sql import property_key, setting_value, statement_settings


@dataclass(frozen=True, kw_only=True)
class LookupLink(Link):
    """Each row enriched with the rows of an external database table with equal keys, looked up
    as the row is processed and recorded in a journal beside the output (streamjoin/joins/lookup.py)."""

    lookup: Lookup
    on: str | None = None

    kind = LinkKind.LOOKUP
    makes_rows = True

    def _check(self, where: str) -> None:
        super()._check(where)
        if self.type not in (JoinType.INNER, JoinType.LEFT):
            raise JobError(
                f"{where}: a lookup join is INNER (a row without a database row is dropped) or LEFT (kept, "
                f"padded); type {self.type} has no meaning for rows looked up for the row"
            )
        if not self.on:
            raise JobError(
                f"{where}: a lookup join needs 'on' with an equality of a stream column and a column of the "
                "database table (Flink's mandatory equality), e.g. on: orders.customer_id = c.id"
            )

    def expressions(self) -> list[tuple[str, str]]:
        return [("on", str(self.on))]


def _made(item: Mapping[str, Any], where: str) -> LookupLink:
    """`lookup: {url, table, user, password_env, driver}` with `on`, named by `as` (YAML)."""
    if item.get("args") or "columns" in item:
        raise JobError(
            f"join with {item['as']!r}: 'args' and 'columns' belong to UNNEST and table-function joins; remove them"
        )
    settings = item["lookup"]
    family.only(settings, {"url", "table", "user", "password_env", "driver"}, f"{where}: lookup")
    text = {
        k: None if settings.get(k) is None else str(settings[k]) for k in ("user", "password_env", "driver")
    }
    table = Lookup(url=str(settings.get("url", "")), table=str(settings.get("table", "")), **text)
    return LookupLink(item["as"], item.get("type", "inner"), lookup=table, on=item.get("on"))


def _sql_declaration(declared: family.SqlDeclaration) -> dict[str, Any] | None:
    """Flink's `CREATE TABLE customers (...) WITH ('connector' = 'jdbc', 'url' = ..., 'table-name' =
    ..., 'username' = ..., 'driver' = ...)`: a database table to look rows up in, not a source; its
    settings as a lookup's. The password only by the name of an environment variable."""
    create, where = declared.statement, declared.where
    properties = create.args.get("properties")
    jdbc = any(
        property_key(p) == "connector" and setting_value(p.args.get("value"), "connector") == "jdbc"
        for p in (properties.expressions if properties else [])
    )
    if not jdbc:
        return None
    allowed = ("connector", "url", "table-name", "username", "password", "password_env", "driver")
    settings = statement_settings(create, allowed, where)
    if "password" in settings:
        raise JobError(
            f"{where}: {declared.at(create)}a password does not belong in a job file; put it in an environment "
            "variable and name that: 'password_env' = 'SHOP_PASSWORD'"
        )
    names = {
        "url": "url",
        "table-name": "table",
        "username": "user",
        "password_env": "password_env",
        "driver": "driver",
    }
    return {names[key]: value for key, value in settings.items() if key in names}


def _sql_made(joined: family.SqlMade) -> str | None:
    """A JOIN of a declared JDBC table makes the rows looked up, named by its alias."""
    table = joined.join.this
    tables = joined.declared.get("lookup", {})
    return table.alias_or_name if isinstance(table, exp.Table) and table.name in tables else None


def _sql_made_join(joined: family.SqlMade) -> dict[str, Any]:
    """Flink's lookup join, `JOIN customers FOR SYSTEM_TIME AS OF o.proc_time AS c ON o.id = c.id`,
    as a join entry. The AS OF time says "when the row is processed" in Flink; here that is when
    its commit is first processed."""
    join, table = joined.join, joined.join.this
    side = (join.args.get("side") or "").upper()
    on = join.args.get("on")
    if side not in ("", "LEFT") or (join.args.get("kind") or "").upper() == "CROSS" or on is None:
        raise JobError(
            f"{joined.where}: {joined.at(table)}a lookup join of {table.name} is JOIN or LEFT JOIN ... ON "
            f"<stream column> = <{table.name} column> (Flink)"
        )
    return {
        "lookup": dict(joined.declared["lookup"][table.name]),
        "as": table.alias_or_name,
        "on": joined.sql(on),
        "type": "left" if side == "LEFT" else "inner",
    }


def _bind(binding: family.Binding) -> dict[str, Any]:
    """The database table's columns (as the job's journal recorded them, else read through JDBC
    now, so an unreachable database is refused before data moves: the catalog's), and the
    condition split into the key equalities (at least one, Flink's rule) and the other terms."""
    link, left, where = binding.link, binding.left, binding.where
    assert isinstance(link, LookupLink) and link.on  # the spec requires a condition
    columns = binding.catalog.database_columns(link.lookup, where, binding.spec.output.side("lookups"))
    made = StructType([StructField(f.name, f.dataType, True) for f in columns.fields])
    seen = {**binding.schemas, link.source: made}
    on = qualify(str(link.on), (*left, link.source), seen, where)
    check_qualifiers(on, (*left, link.source), seen, where)
    equi, residual = [], []
    for term in conjuncts(on, f"{where}: the condition"):
        pair = equality(term, left, link.source)
        if pair:
            equi.append(pair)
        else:
            residual.append(f"({term.sql(dialect='spark')})")
    if not equi:
        raise JobError(
            f"{where}: a lookup join needs an equality of a stream column and a column of {link.lookup.where} "
            f"(Flink's rule: the database is asked by key), e.g. on: {left[0]}.customer_id = {link.source}.id"
        )
    return {"equi": tuple(equi), "residual": " AND ".join(residual) or None, "condition": on, "made": made}


def _explain(plan: Plan, join: BoundJoin, step: int) -> list[str]:
    """`explain`'s text: Flink's form of the join, and how the journal makes it replayable."""
    assert join.made is not None  # the plan binds lookup joins so
    columns = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in join.made.fields)
    condition = " AND ".join(
        [*(f"{a} = {b}" for a, b in join.equi), *([join.residual] if join.residual else [])]
    )
    return [
        f"  {step}. {join.spec.type.upper()} JOIN {join.link(LookupLink).lookup.where} AS {join.right}({columns}) "
        f"[lookup] ON {condition}",
        "     each row enriched with the database's rows of its key as it holds them when the row's commit is "
        f"first processed, recorded in the journal {plan.spec.output.side('lookups')}; later runs read the "
        "journal (commits it lacks are looked up then, and counted)",
    ]


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


family.register(
    family.Family(
        name="lookup",
        links=(LookupLink,),
        made_by=(("lookup", "'lookup'"),),
        made=_made,
        sql=family.SqlSyntax(declaration=_sql_declaration, made=_sql_made, made_join=_sql_made_join),
        bind=_bind,
        explain=_explain,
        operator=LookupJoin.build,
        order=920,  # after the UNNEST and table-function families (joins/lateral.py)
    )
)


def check_databases(spark: SparkSession, plan: Plan) -> None:
    """Connect to each lookup join's database now: a live run asks it for every new commit, so one
    that is down (or lost a column the journal recorded) is refused before the first batch, in one line."""
    for bound in plan.joins:
        if isinstance(bound.spec, LookupLink) and bound.made is not None:
            database.asked(
                spark, bound.spec.lookup, f"job {plan.spec.name!r}, lookup join {bound.right!r}", bound.made
            )
