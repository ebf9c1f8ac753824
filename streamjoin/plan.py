"""Binding a JoinSpec to its sources' schemas: every column, type and expression checked, no data read.

The result, a `Plan`, is what the runners execute and what `streamjoin explain` prints.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import sqlglot
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DataType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)
from sqlglot import exp

from streamjoin import delta_io, family
from streamjoin.catalog import CallsJava, Catalog, Unresolved, of
from streamjoin.delta_io import COMMIT_TIMESTAMP
from streamjoin.errors import JobError
from streamjoin.frames import local_frame
from streamjoin.limits import check_output_names
from streamjoin.links import (
    Conditioned,
    Graced,
    Link,
)
from streamjoin.spec import COMMIT_TIME, JoinSpec, Source
from streamjoin.sql import and_terms
from streamjoin.timeutil import END_OF_INPUT, format_duration, to_micros

_COMPARISONS: dict[type[exp.Expr], str] = {exp.LTE: "<=", exp.GTE: ">=", exp.LT: "<", exp.GT: ">"}
_MIRROR = {"<=": ">=", ">=": "<=", "<": ">", ">": "<"}


@dataclass(frozen=True)
class BoundSource:
    """A source with its schema and the expressions that read its event time."""

    spec: Source
    index: int
    schema: StructType
    keys: tuple[str, ...]
    # The columns the job depends on (selected, a key, in a condition or filter, its time), as the
    # schema spells them: a change to one of them over the versions a run reads is refused (drift.py).
    used: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def commit_time(self) -> bool:
        """`time: commit`: the event time is the commit timestamp (a stream without a time column)."""
        return self.spec.time == COMMIT_TIME

    def raw_time(self) -> Column:
        if self.commit_time:
            return F.col(COMMIT_TIMESTAMP)
        return F.col(f"`{self.spec.time}`")

    def max_future(self) -> int | None:
        """How far (UTC microseconds) an event time may lead its commit time; None: no bound, or
        no event-time column (the commit time is the time)."""
        if not self.spec.time or self.commit_time or self.spec.max_future is None:
            return None
        return to_micros(self.spec.max_future)

    def _time_type(self) -> DataType:
        """The type of the event-time column, asked only of sources that have one (every stream)."""
        assert self.spec.time is not None
        return self.schema[self.spec.time].dataType

    def time_is_timestamp(self) -> bool:
        """The time column is a TIMESTAMP: a filter on it can skip files by their statistics."""
        return not self.commit_time and isinstance(self._time_type(), TimestampType)

    def event_time(self) -> Column:
        """Event time as UTC microseconds; NULL when missing or unparseable."""
        raw = self.raw_time()
        if self.commit_time:
            return F.unix_micros(raw)
        return as_micros(raw, self._time_type(), self.spec.time_format)


def as_micros(raw: Column, kind: DataType, time_format: str | None = None) -> Column:
    """A time column as UTC microseconds: a timestamp, a timestamp_ntz (read as UTC), or a string
    in `time_format`; NULL when missing or unparseable."""
    if isinstance(kind, StringType):
        return F.unix_micros(F.try_to_timestamp(raw, F.lit(time_format)))
    if isinstance(kind, TimestampNTZType):
        return F.unix_micros(raw.cast("timestamp"))
    return F.unix_micros(raw)


@dataclass(frozen=True)
class NamedTime:
    """The time a link looks its table up at when `as_of` names it (`impressions.ts`): a column
    of a stream joined before the link, spelt as its schema spells it."""

    source: str
    column: str
    kind: DataType
    time_format: str | None = None  # the source's, when the column is its string time column

    def micros(self, path: tuple[str, ...] = ()) -> Column:
        """The time as UTC microseconds, the column reached through `path` (an alias, a struct)."""
        column = F.col(".".join(f"`{part}`" for part in (*path, self.column)))
        return as_micros(column, self.kind, self.time_format)


L = TypeVar("L", bound=Link)


@dataclass(frozen=True)
class BoundJoin:
    """One join of the chain with its condition split into key equalities and a residual."""

    spec: Link
    left: tuple[str, ...]
    right: str
    family: str  # the link's kind (a LinkKind)
    equi: tuple[tuple[str, str], ...]
    residual: str | None
    inequality: tuple[str, str, str] | None = None  # ASOF: (left column, operator, right column)
    condition: str | None = None  # the whole ON condition, bare columns named by their source
    # A link that makes rows for each row: the expressions it makes them from, qualified (an
    # UNNEST's array, a function's arguments; none for a lookup), and the made rows' columns.
    made_from: tuple[str, ...] = ()
    made: StructType | None = None
    # A time column of a source before the link that its family reads (an enrichment's `as_of:
    # <source>.<column>`, the time its table is looked up at); None: the row's own event time
    named_time: NamedTime | None = None

    def link(self, kind: type[L]) -> L:
        """The link as the class of its kind, for the family that reads that kind's settings."""
        if not isinstance(self.spec, kind):
            raise TypeError(f"the {self.family} join with {self.right!r} is no {kind.__name__}")
        return self.spec


@dataclass(frozen=True)
class Plan:
    """A job bound to its sources: what the runners execute."""

    spec: JoinSpec
    sources: tuple[BoundSource, ...]
    joins: tuple[BoundJoin, ...]
    select: tuple[str, ...]
    output_columns: tuple[str, ...]
    where: str | None = None  # the job's filter, bare columns named by their source

    def source(self, name: str) -> BoundSource:
        return next(s for s in self.sources if s.name == name)

    @property
    def streams(self) -> tuple[BoundSource, ...]:
        """The append-only event sources, read as arrivals."""
        return tuple(s for s in self.sources if s.spec.kind == "stream")

    @property
    def tables(self) -> tuple[BoundSource, ...]:
        """The keyed sources that change over time, read as changelogs (streamjoin/changelog.py)."""
        return tuple(s for s in self.sources if s.spec.kind == "table")

    def project(self, joined: DataFrame, out_time: Column) -> DataFrame:
        """Apply `where` and `select` to joined rows and add the output event time column."""
        if self.where:
            joined = joined.where(F.expr(self.where))
        return joined.select(
            *[F.expr(e) for e in self.select], F.timestamp_micros(out_time).alias(self.spec.output.time)
        )


def _expand_star(expression: str, schemas: dict[str, StructType]) -> list[str]:
    """`orders.*` as the source's own columns (the joined rows also carry streamjoin's)."""
    name = expression.strip().removesuffix(".*").strip("`")
    if not expression.strip().endswith(".*") or name not in schemas:
        return [expression]
    return [f"{name}.`{field.name}`" for field in schemas[name].fields]


def bind(catalog: Catalog | SparkSession, spec: JoinSpec) -> Plan:
    """Check the job against its sources' schemas, as `catalog` answers them (a Spark session: its
    Delta tables, `catalog.DeltaCatalog`); raise JobError naming what to change. No other I/O."""
    catalog = of(catalog)
    stored = {source.name: catalog.schema(source, f"job {spec.name!r}") for source in spec.sources}
    schemas = _with_family_columns(spec, dict(stored))
    joins = _bind_joins(catalog, spec, schemas)
    select = _bind_select(spec, schemas)
    where = spec.where and qualify(spec.where, spec.names, schemas, f"job {spec.name!r}, where")
    named = [("the select list", e) for e in select] + ([("where", where)] if where else [])
    named += [(f"the condition of the join with {j.right!r}", j.condition) for j in joins if j.condition]
    _check_named_columns(catalog, spec, named, schemas)
    used = _used_columns(spec, joins, tuple(e for _, e in named), stored)
    keys = _join_keys(spec, joins)
    sources = []
    for index, name in enumerate(n for n in spec.names if n in stored):
        source = spec.source(name)
        _check_columns(spec, source, stored[name])
        sources.append(
            BoundSource(source, index, stored[name], tuple(dict.fromkeys(keys[name])), used.get(name, ()))
        )
    output_columns = _check_expressions(
        catalog, spec, schemas, tuple(j.condition for j in joins), where, select
    )
    plan = Plan(spec, tuple(sources), tuple(joins), tuple(select), output_columns, where)
    family.check(plan)
    return plan


def _bind_joins(catalog: Catalog, spec: JoinSpec, schemas: dict[str, StructType]) -> list[BoundJoin]:
    """Each link bound in turn; a lateral link's made rows join `schemas` under its name."""
    joins = []
    for index, join in enumerate(spec.joins):
        left_names = spec.names[: index + 1]
        link = f"job {spec.name!r}, join with {join.source!r}"
        if not isinstance(join, Conditioned):  # rows made for each row: UNNEST, a function, a lookup
            bound = _bind_made(catalog, spec, join, left_names, schemas, link)
            assert bound.made is not None  # a lateral join's made rows have a schema
            schemas[join.source] = bound.made
            joins.append(bound)
            continue
        on = join.on and _as_spelled(qualify(join.on, (*left_names, join.source), schemas, link), schemas)
        joins.append(_bind_join(catalog, spec, join, on, left_names, schemas))
    return joins


def _bind_select(spec: JoinSpec, schemas: dict[str, StructType]) -> tuple[str, ...]:
    """The select list qualified, stars expanded; without one, every column as `<source>_<column>`."""
    if not spec.select:
        return tuple(
            f"{name}.`{field.name}` AS `{name}_{field.name}`"
            for name in spec.names
            for field in schemas[name].fields
        )
    return tuple(
        qualify(item, spec.names, schemas, f"job {spec.name!r}, select item {item!r}")
        for expression in spec.select
        for item in _expand_star(expression, schemas)
    )


def _join_keys(spec: JoinSpec, joins: list[BoundJoin]) -> dict[str, list[str]]:
    """Per source, the columns its equi joins key on."""
    keys: dict[str, list[str]] = {name: [] for name in spec.names}
    for bound in joins:
        for left_col, right_col in bound.equi:
            owner, column = left_col.split(".", 1)
            keys[owner].append(column)
            keys[bound.right].append(right_col.split(".", 1)[1])
    return keys


def _with_family_columns(spec: JoinSpec, schemas: dict[str, StructType]) -> dict[str, StructType]:
    """The schemas that conditions, `where` and `select` see: with the columns a family adds to
    its sides' rows (`Family.schemas`)."""
    for index, join in enumerate(spec.joins):
        plugin = family.of(join.kind)
        if plugin is not None and plugin.schemas is not None:
            schemas = plugin.schemas(spec, join, spec.names[index], schemas)
    return schemas


def _check_columns(spec: JoinSpec, source: Source, schema: StructType) -> None:
    where = f"job {spec.name!r}, source {source.name!r}"
    names = schema.fieldNames()
    for column in source.key:
        if column not in names:
            raise JobError(f"{where}: key column {column!r} does not exist; columns are {', '.join(names)}")
    if source.deleted is not None:
        if source.deleted not in names:
            raise JobError(
                f"{where}: tombstone column {source.deleted!r} (deleted) does not exist; columns are {', '.join(names)}"
            )
        if not isinstance(schema[source.deleted].dataType, BooleanType):
            raise JobError(
                f"{where}: tombstone column {source.deleted!r} must be boolean (true deletes the key), not "
                f"{schema[source.deleted].dataType.simpleString()}"
            )
    if source.time is None or source.time == COMMIT_TIME:
        if source.time_format:
            raise JobError(
                f"{where}: time_format {source.time_format!r} applies to a string event-time column, and this "
                "source has none (its time is the commit time); remove time_format"
            )
        return
    if source.time not in names:
        raise JobError(
            f"{where}: event-time column {source.time!r} does not exist; columns are {', '.join(names)}"
        )
    kind = schema[source.time].dataType
    if isinstance(kind, StringType) and not source.time_format:
        raise JobError(
            f'{where}: event-time column {source.time!r} is a string; add time_format (e.g. "yyyy-MM-dd HH:mm:ss", '
            "or \"yyyy-MM-dd'T'HH:mm:ssX\" for ISO 8601 values such as 2026-12-02T08:22:22Z) or store a timestamp"
        )
    if source.time_format and not isinstance(kind, StringType):
        raise JobError(
            f"{where}: time_format {source.time_format!r} applies to a string column, but event-time column "
            f"{source.time!r} is a {kind.simpleString()}, read as it is; remove time_format"
        )
    if not isinstance(kind, (TimestampType, TimestampNTZType, StringType)):
        raise JobError(
            f"{where}: event-time column {source.time!r} has type {kind.simpleString()}, not a timestamp; "
            "point 'time' at a timestamp column (or a string column with time_format)"
        )


def qualify(expression: str, names: tuple[str, ...], schemas: Mapping[str, StructType], where: str) -> str:
    """`expression` with each bare column named by the one source among `names` that has it, so
    RisingWave's `ON product_id = id` binds as `sales.product_id = products.id`; a bare name that
    two of them have is refused. Unchanged when nothing is bare (or it does not parse: Spark's
    analysis then says why)."""
    try:
        tree = sqlglot.parse_one(expression, read="spark")
    except sqlglot.errors.ParseError:
        return expression
    bound = {p.name.lower() for lam in tree.find_all(exp.Lambda) for p in lam.expressions}
    changed = False

    def name_owner(node: exp.Expr) -> exp.Expr:
        nonlocal changed
        if not isinstance(node, exp.Column) or node.table or isinstance(node.this, exp.Star):
            return node
        column = node.name.lower()
        owners = [n for n in names if column in (f.lower() for f in schemas[n].fieldNames())]
        if column in bound or not owners:
            return node
        if len(owners) > 1:
            raise JobError(
                f"{where}: column {node.name!r} is in {' and '.join(owners)}; say which, e.g. "
                f"{owners[0]}.{node.name}"
            )
        changed = True
        return exp.Column(this=node.this.copy(), table=exp.to_identifier(owners[0]))

    qualified = tree.transform(name_owner)
    return qualified.sql(dialect="spark") if changed else expression


def _source_columns(expression: str, names: tuple[str, ...]) -> list[tuple[str, str]]:
    """The (source, column) pairs `expression` names as `<source>.<column>` (or a field of one,
    `<source>.<column>.<field>`); none when it does not parse (Spark's analysis then says why)."""
    try:
        tree = sqlglot.parse_one(expression, read="spark")
    except sqlglot.errors.ParseError:
        return []
    pairs = []
    for column in tree.find_all(exp.Column):
        if isinstance(column.this, exp.Star):
            continue
        db, table = column.args.get("db"), column.table
        if db is not None and db.name in names:
            pairs.append((db.name, table))
        elif db is None and table in names:
            pairs.append((table, column.name))
    return pairs


def _check_named_columns(
    catalog: Catalog, spec: JoinSpec, named: list[tuple[str, str]], schemas: dict[str, StructType]
) -> None:
    """Refuse `<source>.<column>` where the source has no such column (`named`: what names it, and
    the expression), before Spark's analysis could read it as a field of a column named like the
    source (`t.name` as field `name` of a stream's column `t`). A column the source's log shows
    was dropped or renamed is said so, with the version (drift.missing_column)."""
    for what, expression in named:
        for name, column in _source_columns(expression, spec.names):
            if name not in schemas or spelt_as(schemas[name], column) is not None:
                continue
            source = next((s for s in spec.sources if s.name == name), None)
            location = None if source is None else source.location
            missing = None if source is None else catalog.dropped(source, column)
            detail = missing or f"its columns are {', '.join(schemas[name].fieldNames())}"
            raise JobError(
                f"job {spec.name!r}: {what} does not resolve against the sources' columns: {name}.{column} names "
                f"no column of source {name!r}{f' ({location})' if location else ''}; {detail}"
            )


def _used_columns(
    spec: JoinSpec, joins: list[BoundJoin], expressions: tuple[str, ...], stored: dict[str, StructType]
) -> dict[str, tuple[str, ...]]:
    """Per source, the columns the job depends on, as its schema spells them: those its select,
    filter and conditions name (USING and NATURAL keys too), its primary key, time and tombstone
    columns, and a time column a link names (`BoundJoin.named_time`)."""
    named = [pair for e in expressions for pair in _source_columns(e, tuple(stored))]
    for bound in joins:
        named += [_split_column(side) for pair in bound.equi for side in pair]
        named += [pair for e in bound.made_from for pair in _source_columns(e, tuple(stored))]
        if bound.named_time is not None:
            named.append((bound.named_time.source, bound.named_time.column))
    for source in spec.sources:
        own = (*source.key, source.deleted, None if source.time == COMMIT_TIME else source.time)
        named += [(source.name, column) for column in own if column]
    used: dict[str, list[str]] = {name: [] for name in stored}
    for name, column in named:
        spelt = spelt_as(stored[name], column) if name in stored else None
        if spelt is not None:
            used[name].append(spelt)
    return {name: tuple(dict.fromkeys(columns)) for name, columns in used.items()}


def _split_column(qualified: str) -> tuple[str, str]:
    """`source.column` (a key of `BoundJoin.equi`) as (source, column)."""
    source, column = qualified.split(".", 1)
    return source, column


def spelt_as(schema: StructType, column: str) -> str | None:
    """`column` as `schema` spells it, letter case aside (Spark's resolution); None when no column,
    or more than one, has that name."""
    spelt = [name for name in schema.fieldNames() if name.lower() == column.lower()]
    return spelt[0] if len(spelt) == 1 else None


def _as_spelled(expression: str, schemas: dict[str, StructType]) -> str:
    """`expression` with each column a source qualifies spelt as that source's schema spells it
    (`ticker` of a column `TICKER`): Spark resolves names without regard to letter case, as the
    seed systems do, and the joins look the key and time columns up by their schema names.
    Unchanged when no spelling differs (or it does not parse: Spark's analysis then says why)."""
    try:
        tree = sqlglot.parse_one(expression, read="spark")
    except sqlglot.errors.ParseError:
        return expression
    changed = False

    def respell(node: exp.Expr) -> exp.Expr:
        nonlocal changed
        if not isinstance(node, exp.Column) or node.args.get("db") or node.table not in schemas:
            return node
        spelt = spelt_as(schemas[node.table], node.name)
        if spelt is None or spelt == node.name:
            return node
        changed = True
        return exp.Column(this=exp.to_identifier(spelt), table=node.args["table"].copy())

    spelled = tree.transform(respell)
    return spelled.sql(dialect="spark") if changed else expression


def check_qualifiers(on: str, names: tuple[str, ...], schemas: dict[str, StructType], where: str) -> None:
    """Refuse a condition that qualifies a column by a name that is neither one of the join's
    sources nor a struct column of one (a misspelt alias, a source joined later)."""
    try:
        tree = sqlglot.parse_one(on, read="spark")
    except sqlglot.errors.ParseError:
        return  # `conjuncts` says where it does not parse
    structs = {f.lower() for n in names for f in schemas[n].fieldNames()}
    for column in tree.find_all(exp.Column):
        named = column.table and not column.args.get("db")
        if named and column.table not in names and column.table.lower() not in structs:
            raise JobError(
                f"{where}: the condition names {column.sql(dialect='spark')}, but {column.table!r} is not a "
                f"source of this join ({', '.join(names)}); write <source>.<column>"
            )


def _bind_join(
    catalog: Catalog,
    spec: JoinSpec,
    join: Conditioned,
    on: str | None,
    left_names: tuple[str, ...],
    schemas: dict[str, StructType],
) -> BoundJoin:
    """A link with a source: its condition split into key equalities, an ASOF inequality and
    residual terms (or its USING/NATURAL columns as keys), then bound by its family (`Family.bind`)."""
    where = f"job {spec.name!r}, join with {join.source!r}"
    kind, right = join.kind, join.source  # the spec checked that the kind fits the sources it joins
    if on:
        equi, residual, inequalities = _split_condition(join, on, left_names, schemas, where)
    else:
        equi, residual, inequalities = _shared_columns(join, left_names, schemas, where), [], []
    if not equi and join.type != "cross":
        raise JobError(
            f"{where}: the condition has no equality between a column of {' / '.join(left_names)} and a column of "
            f"{right}; this {kind} join needs one, e.g. on: {left_names[0]}.id = {right}.id (other predicates may follow with AND)"
        )
    plugin = family.of(kind)
    binding = family.Binding(
        catalog, spec, join, left_names, schemas, tuple(equi), tuple(residual), tuple(inequalities), where
    )
    added = plugin.bind(binding) if plugin is not None and plugin.bind is not None else {}
    return BoundJoin(
        join,
        tuple(left_names),
        right,
        kind,
        tuple(equi),
        " AND ".join(residual) or None,
        condition=on,
        **added,
    )


def _split_condition(
    join: Conditioned, on: str, left_names: tuple[str, ...], schemas: dict[str, StructType], where: str
) -> tuple[list[tuple[str, str]], list[str], list[tuple[str, str, str]]]:
    """`on`'s terms as key equalities, inequalities (when its family takes them apart:
    `Family.inequalities`) and residual terms; an equality its family says is its own (a window
    join's equal windows) is no key."""
    plugin = family.of(join.kind)
    own_equality = plugin.own_equality if plugin is not None else None
    takes_inequalities = plugin is not None and plugin.inequalities
    right = join.source
    equi: list[tuple[str, str]] = []
    residual: list[str] = []
    inequalities: list[tuple[str, str, str]] = []
    check_qualifiers(on, (*left_names, right), schemas, where)
    for term in conjuncts(on, f"{where}: the condition"):
        pair = equality(term, left_names, right)
        inequality = _inequality(term, left_names, right) if takes_inequalities else None
        if pair and own_equality is not None and own_equality(pair, where):
            continue  # the family's own, not a key
        if pair:
            equi.append(pair)
        elif inequality:
            inequalities.append(inequality)
        else:
            residual.append(f"({term.sql(dialect='spark')})")
    return equi, residual, inequalities


def _shared_columns(
    join: Conditioned, left_names: tuple[str, ...], schemas: dict[str, StructType], where: str
) -> list[tuple[str, str]]:
    """USING's columns, or NATURAL's (every column name both sides have but those a family adds),
    as key equalities, each of the one source before the link that has it."""
    right = join.source
    if join.natural:
        columns = [
            c
            for n in left_names
            for c in schemas[n].fieldNames()
            if spelt_as(schemas[right], c) and c.lower() not in family.columns()
        ]
        if not columns:
            raise JobError(
                f"{where}: NATURAL finds no column name shared by {', '.join(left_names)} and {right}; use 'on'"
            )
    else:
        columns = list(join.using)
    equi = []
    for column in dict.fromkeys(columns):
        owners = [n for n in left_names if spelt_as(schemas[n], column)]
        right_column = spelt_as(schemas[right], column)
        if right_column is None or not owners:
            raise JobError(f"{where}: USING column {column!r} must exist on both sides; check its spelling")
        if len(owners) > 1:
            raise JobError(
                f"{where}: USING column {column!r} exists in {', '.join(owners)}; use 'on' to say which"
            )
        equi.append((f"{owners[0]}.{spelt_as(schemas[owners[0]], column)}", f"{right}.{right_column}"))
    return equi


def _bind_made(
    catalog: Catalog,
    spec: JoinSpec,
    join: Link,
    left_names: tuple[str, ...],
    schemas: dict[str, StructType],
    where: str,
) -> BoundJoin:
    """A lateral link (rows made for each row), bound whole by its family (`family.Family.bind`):
    its expressions resolved against the row, the columns of the rows it makes."""
    plugin = family.of(join.kind)
    assert plugin is not None and plugin.bind is not None  # every lateral family binds its links
    binding = family.Binding(catalog, spec, join, left_names, schemas, (), (), (), where)
    return BoundJoin(join, left_names, join.source, join.kind, **plugin.bind(binding))


def _inequality(term: exp.Expr, left_names: tuple[str, ...], right: str) -> tuple[str, str, str] | None:
    """`a.x <op> b.y` between a left and the right source, as (left column, op, right column)."""
    op = _COMPARISONS.get(type(term))
    columns = _column_pair(term)
    if op is None or columns is None:
        return None
    (a_src, a_col), (b_src, b_col) = columns
    if a_src in left_names and b_src == right:
        return f"{a_src}.{a_col}", op, f"{b_src}.{b_col}"
    if b_src in left_names and a_src == right:
        return f"{b_src}.{b_col}", _MIRROR[op], f"{a_src}.{a_col}"
    return None


def equality(term: exp.Expr, left_names: tuple[str, ...], right: str) -> tuple[str, str] | None:
    """`a.x = b.y` between a left and the right source, as (left column, right column)."""
    columns = _column_pair(term) if isinstance(term, exp.EQ) else None
    if columns is None:
        return None
    (a_src, a_col), (b_src, b_col) = columns
    if a_src in left_names and b_src == right:
        return f"{a_src}.{a_col}", f"{b_src}.{b_col}"
    if b_src in left_names and a_src == right:
        return f"{b_src}.{b_col}", f"{a_src}.{a_col}"
    return None


def _column_pair(term: exp.Expr) -> tuple[tuple[str, str], tuple[str, str]] | None:
    """A comparison of two source-qualified columns, as ((source, column), (source, column))."""
    left, right = term.args.get("this"), term.args.get("expression")
    if not (isinstance(left, exp.Column) and isinstance(right, exp.Column) and left.table and right.table):
        return None
    return (left.table, left.name), (right.table, right.name)


def conjuncts(expression: str, where: str = "condition") -> list[exp.Expr]:
    """The top-level AND terms of a SQL condition, parsed (Spark's dialect), parentheses around a
    conjunction opened: `BETWEEN a AND b` and `CASE WHEN x AND y ...` stay whole. A condition that
    does not parse raises JobError with the line and column."""
    try:
        tree = sqlglot.parse_one(expression, read="spark")
    except sqlglot.errors.ParseError as exc:
        error = exc.errors[0] if exc.errors else {}
        at = f" at line {error['line']}, column {error['col']}" if error.get("line") else ""
        near = f" (near {error['highlight']!r})" if error.get("highlight") else ""
        raise JobError(
            f"{where} {expression!r} does not parse as a SQL condition{at}{near}: write it as Spark SQL, "
            "e.g. a.id = b.id AND b.amount > 0"
        ) from None
    return and_terms(tree)


def split_conjuncts(expression: str) -> list[str]:
    """The top-level AND terms of a condition, as SQL text (`conjuncts`)."""
    return [term.sql(dialect="spark") for term in conjuncts(expression)]


def _check_expressions(
    catalog: Catalog,
    spec: JoinSpec,
    schemas: dict[str, StructType],
    conditions: tuple[str | None, ...],
    where: str | None,
    select: tuple[str, ...],
) -> tuple[str, ...]:
    """Let the catalog resolve every expression against the sources' schemas, each over the
    sources joined where it stands; the output columns the select list makes."""

    def analyse(what: str, place: str, upto: int, texts: tuple[str, ...], condition: bool) -> StructType:
        scope = {n: schemas[n] for n in spec.names[:upto]}
        try:
            return catalog.analyse(scope, texts, condition=condition)
        except Unresolved as exc:
            raise JobError(
                f"job {spec.name!r}: {what} does not resolve against the sources' columns: {exc}"
            ) from None
        except CallsJava as call:
            raise call.refusal(f"job {spec.name!r}, {place}") from None

    for step, (join, on) in enumerate(zip(spec.joins, conditions, strict=True), 2):
        if on:
            what = f"the condition of the join with {join.source!r} ({on})"
            analyse(what, f"join with {join.source!r}, on", step, (on,), True)
    everything = len(spec.names)
    if where:
        analyse(f"where ({where})", "where", everything, (where,), True)
    columns = analyse("the select list", "select", everything, select, False).fieldNames()
    _check_output_columns(spec, columns)
    return tuple(columns)


def _check_output_columns(spec: JoinSpec, columns: list[str]) -> None:
    """Each output column named once, with a name Delta takes, and none reserved or missing."""
    duplicates = sorted({c for c in columns if columns.count(c) > 1})
    if duplicates:
        raise JobError(
            f"job {spec.name!r}: the select list names {', '.join(duplicates)} more than once; give each output column its own alias"
        )
    check_output_names(columns, f"job {spec.name!r}")
    if spec.output.time in columns:
        raise JobError(
            f"job {spec.name!r}: output column {spec.output.time!r} is reserved for the output event time; "
            "rename that select item or set output.time to another name"
        )
    for column in spec.output.partition_by:
        if column not in columns and column != spec.output.time:
            raise JobError(
                f"job {spec.name!r}: output.partition_by names {column!r}, which the select list does not produce"
            )


def grace_warnings(spark: SparkSession, plan: Plan) -> list[str]:
    """Joins whose grace is shorter than how far a source's commits trail their rows' event times
    (`lag.commit_lags`: commit time minus the oldest event time of each of its newest commits), and
    what the families warn of (`Family.warnings`: stream-stream links whose grace lets the rows of
    the link before arrive late). Lateness counts from the newest event time any source has
    committed, never later than the newest commit, so a grace at least a source's lag keeps its
    rows on time."""
    from streamjoin.lag import commit_lags

    warnings = family.warnings(plan)
    for step, join in enumerate(plan.joins, 1):
        plugin = family.of(join.family)
        judged = plugin.graced(join) if plugin is not None and plugin.graced is not None else ()
        if not judged:
            continue
        grace = join.link(Graced).grace
        for name in judged:
            lags = commit_lags(spark, plan.source(name))
            if lags is not None and lags.unknown:
                warnings.append(
                    f"join {step} ({join.spec.type.upper()} JOIN {join.right}): how far the commits of source "
                    f"{name!r} trail their rows cannot be measured ({lags.unknown}), so grace "
                    f"({format_duration(grace)}) is not checked against it"
                )
            if lags is None or not lags.beyond(grace):
                continue
            warnings.append(
                f"join {step} ({join.spec.type.upper()} JOIN {join.right}): {lags.beyond(grace)} of the last "
                f"{len(lags.lags)} commits of source {name!r} hold rows more than grace ({format_duration(grace)}) "
                f"older than the commit (its commits' oldest rows trail them by {format_duration(lags.median)} at "
                f"the median, {format_duration(lags.largest)} at most). A row more than grace behind the newest "
                "event time of any source is late: expect late rows. Set grace to at least "
                f"{format_duration(lags.largest)}"
            )
    return warnings


TIME_SAMPLE = 1000  # the non-NULL values of a string event-time column that validate-job parses
_ISO_8601 = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:(?P<sep>[T ])\d{2}:\d{2}(?P<seconds>:\d{2}(?P<fraction>[.,]\d{1,9})?)?)?"
    r"(?P<zone>Z|[+-]\d{2}(?P<minutes>:?\d{2})?)?"
)


def iso_8601_format(value: str) -> str | None:
    """The Spark datetime pattern that reads `value` when it has an ISO 8601 shape
    (`2026-12-02T08:22:22Z` -> `yyyy-MM-dd'T'HH:mm:ssX`), else None. A fraction of a second is
    optional in the pattern (`[.SSSSSS]`), since writers often leave out a zero fraction."""
    shape = _ISO_8601.fullmatch(value)
    if not shape:
        return None
    pattern = "yyyy-MM-dd"
    if shape["sep"]:
        pattern += ("'T'" if shape["sep"] == "T" else " ") + "HH:mm"
        if shape["seconds"]:
            pattern += ":ss"
            if shape["fraction"]:
                digits = len(shape["fraction"]) - 1
                pattern += f"[{shape['fraction'][0]}{'S' * (6 if digits <= 6 else 9)}]"
    zone = shape["zone"]
    if zone:
        pattern += "X" if zone == "Z" or not shape["minutes"] else ("XXX" if ":" in zone else "XX")
    return pattern


def time_format_warnings(spark: SparkSession, plan: Plan) -> list[str]:
    """Check each string event-time column against its data: up to TIME_SAMPLE non-NULL values at
    the source's newest version, parsed as the runners parse them (`BoundSource.event_time`).

    Raise JobError when time_format parses none of them (every row would be rejected as
    `unparseable_event_time`), naming the source, column, format and a value, with the format
    that fits when the values look like ISO 8601; return a warning per source where it parses some."""
    warnings = []
    for source in plan.sources:
        if source.commit_time or not source.spec.time or not isinstance(source._time_type(), StringType):
            continue
        column, given = source.spec.time, source.spec.time_format
        assert given is not None  # a string time column without time_format is refused by bind
        raw = source.raw_time()
        values = [
            r[0]
            for r in delta_io.read_snapshot(spark, source.spec.location)
            .where(raw.isNotNull())
            .select(raw)
            .limit(TIME_SAMPLE)
            .collect()
        ]
        if not values:
            continue
        sample = local_frame(spark, [(v,) for v in values], StructType([StructField(column, StringType())]))
        failed = source.event_time().isNull()
        counted = sample.agg(
            F.count(F.when(failed, 1)), F.first(F.when(failed, raw), ignorenulls=True)
        ).first()
        assert counted is not None  # an aggregate without grouping has one row
        bad, bad_value = counted
        if not bad:
            continue
        suggested = iso_8601_format(bad_value)
        fits = (
            suggested is not None
            and not sample.where(F.try_to_timestamp(raw, F.lit(suggested)).isNull()).limit(1).count()
        )
        where = f"job {plan.spec.name!r}, source {source.name!r}"
        advice = (
            f'; the values look like ISO 8601: write time_format: "{suggested}"'
            if fits
            else "; write the Spark datetime pattern of those values (docs/job-spec.md, time_format)"
        )
        if bad == len(values):
            raise JobError(
                f"{where}: time_format {given!r} parses none of {len(values)} values of event-time column "
                f"{column!r} sampled at its newest version, e.g. {bad_value!r}: every row would be rejected as "
                f"unparseable_event_time{advice}"
            )
        warnings.append(
            f"{where}: time_format {given!r} does not parse {bad} of {len(values)} values of event-time column "
            f"{column!r} sampled at its newest version, e.g. {bad_value!r}; such rows are rejected as "
            f"unparseable_event_time (in {plan.spec.output.side('rejected')}){advice}"
        )
    return warnings


def describe(
    plan: Plan, versions: dict[str, int] | None = None, margins: dict[str, tuple[int, int]] | None = None
) -> str:
    """The resolved plan as `streamjoin explain` prints it; `margins`: the join operator's, per
    stream (microseconds before a replay slice's start and after its end)."""
    spec = plan.spec
    lines = [f"job {spec.name}" + (f": {spec.meta.description}" if spec.meta.description else ""), "sources:"]
    for source in plan.sources:
        s = source.spec
        version = f", pinned version {versions[s.name]}" if versions and s.name in versions else ""
        time = (
            ", event time = commit timestamp (time: commit)"
            if source.commit_time
            else f", event time {s.time} ({plan.source(s.name).schema[s.time].dataType.simpleString()})"
            if s.time
            else ""
        )
        keys = f", join keys {', '.join(source.keys)}" if source.keys else ""
        future = (
            ""
            if not s.time
            else ", no bound on future event times"
            if s.max_future is None
            else f", rows more than {format_duration(s.max_future)} ahead of their commit rejected (max_future)"
        )
        lines.append(f"  [{source.index}] {s.name}: {s.kind} at {s.location}{time}{keys}{version}{future}")
    lines.append("join chain (applied in the order written):")
    for step, join in enumerate(plan.joins, 1):
        lines += (
            _describe_made(plan, join, step) if join.made is not None else _describe_link(plan, join, step)
        )
        lines.append(f"     link: {link_words(join.spec)}")
    if margins:
        reads = ", ".join(
            f"{name} whole (ROWS windows)"
            if max(before, after) >= END_OF_INPUT
            else f"{name} from start - {format_duration(timedelta(microseconds=before))} "
            f"to end + {format_duration(timedelta(microseconds=after))}"
            for name, (before, after) in margins.items()
        )
        lines.append(f"replay slice [start, end) reads stream rows by event time: {reads}")
    if plan.where:
        lines.append(f"where: {plan.where}")
    out = spec.output
    lines.append(
        f"output: {out.location} columns {', '.join(plan.output_columns)} + {out.time} (output event time)"
        + (f", partitioned by {', '.join(out.partition_by)}" if out.partition_by else "")
    )
    lines.append(
        f"side tables: {out.side('late')}, {out.side('rejected')}; run metrics: {out.side('metrics')}"
    )
    return "\n".join(lines)


def link_words(link: Link) -> str:
    """The typed link as `explain` prints it: its class and the settings it holds."""
    settings = {
        k: v for k, v in link.settings().items() if k not in ("kind", "source") and v not in (None, [], False)
    }
    return f"{type(link).__name__}(" + ", ".join(f"{k}={v}" for k, v in settings.items()) + ")"


def _describe_link(plan: Plan, join: BoundJoin, step: int) -> list[str]:
    """A link with a source as `explain` prints it: its condition, then what its kind decides."""
    j = join.spec
    equalities = " AND ".join(f"{a} = {b}" for a, b in join.equi)
    condition = (
        " (every pair in the time bounds)"
        if j.type == "cross"
        else f" ON {equalities}" + (f" AND {join.residual}" if join.residual else "")
    )
    lines = [f"  {step}. {j.type.upper()} JOIN {join.right} [{join.family}]{condition}"]
    plugin = family.of(join.family)
    if plugin is not None and plugin.explain is not None:
        lines += plugin.explain(plan, join, step)
    return lines


def as_json(
    plan: Plan, versions: dict[str, int] | None = None, margins: dict[str, tuple[int, int]] | None = None
) -> dict:
    """The resolved plan as `streamjoin explain --json` prints it (what `describe` says, as data;
    durations in seconds)."""
    spec = plan.spec

    def seconds(value: timedelta) -> float:
        return value.total_seconds()

    return {
        "job": spec.name,
        "sources": [
            {
                "name": s.name,
                "kind": s.spec.kind,
                "location": s.spec.location,
                "time": s.spec.time,
                "keys": list(s.keys),
                "primary_key": list(s.spec.key),
                "version": (versions or {}).get(s.name),
                "max_future_s": None
                if s.spec.max_future is None or not s.spec.time
                else seconds(s.spec.max_future),
                "replay_margins_s": None
                if not margins or s.name not in margins
                else [m / 1_000_000 for m in margins[s.name]],
            }
            for s in plan.sources
        ],
        "joins": [
            {
                "step": step,
                "type": j.spec.type,
                "source": j.right,
                "family": j.family,
                "equalities": [list(pair) for pair in j.equi],
                "residual": j.residual,
                "grace_s": seconds(j.spec.grace) if isinstance(j.spec, Graced) else None,
                "link": j.spec.settings(),
                **_family_json(j),
                "lateral": None
                if j.made is None
                else {"expressions": list(j.made_from), "columns": j.made.fieldNames()},
            }
            for step, j in enumerate(plan.joins, 1)
        ],
        "where": plan.where,
        "output": {
            "location": spec.output.location,
            "columns": list(plan.output_columns),
            "time": spec.output.time,
            "partition_by": list(spec.output.partition_by),
            "late": spec.output.side("late"),
            "rejected": spec.output.side("rejected"),
            "metrics": spec.output.side("metrics"),
        },
    }


def _family_json(join: BoundJoin) -> dict[str, Any]:
    """The keys the families add to a join's JSON: this join's family's values, None for the rest."""
    plugin = family.of(join.family)
    own = plugin.explain_json(join) if plugin is not None and plugin.explain_json is not None else {}
    return dict.fromkeys(family.json_keys()) | own


def _describe_made(plan: Plan, join: BoundJoin, step: int) -> list[str]:
    """A lateral link as `explain` prints it: its family's text, header included."""
    plugin = family.of(join.family)
    assert plugin is not None and plugin.explain is not None  # every lateral family explains its links
    return plugin.explain(plan, join, step)
