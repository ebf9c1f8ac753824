"""Jobs written in SQL: the seeds' own join statements, compiled into the JoinSpec a YAML job builds.

A `.sql` job file declares its sources and holds one query that creates the output:

    CREATE STREAM purchases WITH (path='purchases', time='t');
    CREATE TABLE products WITH (path='products', key='product_id', changelog=true);
    CREATE STREAM shipments WITH (path='shipments', time='t');
    CREATE STREAM joined WITH (path='out/joined') AS
      SELECT purchases.name AS purchase, products.product, shipments.carrier
      FROM purchases
        JOIN products ON purchases.id = products.product_id
        JOIN shipments WITHIN 10 SECONDS ON purchases.id = shipments.purchased_id;

It is parsed with sqlglot (Spark's dialect, which the conditions and expressions are written in,
extended with ksqlDB's `CREATE STREAM`, `WITHIN` and `GRACE PERIOD`) and turned into the mapping a
YAML job holds, so `spec_from_dict` checks it as it checks YAML and every command takes either
(docs/job-spec.md, "Jobs in SQL"). Aliases (`FROM orders o`) name sources in the statement only:
the JoinSpec, its metrics and its side tables use the declared names.
"""

from __future__ import annotations

from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.tokens import TokenType

from streamjoin.errors import JobError

# The WITH (...) settings of a source declaration and of the query's output, as YAML names them.
SOURCE_SETTINGS = (
    "path",
    "table",
    "time",
    "time_format",
    "key",
    "changelog",
    "deleted",
    "clock_skew",
    "start_at",
    "max_future",
)
# The query's: the output's, the job's description, and its schedule and quality settings with
# their section as a prefix (schedule_every='1d', quality_min_match_rate=0.95).
OUTPUT_SETTINGS = (
    "path",
    "table",
    "time",
    "partition_by",
    "key",
    "description",
    "start_at",
    "schedule_every",
    "schedule_timezone",
    "schedule_start",
    "schedule_live_every",
    "schedule_verify",
    "quality_match_column",
    "quality_min_match_rate",
    "quality_not_null",
)
_JOIN_WORDS = ("WITHIN", "GRACE")


class StreamSQL(Spark):
    """Spark SQL plus ksqlDB's stream words: `CREATE STREAM`, and after a joined source `WITHIN
    <n> <unit>` or `WITHIN (<before>, <after>)` and `GRACE PERIOD <n> <unit>`."""

    class Tokenizer(Spark.Tokenizer):
        KEYWORDS = {**Spark.Tokenizer.KEYWORDS, "STREAM": TokenType.TABLE}

    class Parser(Spark.Parser):  # type: ignore[misc,valid-type]  # a dialect attribute, to mypy
        def _parse_table_alias(self, alias_tokens=None):
            if self._curr and self._curr.text.upper() in _JOIN_WORDS:
                return None  # `B WITHIN 1 HOUR`: WITHIN is not B's alias
            return super()._parse_table_alias(alias_tokens)

        def _parse_table(self, *args, **kwargs):
            table = super()._parse_table(*args, **kwargs)
            if table is not None:  # a subquery too, to be refused by name rather than fail to parse
                if self._match_text_seq("WITHIN"):
                    if self._match(TokenType.L_PAREN):
                        spans = self._parse_csv(self._parse_span)
                        self._match_r_paren()
                    else:
                        spans = [self._parse_span()]
                    table.set("within", exp.Tuple(expressions=spans))
                if self._match_text_seq("GRACE", "PERIOD"):
                    table.set("grace", self._parse_span())
            return table

        def _parse_span(self) -> exp.Interval:
            """`10 SECONDS`, `1 HOUR`: a number and a unit, as ksqlDB writes them."""
            number = self._parse_number()
            unit = self._parse_var(any_token=True)
            if number is None or unit is None:
                self.raise_error("expected a duration such as 10 SECONDS or 1 HOUR")
            return exp.Interval(this=number, unit=unit)


def spec_document_from_sql(text: str, origin: str = "job") -> dict[str, Any]:
    """The job mapping (what a YAML job file holds) that a SQL job's statements describe."""
    try:
        parsed = sqlglot.parse(text, read=StreamSQL)
        statements = [s for s in parsed if s is not None and not isinstance(s, exp.Semicolon)]  # comments
    except sqlglot.errors.ParseError as exc:
        error = exc.errors[0] if exc.errors else {}
        near = f" (near {error['highlight']!r})" if error.get("highlight") else ""
        raise JobError(
            f"{origin}: line {error.get('line', '?')}, column {error.get('col', '?')}{near}: the statement does not "
            f"parse: {_first_line(error.get('description') or str(exc))}"
        ) from None
    sources: dict[str, dict[str, Any]] = {}
    queries = []
    for statement in statements:
        if isinstance(statement, exp.Command):
            raise JobError(
                f"{origin}: the statement {_head(statement)!r} does not parse: check it against docs/job-spec.md, "
                '"Jobs in SQL" (CREATE STREAM|TABLE <name> WITH (...) [AS SELECT ... FROM ... JOIN ...])'
            )
        if not isinstance(statement, exp.Create) or statement.args.get("kind") not in ("STREAM", "TABLE"):
            raise JobError(
                f"{origin}: {_at(statement)}a job file holds CREATE STREAM / CREATE TABLE statements only (the "
                f"sources, then one CREATE STREAM <output> WITH (path=...) AS SELECT ...), not {_head(statement)}"
            )
        if isinstance(statement.expression, exp.Query):
            queries.append(statement)
            continue
        name = _created_name(statement)
        settings = _settings(statement, SOURCE_SETTINGS, f"{origin}: source {name!r}")
        sources[name] = {"kind": "stream" if statement.args["kind"] == "STREAM" else "table", **settings}
    if len(queries) != 1:
        raise JobError(
            f"{origin}: a job file holds exactly one query, CREATE STREAM <output> WITH (path=...) AS SELECT ...; "
            f"found {len(queries)}"
        )
    (create,) = queries
    return _compile_query(create, sources, origin)


def _compile_query(create: exp.Create, sources: dict[str, dict[str, Any]], origin: str) -> dict[str, Any]:
    name = _created_name(create)
    where = f"{origin}: {name}"
    output = _settings(create, OUTPUT_SETTINGS, f"{where} (its WITH settings)")
    job: dict[str, Any] = {key: output.pop(key) for key in ("description", "start_at") if key in output}
    for section in ("schedule", "quality"):
        settings = {
            k.removeprefix(f"{section}_"): output.pop(k) for k in list(output) if k.startswith(f"{section}_")
        }
        if settings:
            job[section] = settings
    query = create.expression
    if not isinstance(query, exp.Select):
        raise JobError(f"{where}: {_at(query)}the query must be one SELECT, not {_head(query)}")
    _refuse_unsupported(query, where)
    start = query.args.get("from_") or query.args.get("from")
    if start is None:
        raise JobError(f"{where}: {_at(query)}the query has no FROM")
    aliases: dict[str, str] = {}
    first = _source_of(start.this, sources, aliases, where)
    if start.this.args.get("within") is not None:
        raise JobError(
            f"{where}: {_at(start.this)}WITHIN belongs after a joined stream, not after FROM {first}"
        )
    joins = [_compile_join(join, sources, aliases, where) for join in query.args.get("joins") or []]
    if not joins:
        raise JobError(f"{where}: {_at(query)}the query joins nothing: add JOIN <source> ON ...")
    document: dict[str, Any] = {
        "name": name,
        "sources": sources,
        "from": first,
        "joins": joins,
        "output": output,
        **job,
    }
    if not any(isinstance(e, exp.Star) for e in query.expressions):
        document["select"] = [_sql(e, aliases) for e in query.expressions]
    if query.args.get("where") is not None:
        document["where"] = _sql(query.args["where"].this, aliases)
    return document


def _compile_join(
    join: exp.Join, sources: dict[str, dict[str, Any]], aliases: dict[str, str], where: str
) -> dict:
    table = join.this
    name = _source_of(table, sources, aliases, where)
    side, kind, method = (join.args.get(k) or "" for k in ("side", "kind", "method"))
    item: dict[str, Any] = {"join": name}
    if kind.upper() == "CROSS":
        item["type"] = "cross"
    elif side:
        item["type"] = side.lower()
    if method.upper() == "ASOF":
        item["asof"] = True
    elif method.upper() == "NATURAL":
        item["natural"] = True
    elif method:
        raise JobError(
            f"{where}: {_at(table)}{method} JOIN is not supported; write JOIN, LEFT JOIN, ... or ASOF JOIN"
        )
    within = table.args.get("within")
    if within is not None:
        spans = [_duration(span) for span in within.expressions]
        if len(spans) == 1:
            item["within"] = spans[0]
        elif len(spans) == 2:  # ksqlDB: WITHIN (before, after) the left row
            item["between"] = [f"-{spans[0]}", spans[1]]
        else:
            raise JobError(f"{where}: {_at(table)}WITHIN takes one duration or two, (before, after)")
    grace = table.args.get("grace")
    if grace is not None:
        item["grace"] = _duration(grace)
    version = table.args.get("version")
    if version is not None:  # FOR SYSTEM_TIME AS OF <time>
        point = version.args.get("expression")
        if (
            isinstance(point, exp.Anonymous)
            and point.name.upper() == "PROCTIME"
            or (isinstance(point, exp.Func) and point.sql().upper() == "PROCTIME()")
        ):
            item["as_of"] = "arrival"
        elif isinstance(point, exp.Column):
            item["as_of"] = "event_time"
        else:
            raise JobError(
                f"{where}: {_at(table)}FOR SYSTEM_TIME AS OF takes the stream's time column (event time) or "
                f"PROCTIME() (as the row arrived), not {point.sql()}"
            )
    if join.args.get("on") is not None:
        item["on"] = _sql(join.args["on"], aliases)
    using = join.args.get("using")
    if using:
        item["using"] = [identifier.name for identifier in using]
    return item


def _refuse_unsupported(query: exp.Select, where: str) -> None:
    """What a streaming join job cannot be: aggregations, subqueries, ordering, set operations."""
    for key, what in (
        ("group", "GROUP BY (an aggregation)"),
        ("having", "HAVING"),
        ("order", "ORDER BY"),
        ("limit", "LIMIT"),
        ("distinct", "DISTINCT"),
        ("windows", "WINDOW"),
        ("qualify", "QUALIFY"),
    ):
        node = query.args.get(key)
        if node:
            raise JobError(
                f"{where}: {_at(node)}{what} is not supported: a job joins rows and writes each one"
            )
    for node in query.walk():
        if node is not query and isinstance(node, exp.Query):
            raise JobError(
                f"{where}: {_at(node)}subqueries are not supported: write the inner query's output to a table "
                "in a job of its own and join that"
            )
        if isinstance(node, exp.AggFunc):
            raise JobError(f"{where}: {_at(node)}{node.sql()} is an aggregation, which is not supported")
        if isinstance(node, exp.Window):
            raise JobError(f"{where}: {_at(node)}window functions (OVER ...) are not supported yet")


def _source_of(
    table: exp.Expr, sources: dict[str, dict[str, Any]], aliases: dict[str, str], where: str
) -> str:
    """The declared source a FROM or JOIN item names; records its alias."""
    if not isinstance(table, exp.Table) or not table.name:
        raise JobError(f"{where}: {_at(table)}FROM and JOIN take declared sources, not {_head(table)}")
    name = table.name
    if name not in sources:
        declared = ", ".join(sources) or "none"
        raise JobError(
            f"{where}: {_at(table)}{name!r} is not declared; declare it first with CREATE STREAM {name} WITH "
            f"(path='...', time='...') or CREATE TABLE {name} WITH (path='...', key='...') (declared: {declared})"
        )
    aliases[table.alias or name] = name
    aliases.setdefault(name, name)
    return name


def _sql(node: exp.Expr, aliases: dict[str, str]) -> str:
    """An expression as Spark SQL over the declared source names (aliases replaced)."""

    def rename(child: exp.Expr) -> exp.Expr:
        if isinstance(child, exp.Column) and child.table in aliases:
            return exp.column(child.name, table=aliases[child.table], quoted=child.this.quoted)
        return child

    return node.transform(rename).sql(dialect="spark")


def _settings(create: exp.Create, allowed: tuple[str, ...], where: str) -> dict[str, Any]:
    """The statement's WITH (key=value, ...) settings, as YAML values."""
    properties = create.args.get("properties")
    settings: dict[str, Any] = {}
    for prop in properties.expressions if properties else []:
        key = prop.name.lower()
        if key not in allowed:
            raise JobError(f"{where}: {_at(prop)}unknown setting {key!r}; settings are {', '.join(allowed)}")
        settings[key] = _value(prop.args.get("value"), f"{where}: {key}")
    return settings


def _value(node: exp.Expr | None, where: str) -> Any:
    if isinstance(node, exp.Boolean):
        return node.this
    if isinstance(node, exp.Literal):
        return node.this if node.is_string else float(node.this) if "." in node.this else int(node.this)
    if isinstance(node, exp.Array | exp.Tuple):
        return [_value(e, where) for e in node.expressions]
    if isinstance(node, exp.Interval):
        return _duration(node)
    if isinstance(node, exp.Column | exp.Var | exp.Identifier):  # a bare word: path=orders
        return node.name
    raise JobError(f"{where}: {_at(node)}write a string ('...'), a number, true/false, an INTERVAL or [a, b]")


def _duration(span: exp.Interval) -> str:
    """`INTERVAL '1' HOUR` or `10 SECONDS` as the duration text YAML takes."""
    number, unit = span.this, span.args.get("unit")
    value = number.this if isinstance(number, exp.Literal) else number.sql()
    return f"{value} {unit.name if unit is not None else 's'}"


def _created_name(create: exp.Create) -> str:
    target = create.this
    return (target.this if isinstance(target, exp.Schema) else target).name


def _at(node: exp.Expr | None) -> str:
    """`line L, column C: ` of the node's earliest token that sqlglot placed, for error messages."""
    places = []
    for child in node.walk() if node is not None else ():
        meta = child.meta if hasattr(child, "meta") else {}
        if meta.get("line"):  # sqlglot's column is the token's last character
            places.append(
                (meta["line"], meta["col"] - (meta["end"] - meta["start"]) if "end" in meta else meta["col"])
            )
    return "line {}, column {}: ".format(*min(places)) if places else ""


def _head(node: exp.Expr) -> str:
    text = node.sql()
    return text if len(text) <= 60 else text[:57] + "..."


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text
