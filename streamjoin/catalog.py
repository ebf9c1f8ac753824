"""What binding asks of the world: sources' schemas, expressions' types, a database table's
columns, a table function's columns (issue 78, "pure binding").

`plan.bind(catalog, job)` does no I/O of its own; every question goes through a `Catalog`:

- `DeltaCatalog(spark)`: the Delta tables and Spark's analyser (what a run uses), with the lookup
  tables' columns answered through JDBC and the job's journal (`JdbcColumns`);
- `MemoryCatalog(...)`: schemas given as StructTypes, expressions resolved and typed by sqlglot
  (or as declared), no JVM: what the spec and binding tests use.

A catalog refuses an expression with `Unresolved` (Spark's message, or one in its words) or
`CallsJava`; the binder turns both into the job's refusal, in the words of where it stands.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING, Protocol

import sqlglot
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    NullType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from sqlglot import exp
from sqlglot.optimizer.annotate_types import annotate_types

from streamjoin import database, delta_io, drift, functions
from streamjoin.errors import JobError
from streamjoin.limits import JAVA_CALLS_BY_NAME, calls_java

if TYPE_CHECKING:  # for annotations only: the families' modules import the binder, which imports this
    from streamjoin.database import Lookup
    from streamjoin.spec import Source


class Unresolved(Exception):
    """An expression does not resolve against the columns in scope; the text says why."""


class CallsJava(Exception):
    """An expression calls a Java method by reflection: (the expression, the function as spelt)."""

    def __init__(self, expression: str, function: str) -> None:
        super().__init__(expression, function)
        self.expression, self.function = expression, function

    def refusal(self, what: str) -> JobError:
        """The job's refusal, `what` naming where the expression stands: a job file may run Spark's
        functions and the table functions installed with it, never any Java code it names."""
        return JobError(
            f"{what}: {self.expression!r} calls {self.function}, which runs any Java method it is given; a job "
            "file may not call arbitrary Java code (reflect, java_method and try_reflect are refused): compute "
            "the value with Spark's built-in functions, or with a table function (function: module:udtf) "
            "installed with the job"
        )


class Catalog(Protocol):
    """The answers binding needs; each implementation reads them from its own world."""

    def schema(self, source: Source, where: str) -> StructType:
        """The source's schema; JobError (prefixed `where`) when there is no such table."""
        ...

    def dropped(self, source: Source, column: str) -> str | None:
        """Why `source` has no `column` although it once had one (renamed or dropped, and when),
        with what to do; None when it never had it as far as the catalog knows."""
        ...

    def analyse(
        self, scope: Mapping[str, StructType], expressions: Sequence[str], *, condition: bool = False
    ) -> StructType:
        """The columns `SELECT expressions` makes over the sources of `scope` (by name, in join
        order); `condition`: the one expression is a filter instead. Raises Unresolved, CallsJava."""
        ...

    def database_columns(self, table: Lookup, where: str, journal: str) -> StructType:
        """The columns of a database table a job looks rows up in (`journal`: where the job records
        its answers)."""
        ...

    def function_columns(self, reference: str, where: str) -> StructType:
        """The columns of the rows the table function `module:attribute` makes (loads user code)."""
        ...


# ------------------------------------------------------------------ Delta tables, Spark's analyser


@dataclass
class JdbcColumns:
    """A database table's columns as the job's journal recorded them, else read through JDBC
    (`database.columns`: a connection, refused when the database cannot be reached)."""

    spark: SparkSession

    def __call__(self, table: Lookup, where: str, journal: str) -> StructType:
        return database.columns(self.spark, table, where, journal)


@dataclass
class DeltaCatalog:
    """The catalog a run binds with: Delta tables, Spark's analysis, JDBC for database tables,
    table functions imported from the job's modules."""

    spark: SparkSession
    database: Callable[[Lookup, str, str], StructType] | None = None
    _frames: dict[tuple[str, str], DataFrame] = field(default_factory=dict, repr=False)

    def schema(self, source: Source, where: str) -> StructType:
        if not delta_io.exists(self.spark, source.location):
            raise JobError(
                f"{where}: source {source.name!r} at {source.location!r} is not a Delta table; create it or fix the path"
            )
        return delta_io.schema(self.spark, source.location)

    def dropped(self, source: Source, column: str) -> str | None:
        return drift.missing_column(self.spark, source.location, column, source.name)

    def analyse(
        self, scope: Mapping[str, StructType], expressions: Sequence[str], *, condition: bool = False
    ) -> StructType:
        joined = reduce(DataFrame.crossJoin, (self._frame(name, schema) for name, schema in scope.items()))
        try:
            if condition:
                frame = joined.where(F.expr(expressions[0]))
            else:
                frame = joined.select(*[F.expr(e) for e in expressions])
        except AnalysisException as exc:
            raise Unresolved(str(exc).strip().splitlines()[0]) from None
        call = calls_java(frame, expressions)
        if call is not None:
            raise CallsJava(*call)
        return frame.schema

    def _frame(self, name: str, schema: StructType) -> DataFrame:
        """An empty frame of `schema` named `name`, made once per catalog."""
        key = (name, schema.json())
        if key not in self._frames:
            self._frames[key] = self.spark.createDataFrame([], schema).alias(name)
        return self._frames[key]

    def database_columns(self, table: Lookup, where: str, journal: str) -> StructType:
        return (self.database or JdbcColumns(self.spark))(table, where, journal)

    def function_columns(self, reference: str, where: str) -> StructType:
        returned = functions.load(reference, where).returnType
        assert isinstance(returned, StructType)  # `load` refuses any other
        return returned


def of(catalog: Catalog | SparkSession) -> Catalog:
    """A catalog; a Spark session stands for its Delta catalog (how runs and most callers bind)."""
    return DeltaCatalog(catalog) if isinstance(catalog, SparkSession) else catalog


# ------------------------------------------------------------------ in memory, no JVM


@dataclass
class MemoryCatalog:
    """Sources' schemas by location, database tables' columns by `Lookup.where`, table functions'
    columns by reference; expressions resolved against the schemas and typed by sqlglot, or by
    `types` (expression text -> type) where sqlglot cannot tell. Java calls refused by name."""

    tables: Mapping[str, StructType]
    databases: Mapping[str, StructType] = field(default_factory=dict)
    functions: Mapping[str, StructType] = field(default_factory=dict)
    types: Mapping[str, DataType] = field(default_factory=dict)

    def schema(self, source: Source, where: str) -> StructType:
        if source.location not in self.tables:
            raise JobError(
                f"{where}: source {source.name!r} at {source.location!r} is not a table of the catalog "
                f"(it has {', '.join(sorted(self.tables))}); add it or fix the path"
            )
        return self.tables[source.location]

    def dropped(self, source: Source, column: str) -> str | None:
        return None  # a schema given in memory has no history

    def analyse(
        self, scope: Mapping[str, StructType], expressions: Sequence[str], *, condition: bool = False
    ) -> StructType:
        fields = []
        for text in expressions:
            tree = _parsed(text)
            _refuse_java_by_name(tree, text)
            fields += list(_Resolver(scope, self.types).fields(tree, text))
        return StructType(fields)

    def database_columns(self, table: Lookup, where: str, journal: str) -> StructType:
        if table.where not in self.databases:
            raise JobError(f"{where}: the catalog has no database table {table.where}")
        return self.databases[table.where]

    def function_columns(self, reference: str, where: str) -> StructType:
        if reference not in self.functions:
            raise JobError(f"{where}: the catalog has no table function {reference}")
        return self.functions[reference]


def _parsed(text: str) -> exp.Expr:
    try:
        return sqlglot.parse_one(text, read="spark")
    except sqlglot.errors.ParseError as exc:
        raise Unresolved(f"{text!r} does not parse: {str(exc).splitlines()[0]}") from None


def _refuse_java_by_name(tree: exp.Expr, text: str) -> None:
    """CallsJava when `tree` calls reflect, java_method or try_reflect by name (a name built at
    run time, IDENTIFIER(...), does not parse here: Unresolved)."""
    for call in tree.find_all(exp.Anonymous):
        if call.name.lower() in JAVA_CALLS_BY_NAME:
            raise CallsJava(text, call.name)


# Spark's types of the scalar types sqlglot annotates (what an in-memory select may need).
_SCALARS: dict[exp.DType, DataType] = {
    exp.DType.BOOLEAN: BooleanType(),
    exp.DType.INT: IntegerType(),
    exp.DType.BIGINT: LongType(),
    exp.DType.DOUBLE: DoubleType(),
    exp.DType.VARCHAR: StringType(),
    exp.DType.TEXT: StringType(),
    exp.DType.DATE: DateType(),
    exp.DType.TIMESTAMP: TimestampType(),
}


@dataclass
class _Resolver:
    """Columns of an expression resolved as Spark resolves them: `<source>.<column>[.<field>]`, a
    bare column exactly one source has, a field of a struct column; letter case aside."""

    scope: Mapping[str, StructType]
    types: Mapping[str, DataType]

    def fields(self, tree: exp.Expr, text: str) -> Iterator[StructField]:
        """The output column(s) of `tree`: a star's columns, else one named as Spark names it."""
        if isinstance(tree, exp.Star):
            yield from (f for schema in self.scope.values() for f in schema.fields)
            return
        bound = {p.name.lower() for lam in tree.find_all(exp.Lambda) for p in lam.expressions}
        for column in tree.find_all(exp.Column):
            if not isinstance(column.this, exp.Star) and column.name.lower() not in bound:
                self.column(column)
        inner = tree.this if isinstance(tree, exp.Alias) else tree
        yield StructField(self.name(tree, inner), self.kind(inner, text), True)

    def column(self, column: exp.Column) -> DataType:
        """The type of a column reference; Unresolved when nothing in scope has it."""
        parts = [p.name for p in column.parts]
        owner = self._owner(parts[0])
        if owner is not None and len(parts) > 1:
            schema, path = self.scope[owner], parts[1:]
        else:
            schema, path = self._bare(parts[0], column), parts
        kind: DataType = schema
        for part in path:
            named = (
                [f for f in kind.fields if f.name.lower() == part.lower()]
                if isinstance(kind, StructType)
                else []
            )
            if len(named) != 1:
                raise Unresolved(
                    f"column {column.sql(dialect='spark')} cannot be resolved; the columns in scope are "
                    + ", ".join(f"{n}.{f}" for n, s in self.scope.items() for f in s.fieldNames())
                )
            kind = named[0].dataType
        return kind

    def _owner(self, name: str) -> str | None:
        return next((n for n in self.scope if n.lower() == name.lower()), None)

    def _bare(self, name: str, column: exp.Column) -> StructType:
        """The schema of the one source that has a column `name` (as a one-field struct)."""
        owners = [s for s in self.scope.values() if any(f.lower() == name.lower() for f in s.fieldNames())]
        if len(owners) > 1:
            raise Unresolved(
                f"column {column.sql(dialect='spark')} is ambiguous: {len(owners)} sources have it"
            )
        return owners[0] if owners else StructType()

    def name(self, tree: exp.Expr, inner: exp.Expr) -> str:
        """An alias; a column's name as its schema spells it; else the expression's text."""
        if isinstance(tree, exp.Alias):
            return tree.alias
        if isinstance(inner, exp.Column):
            parts = [p.name for p in inner.parts]
            return next(
                (
                    f.name
                    for s in self.scope.values()
                    for f in s.fields
                    if f.name.lower() == parts[-1].lower()
                ),
                parts[-1],
            )
        return inner.sql(dialect="spark", normalize_functions="lower")

    def kind(self, inner: exp.Expr, text: str) -> DataType:
        """Its type: as declared, a column's, else sqlglot's annotation (NullType: unknown)."""
        if text in self.types:
            return self.types[text]
        if isinstance(inner, exp.Column):
            return self.column(inner)
        schema: dict[str, object] = {
            n: {f.name: f.dataType.simpleString() for f in s.fields} for n, s in self.scope.items()
        }
        annotated = annotate_types(inner.copy(), schema=schema, dialect="spark").type
        return NullType() if annotated is None else _SCALARS.get(annotated.this, NullType())
