"""Lateral joins (Flink): each stream row joined with rows made from the row itself.

- **UNNEST** (`unnest: orders.tags`, Flink's `CROSS JOIN UNNEST(tags) AS t (tag)`): one row per
  element of an array (a struct element's fields become columns) or per entry of a map (`key`,
  `value`).
- **Table functions** (`function: module:udtf`, Flink's `LATERAL TABLE(f(x))`): the rows a Spark
  Python UDTF yields for the row's arguments (`streamjoin.functions`).

INNER (and CROSS) drops a row that makes no row (an empty or NULL array, a call that yields
nothing); LEFT keeps it once, the made columns NULL (Flink's `LEFT JOIN ... ON TRUE`). A row is
decided as it arrives: its answer depends on nothing else, so nothing is late, nothing waits, and
no state is kept. Output event time is the row's own. Accounting per input row: `joined` when it
made at least one row, else `unmatched_emitted` (LEFT) or `unmatched_dropped` (INNER), counted in
the pass that writes the output.

A replay equals the live run because the made rows are a function of the row: a table function
must depend on its arguments alone (no clock, no randomness, no outside lookups; a lookup join
records outside answers).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlglot import exp

from streamjoin import family
from streamjoin.enums import JoinType, LinkKind
from streamjoin.errors import JobError
from streamjoin.links import NAME, Link
from streamjoin.spec import name_list
from streamjoin.sql import created_name, statement_head

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructField, StructType

    from streamjoin.plan import BoundJoin, Plan


@dataclass(frozen=True)
class Made(Link):
    """A lateral link: each row joined with rows made from it (Flink's UNNEST and LATERAL TABLE),
    INNER (a row that makes none is dropped) or LEFT (kept, padded); `columns` names the made rows'
    columns (default: the element's, or the function's)."""

    columns: tuple[str, ...] = ()

    makes_rows = True

    def _check(self, where: str) -> None:
        super()._check(where)
        object.__setattr__(self, "columns", tuple(self.columns))
        if self.type not in (JoinType.INNER, JoinType.LEFT, JoinType.CROSS):
            raise JobError(
                f"{where}: {self.what} join is INNER (CROSS JOIN UNNEST, a row with no element is dropped) or LEFT "
                f"(the row kept, padded); type {self.type} has no meaning for rows made from the row itself"
            )
        if self.type == JoinType.CROSS:
            object.__setattr__(self, "type", JoinType.INNER)  # CROSS JOIN UNNEST(...) is Flink's inner form
        for name in self.columns:
            if not NAME.match(name):
                raise JobError(f"{where}: column name {name!r} must be an identifier (letters, digits, _)")
        if len(set(self.columns)) != len(self.columns):
            raise JobError(f"{where}: columns {list(self.columns)} name a column twice")

    @property
    def what(self) -> str:
        """The kind of join in messages: "an UNNEST", "a table-function"."""
        return "an UNNEST" if self.kind == LinkKind.UNNEST else "a table-function"


@dataclass(frozen=True, kw_only=True)
class UnnestLink(Made):
    """Each row joined with the elements of an array (or the entries of a map) it holds."""

    unnest: str

    kind = LinkKind.UNNEST

    def expressions(self) -> list[tuple[str, str]]:
        return [("unnest", self.unnest)]


@dataclass(frozen=True, kw_only=True)
class FunctionLink(Made):
    """Each row joined with the rows a Python table function (a Spark UDTF, `module:attribute`)
    returns for `args`, expressions over the row."""

    function: str
    args: tuple[str, ...] = ()

    kind = LinkKind.FUNCTION

    def _check(self, where: str) -> None:
        super()._check(where)
        object.__setattr__(self, "args", tuple(self.args))
        if not re.match(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", self.function):
            raise JobError(
                f"{where}: function {self.function!r} should name a Spark Python UDTF as module:attribute, e.g. "
                "function: mypackage.functions:split_words"
            )

    def expressions(self) -> list[tuple[str, str]]:
        return [(f"argument {n + 1}", arg) for n, arg in enumerate(self.args)]


def _made(item: Mapping[str, Any], where: str) -> Made:
    """`unnest: orders.tags` or `function: pkg.mod:udtf` with `args`, named by `as`, its columns
    renamed by `columns` (YAML); no condition but `on: true` (Flink's ON TRUE)."""
    link, kind_type = f"join with {item['as']!r}", item.get("type", "inner")
    what = "an UNNEST" if "unnest" in item else "a table-function"
    on = item.get("on")
    if on is not None and str(on).strip().lower() != "true":
        raise JobError(
            f"{link}: {what} join pairs each row with the rows made from it and takes no condition "
            "(Flink: ON TRUE); remove 'on'/'using'/'natural' and filter in 'where'"
        )
    columns, args = name_list(item.get("columns")), item.get("args", [])
    if "unnest" in item:
        if args:
            raise JobError(f"{link}: 'args' are a table function's; UNNEST takes its array in 'unnest'")
        return UnnestLink(item["as"], kind_type, columns, unnest=str(item["unnest"]))
    return FunctionLink(
        item["as"], kind_type, columns, function=str(item["function"]), args=tuple(str(a) for a in args)
    )


def _sql_function(declared: family.SqlDeclaration) -> dict[str, Any] | None:
    """Flink's `CREATE [TEMPORARY] FUNCTION name AS 'module.attribute' LANGUAGE PYTHON`: the table
    function `module:attribute` (a Spark Python UDTF)."""
    statement = declared.statement
    if statement.args.get("kind") != "FUNCTION":
        return None
    name, target = created_name(statement), statement.expression
    language = next(
        (p.this.name.upper() for p in statement.find_all(exp.LanguageProperty) if p.this is not None), None
    )
    path = target.this if isinstance(target, exp.Literal) and target.is_string else ""
    module, _, attribute = path.rpartition(".")
    if language != "PYTHON" or not module:
        raise JobError(
            f"{declared.where}: {declared.at(statement)}function {name}: declare a Spark Python UDTF as CREATE "
            f"TEMPORARY FUNCTION {name} AS 'module.udtf' LANGUAGE PYTHON"
        )
    return {"function": f"{module}:{attribute}"}


def _sql_unnested(joined: family.SqlMade) -> str | None:
    """`UNNEST(...) AS t (...)` makes rows named by its alias."""
    item = joined.join.this
    return item.alias if isinstance(item, exp.Unnest) else None


def _sql_called(joined: family.SqlMade) -> str | None:
    """`LATERAL TABLE(f(x)) t(...)` makes rows named by its alias."""
    item = joined.join.this
    return item.alias if isinstance(item, exp.Lateral) else None


def _sql_made_join(joined: family.SqlMade) -> dict[str, Any]:
    """Flink's `CROSS JOIN UNNEST(tags) AS t (tag)`, `, LATERAL TABLE(f(x)) t(res)` and `LEFT JOIN
    LATERAL TABLE(f(x)) t(res) ON TRUE` as a join entry (`f` declared by CREATE FUNCTION)."""
    join, item, where = joined.join, joined.join.this, joined.where
    alias = item.args.get("alias")
    if alias is None or not alias.name:
        raise JobError(
            f"{where}: {joined.at(item)}name the rows {statement_head(item)} makes: ... AS t (column, ...)"
        )
    entry: dict[str, Any] = {"as": alias.name}
    columns = [c.name for c in alias.args.get("columns") or []]
    if columns:
        entry["columns"] = columns
    entry |= _sql_unnest(joined) if isinstance(item, exp.Unnest) else _sql_call(joined)
    side = (join.args.get("side") or "").upper()
    on = join.args.get("on")
    if side not in ("", "LEFT") or (on is not None and not (isinstance(on, exp.Boolean) and on.this is True)):
        raise JobError(
            f"{where}: {joined.at(item)}{statement_head(item)} is joined INNER (a comma or CROSS JOIN) or LEFT "
            "JOIN ... ON TRUE (Flink); filter in WHERE"
        )
    entry["type"] = "left" if side == "LEFT" else "inner"
    return entry


def _sql_unnest(joined: family.SqlMade) -> dict[str, Any]:
    item = joined.join.this
    if len(item.expressions) != 1 or item.args.get("offset"):
        raise JobError(
            f"{joined.where}: {joined.at(item)}UNNEST takes one array or map column, without WITH OFFSET"
        )
    return {"unnest": joined.sql(item.expressions[0])}


def _sql_call(joined: family.SqlMade) -> dict[str, Any]:
    """`LATERAL TABLE(f(x))`: the declared function `f` and its arguments."""
    item, declared = joined.join.this, joined.declared.get("function", {})
    call = item.this
    if isinstance(call, exp.Anonymous) and call.name.upper() == "TABLE" and len(call.expressions) == 1:
        call = call.expressions[0]  # Flink's LATERAL TABLE(f(x))
    named = {name.lower(): settings for name, settings in declared.items()}
    if not isinstance(call, exp.Anonymous) or call.name.lower() not in named:
        called = call.name if isinstance(call, exp.Func) else statement_head(call)
        raise JobError(
            f"{joined.where}: {joined.at(item)}{called} is no declared table function; declare it first: CREATE "
            f"TEMPORARY FUNCTION {called} AS 'module.udtf' LANGUAGE PYTHON (a Spark Python UDTF)"
        )
    return {**named[call.name.lower()], "args": [joined.sql(arg) for arg in call.expressions]}


def _bind(binding: family.Binding) -> dict[str, Any]:
    """An UNNEST or table-function join: its expression or arguments resolved against the row, and
    the columns of the rows it makes (an array's elements, or a struct element's fields; a map's
    key and value; the function's return type), renamed by `columns`."""
    from pyspark.sql.types import StructField, StructType

    from streamjoin.catalog import CallsJava, Unresolved
    from streamjoin.plan import qualify

    join, left, schemas, where = binding.link, binding.left, binding.schemas, binding.where
    assert isinstance(join, Made)
    (name,) = left  # the job's only join (spec)

    def resolved(what: str, expressions: list[str]) -> StructType:
        try:
            return binding.catalog.analyse({name: schemas[name]}, expressions)
        except Unresolved as exc:
            raise JobError(f"{where}: {what} does not resolve against {name!r}'s columns: {exc}") from None
        except CallsJava as call:
            raise call.refusal(where) from None

    if isinstance(join, UnnestLink):
        expression = qualify(join.unnest, left, schemas, where)
        fields = _elements(resolved(f"unnest {join.unnest!r}", [expression])[0].dataType, join, where)
        lateral: tuple[str, ...] = (expression,)
    else:
        assert isinstance(join, FunctionLink)  # a lateral link unnests or calls a function (spec)
        returned = binding.catalog.function_columns(join.function, where)
        lateral = tuple(qualify(a, left, schemas, where) for a in join.args)
        resolved(f"the arguments of {join.function}", list(lateral))
        fields = list(returned.fields)
    names = join.columns or tuple(f.name for f in fields)
    if len(names) != len(fields):
        raise JobError(
            f"{where}: columns names {len(names)} column(s) but the rows made have {len(fields)} "
            f"({', '.join(f'{f.name} {f.dataType.simpleString()}' for f in fields)}); name each once"
        )
    made = StructType([StructField(n, f.dataType, True) for n, f in zip(names, fields, strict=True)])
    return {"equi": (), "residual": None, "made_from": lateral, "made": made}


def _elements(kind: DataType, join: UnnestLink, where: str) -> list[StructField]:
    """The columns of an unnested array's elements (a struct's fields), or a map's key and value."""
    from pyspark.sql.types import ArrayType, MapType, StructField, StructType

    if isinstance(kind, ArrayType) and isinstance(kind.elementType, StructType):
        return list(kind.elementType.fields)
    if isinstance(kind, ArrayType):
        return [StructField("element", kind.elementType)]
    if isinstance(kind, MapType):
        return [StructField("key", kind.keyType), StructField("value", kind.valueType)]
    raise JobError(
        f"{where}: unnest {join.unnest!r} is a {kind.simpleString()}; UNNEST expands an array or a map"
    )


def _explain(plan: Plan, join: BoundJoin, step: int) -> list[str]:
    """An UNNEST or table-function join as `explain` prints it (Flink's forms)."""
    assert join.made is not None  # only lateral joins make rows
    columns = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in join.made.fields)
    call = (
        f"UNNEST({join.made_from[0]})"
        if join.family == "unnest"
        else f"LATERAL TABLE({join.link(FunctionLink).function}({', '.join(join.made_from)}))"
    )
    kind = "CROSS JOIN" if join.spec.type == "inner" else "LEFT JOIN"
    kept = (
        "a row that makes none is dropped (counted unmatched_dropped)"
        if join.spec.type == "inner"
        else "a row that makes none is kept once, padded with NULLs"
    )
    return [
        f"  {step}. {kind} {call} AS {join.right}({columns}) [{join.family}]",
        f"     each row joined with the rows made from it, decided as it arrives (nothing late, no state); {kept}",
    ]


for order, made_by, link, keys, sql in (
    (
        900,  # refusals name unnest, function, then lookup
        ("unnest", "'unnest' (an array column)"),
        UnnestLink,
        ("columns",),
        family.SqlSyntax(made=_sql_unnested, made_join=_sql_made_join),
    ),
    (
        910,
        ("function", "'function'"),
        FunctionLink,
        ("args", "columns"),
        family.SqlSyntax(declaration=_sql_function, made=_sql_called, made_join=_sql_made_join),
    ),
):
    family.register(
        family.Family(
            name=made_by[0],
            links=(link,),
            made_by=(made_by,),
            made_keys=keys,
            made=_made,
            sql=sql,
            bind=_bind,
            explain=_explain,
            operator="streamjoin.joins.lateral.step:LateralJoin.build",
            order=order,
        )
    )
