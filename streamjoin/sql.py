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
extended with ksqlDB's `CREATE STREAM`, `WITHIN` and `GRACE PERIOD`, SQLstream's `SELECT STREAM`
and `OVER (RANGE ...)` join windows, the `WATERMARK FOR` and `METADATA` columns of Flink's and
RisingWave's source declarations, RisingWave's `CREATE SOURCE` (a stream), and Flink's `CREATE
FUNCTION ... LANGUAGE PYTHON` for the table functions of `LATERAL TABLE(...)`) and turned into the
mapping a YAML job holds, so `spec_from_dict` checks it as it checks YAML and every command takes either
(docs/job-spec.md, "Jobs in SQL"). Aliases (`FROM orders o`) name sources in the statement only:
the JoinSpec, its metrics and its side tables use the declared names.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.tokens import TokenType

from streamjoin import family
from streamjoin.errors import JobError
from streamjoin.limits import check_nesting
from streamjoin.spec import OUTPUT_KEYS, QUALITY_KEYS, SCHEDULE_KEYS, SOURCE_KEYS, JoinSpec, spec_from_dict
from streamjoin.timeutil import format_duration, parse_duration, to_micros

# The WITH (...) settings of a source declaration (its kind is the statement's: CREATE STREAM or
# CREATE TABLE) and of the query: the output's, the job's description and start, and its schedule
# and quality settings with their section as a prefix (schedule_every='1d').
SOURCE_SETTINGS = tuple(key for key in SOURCE_KEYS if key != "kind")
OUTPUT_SETTINGS = (
    *OUTPUT_KEYS,
    "description",
    "start_at",
    *(f"schedule_{key}" for key in SCHEDULE_KEYS),
    *(f"quality_{key}" for key in QUALITY_KEYS),
)
_JOIN_WORDS = ("WITHIN", "GRACE")
_STREAM_WORDS = ("STREAM", "SOURCE")  # CREATE STREAM (ksqlDB) and CREATE SOURCE (RisingWave) declare streams
# sqlglot logs a warning when it keeps a statement it cannot read as raw text; the JobError raised
# for that statement says where it is and what to do, so the warning would only come first.
logging.getLogger("sqlglot").setLevel(logging.ERROR)
_GLUED_DURATION = re.compile(r"\d+(?:\.\d+)?[a-zA-Z]+(?:\d+(?:\.\d+)?[a-zA-Z]+)*\b")  # 5s, 1h30m, 500ms


class StreamSQL(Spark):
    """Spark SQL plus ksqlDB's stream words: `CREATE STREAM`, and after a joined source `WITHIN
    <n> <unit>` or `WITHIN (<before>, <after>)` and `GRACE PERIOD <n> <unit>`; SQLstream's
    `SELECT STREAM` and `<source> OVER (RANGE INTERVAL ... PRECEDING) [AS alias]`; RisingWave's
    `CREATE SOURCE` (a stream); and in a declaration's column list, Flink's and RisingWave's
    `WATERMARK FOR t AS ...` and `METADATA`."""

    class Tokenizer(Spark.Tokenizer):
        # RisingWave's CREATE SOURCE declares an append-only source: a stream, as CREATE STREAM.
        KEYWORDS = {**Spark.Tokenizer.KEYWORDS, "STREAM": TokenType.TABLE, "SOURCE": TokenType.TABLE}
        # As in standard SQL and the seed systems, a double-quoted token is a name (SQLstream's
        # `b1."ticker"`), and strings take single quotes.
        QUOTES = ["'"]
        IDENTIFIERS = ["`", '"']

    class Parser(Spark.Parser):  # type: ignore[misc,valid-type]  # a dialect attribute, to mypy
        _window: exp.Expr | None = None  # SQLstream's OVER (...) after a source, until its table takes it

        # Flink's and RisingWave's source columns: `WATERMARK FOR t AS t - INTERVAL '15' SECOND` in
        # the column list, and a column read from the connector's metadata (`METADATA [FROM 'x']
        # [VIRTUAL]`, which says nothing a Delta table needs).
        CONSTRAINT_PARSERS = {
            **Spark.Parser.CONSTRAINT_PARSERS,
            "WATERMARK": lambda self: self._parse_watermark(),
            "METADATA": lambda self: self._parse_metadata_column(),
        }
        SCHEMA_UNNAMED_CONSTRAINTS = {*Spark.Parser.SCHEMA_UNNAMED_CONSTRAINTS, "WATERMARK"}

        def _parse_watermark(self) -> exp.Expr:
            column = self._parse_column() if self._match(TokenType.FOR) else None
            delayed = self._parse_disjunction() if self._match(TokenType.ALIAS) else None
            if column is None or delayed is None:
                self.raise_error(
                    "expected WATERMARK FOR <time column> AS <time column> - INTERVAL '<n>' <unit>"
                )
            return self.expression(exp.WatermarkColumnConstraint(this=column, expression=delayed))

        def _parse_metadata_column(self) -> exp.Expr:
            if self._match(TokenType.FROM):
                self._parse_string() or self._parse_id_var()  # the metadata key: a string or a quoted name
            self._match_text_seq("VIRTUAL")
            return exp.Var(this="METADATA")

        def _parse_table_alias(self, alias_tokens=None):
            if self._curr and self._curr.text.upper() in _JOIN_WORDS:
                return None  # `B WITHIN 1 HOUR`: WITHIN is not B's alias
            if self._curr and self._curr.text.upper() == "OVER":  # `s OVER (RANGE ...) AS x`
                self._advance()
                self._window = self._parse_wrapped(self._parse_join_window)
            return super()._parse_table_alias(alias_tokens)

        def _parse_join_window(self) -> exp.Expr:
            """SQLstream's `RANGE INTERVAL '1' MINUTE PRECEDING` or `RANGE CURRENT ROW` (ROWS: as written)."""
            if self._match_text_seq("RANGE"):
                if self._match_text_seq("CURRENT", "ROW"):
                    return exp.Interval(this=exp.Literal.number(0), unit=exp.var("SECOND"))
                span = self._parse_interval()
                if span is None or not self._match_text_seq("PRECEDING"):
                    self.raise_error("expected RANGE INTERVAL '<n>' <unit> PRECEDING or RANGE CURRENT ROW")
                return span
            start = self._index
            while self._curr and self._curr.token_type != TokenType.R_PAREN:
                self._advance()
            return exp.Var(this=self._find_sql(self._tokens[start], self._prev))

        _selected: str | None = None  # Lenses' SELECT TABLE / SELECT STREAM: what a view reads its source as

        def _parse_projections(self):
            # SQLstream's SELECT STREAM ..., Lenses' SELECT STREAM|TABLE ...: not a column so named
            follows = self._next.token_type if self._next else None
            if (
                self._curr
                and self._curr.text.upper() in ("STREAM", "TABLE")
                and follows not in (TokenType.COMMA, TokenType.FROM, TokenType.DOT, TokenType.ALIAS)
            ):
                self._selected = self._curr.text.lower()
                self._advance()
            return super()._parse_projections()

        def _parse_cte(self):
            self._selected = None
            cte = super()._parse_cte()
            if isinstance(cte, exp.CTE):
                cte.set("selected", self._selected)
            return cte

        def _parse_select_query(self, *args, **kwargs):
            """Lenses' `WITH v AS (SELECT TABLE * FROM s);`, a statement of its own: the views."""
            if self._curr and self._curr.token_type == TokenType.WITH:
                index = self._index
                views = self._parse_with()
                if views is not None and (
                    self._curr is None or self._curr.token_type in (TokenType.SEMICOLON, TokenType.SENTINEL)
                ):
                    return views
                self._retreat(index)
            return super()._parse_select_query(*args, **kwargs)

        def _parse_table(self, *args, **kwargs):
            table = super()._parse_table(*args, **kwargs)
            if table is not None and self._window is not None:
                table.set("over", self._window)
                self._window = None
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

        def _parse_query_modifiers(self, this):
            """Lenses' `... ON a.id = b.id WITHIN 5s`: the window after the query, of its one join; and
            ksqlDB's `EMIT CHANGES` (what a job writes anyway)."""
            this = super()._parse_query_modifiers(this)
            if isinstance(this, exp.Select) and self._match_text_seq("WITHIN"):
                this.set("within", self._parse_span())
            self._match_text_seq("EMIT", "CHANGES")  # ksqlDB's push query: every output row as it comes
            return this

        def _parse_span(self) -> exp.Interval:
            """`10 SECONDS`, `1 HOUR`: a number and a unit, as ksqlDB writes them; or Lenses' `5s`, `10m`."""
            glued = _GLUED_DURATION.match(self.sql, self._curr.start) if self._curr else None
            if glued:  # Spark's tokenizer reads `5s` as a SMALLINT literal (5::SMALLINT): skip its tokens
                while self._curr and self._curr.start < glued.end():
                    self._advance()
                return exp.Interval(this=exp.Literal.string(glued.group(0)))
            number = self._parse_number()
            unit = self._parse_var(any_token=True)
            if number is None or unit is None:
                self.raise_error("expected a duration such as 10 SECONDS or 1 HOUR")
            return exp.Interval(this=number, unit=unit)


# The job checks (spec.py) say what to change in a YAML job's words; said of a SQL job, each
# becomes the statement's nearest form (and the families' own: `family.SqlSyntax.words`).
_STATEMENT_WORDS = {
    "add 'within: 1h' (|right.time - left.time| <= 1h) or 'between: [-1h, 2h]' (right.time - left.time)": (
        "write WITHIN 1 HOUR after the joined stream, WITHIN (1 HOUR, 2 HOURS) (up to 1 hour before, 2 after), "
        "or a condition on the two time columns such as r.t BETWEEN l.t - INTERVAL '1' HOUR AND l.t"
    ),
    "add 'within: 1m' (SQLstream's RANGE INTERVAL '1' MINUTE on both sides) or 'between: [-1m, 0s]'": (
        "write CROSS JOIN r WITHIN 1 MINUTE, or OVER (RANGE INTERVAL '1' MINUTE PRECEDING) on both sides"
    ),
    "'within'/'between' apply to stream-stream joins only; remove them": (
        "WITHIN, OVER windows and interval conditions apply to stream-stream joins only; remove them"
    ),
}


def spec_from_sql(text: str, origin: str = "job") -> JoinSpec:
    """Build a JoinSpec from a SQL job: source declarations and one CREATE STREAM ... AS SELECT
    (docs/job-spec.md "Jobs in SQL"), checked as a YAML job is."""
    document, places = compile_sql(text, origin)
    try:
        return spec_from_dict(document, origin=origin)
    except JobError as exc:  # a check of the mapping: point at the join's place in the statement
        message = in_statement_words(str(exc))
        named = re.search(r"join with '([^']+)'", message)
        place = places.get(named.group(1), "") if named else ""
        raise type(exc)(f"{place}{message}") from None


def in_statement_words(message: str) -> str:
    """A job check's message with its YAML advice in the words of a SQL statement."""
    for yaml_words, statement_words in {**_STATEMENT_WORDS, **family.sql_words()}.items():
        message = message.replace(yaml_words, statement_words)
    return message


def spec_document_from_sql(text: str, origin: str = "job") -> dict[str, Any]:
    """The job mapping (what a YAML job file holds) that a SQL job's statements describe."""
    return compile_sql(text, origin)[0]


def compile_sql(text: str, origin: str = "job") -> tuple[dict[str, Any], dict[str, str]]:
    """`spec_document_from_sql`, and where each joined source stands in the text (`line L, column
    C: `), for the checks made on the mapping to point at the statement."""
    statements = _statements(text, origin)
    declarations: dict[str, exp.Create] = {}
    declared: dict[str, dict[str, dict[str, Any]]] = {}  # a family's declarations: family -> name -> settings
    views: dict[str, tuple[str, str, exp.Expr]] = {}  # Lenses' view -> (the source it reads, as what, where)
    queries: list[tuple[str, exp.Create | None, exp.Expr]] = []  # (output, its settings' statement, query)
    for statement in statements:
        if isinstance(statement, exp.Command):  # sqlglot could not read it past its first word
            raise JobError(
                f"{origin}: {_where_command_fails(statement, text)}the statement {statement_head(statement)!r} does not parse: "
                'check it against docs/job-spec.md, "Jobs in SQL" (CREATE STREAM|TABLE <name> WITH (...) [AS SELECT '
                "... FROM ... JOIN ...])"
            )
        if isinstance(statement, exp.With):
            views.update(_views(statement, origin))
        elif isinstance(statement, exp.Create) and statement.args.get("kind") == "FUNCTION":
            _declare(declared, created_name(statement), family.SqlDeclaration(statement, origin, _at))
        elif isinstance(statement, exp.Insert) and isinstance(statement.this, exp.Table):
            queries.append((statement.this.name, None, statement.expression))
        elif isinstance(statement, exp.Create) and statement.args.get("kind") in (
            *_STREAM_WORDS,
            "TABLE",
            "VIEW",
        ):
            if isinstance(statement.expression, exp.Query):  # VIEW: RisingWave's CREATE MATERIALIZED VIEW
                queries.append((created_name(statement), statement, statement.expression))
            else:
                declarations[created_name(statement)] = statement
        else:
            raise JobError(
                f"{origin}: {_at(statement)}a job file holds CREATE STREAM / CREATE TABLE statements only (the "
                f"sources, then one CREATE STREAM <output> WITH (path=...) AS SELECT ..., or Lenses' WITH views "
                f"and INSERT INTO <output> SELECT ...), not {statement_head(statement)}"
            )
    name, create, query = _the_query(queries, declarations, origin)
    sources, delays = _sources(declarations, declared, origin)
    _read_through_views(sources, delays, views, origin)
    finishers = family.statement(family.SqlStatement(query, sources, origin, _at, _duration))  # e.g. TUMBLE
    _split_self_joins(query, sources, delays, origin)
    document = _compile_query(name, create, query, sources, declared, origin)
    for finish in finishers:
        finish(document)
    _grace_from_watermarks(document, delays)
    places = {_source_name(join.this): _at(join.this) for join in query.args.get("joins") or []}
    return document, {name: place for name, place in places.items() if name and place}


def _statements(text: str, origin: str) -> list[exp.Expr]:
    """The job file's statements, parsed (comments left out); a statement that does not parse is
    refused at its line and column."""
    check_nesting(text, f"{origin}: the job's SQL", StreamSQL)
    try:
        parsed = sqlglot.parse(text, read=StreamSQL)
    except sqlglot.errors.ParseError as exc:
        error = exc.errors[0] if exc.errors else {}
        near = f" (near {error['highlight']!r})" if error.get("highlight") else ""
        raise JobError(
            f"{origin}: line {error.get('line', '?')}, column {error.get('col', '?')}{near}: the statement does not "
            f"parse: {_first_line(error.get('description') or str(exc))}"
        ) from None
    return [s for s in parsed if s is not None and not isinstance(s, exp.Semicolon)]  # comments


def _the_query(
    queries: list[tuple[str, exp.Create | None, exp.Expr]], declarations: dict[str, exp.Create], origin: str
) -> tuple[str, exp.Create, exp.Expr]:
    """The file's one query: its output's name, the statement holding the output's settings (for
    INSERT INTO <name>, its declaration, taken from `declarations`) and the query."""
    if len(queries) != 1:
        raise JobError(
            f"{origin}: a job file holds exactly one query, CREATE STREAM <output> WITH (path=...) AS SELECT ... "
            f"(or INSERT INTO <output> SELECT ...); found {len(queries)}"
        )
    ((name, create, query),) = queries
    if create is None:  # INSERT INTO <name>: its declaration holds the output's settings
        create = declarations.pop(name, None)
        if create is None:
            raise JobError(
                f"{origin}: {_at(query.parent)}INSERT INTO {name}: declare the output first, CREATE STREAM {name} "
                "WITH (path='...')"
            )
    return name, create, query


def _sources(
    declarations: dict[str, exp.Create], declared: dict[str, dict[str, dict[str, Any]]], origin: str
) -> tuple[dict[str, dict[str, Any]], dict[str, timedelta]]:
    """The declared sources' settings by name, and each one's declared WATERMARK delay; a
    declaration a family takes (e.g. a JDBC table) goes to `declared` instead."""
    sources: dict[str, dict[str, Any]] = {}
    delays: dict[str, timedelta] = {}
    for source, statement in declarations.items():
        where = f"{origin}: source {source!r}"
        if _declare(declared, source, family.SqlDeclaration(statement, f"{origin}: table {source!r}", _at)):
            continue  # e.g. a JDBC table
        settings = statement_settings(statement, SOURCE_SETTINGS, where)
        delay = _declared_columns(statement, settings, where)
        if delay is not None:
            delays[source] = delay
        sources[source] = {"kind": _declared_kind(statement, settings, delay), **settings}
    return sources, delays


def _views(statement: exp.With, origin: str) -> dict[str, tuple[str, str, exp.Expr]]:
    """Lenses' views: `WITH customersTable AS (SELECT TABLE * FROM customers)` reads a declared
    source as a table (or, SELECT STREAM, as a stream) under the view's name."""
    views = {}
    for cte in statement.expressions:
        select = cte.this
        joins = select.args.get("joins") if isinstance(select, exp.Select) else None
        start = select.args.get("from_") if isinstance(select, exp.Select) else None
        if joins:
            raise JobError(
                f"{origin}: {_at(select)}a WITH that joins (Lenses' way to join more than two sources) is not "
                "supported yet: write the joins in one query, FROM a JOIN b ON ... JOIN c ON ... (an N-way chain)"
            )
        if (
            start is None
            or not isinstance(start.this, exp.Table)
            or cte.args.get("selected") is None
            or [type(e) for e in select.expressions] != [exp.Star]
            or any(select.args.get(k) for k in ("where", "group", "having", "order", "limit"))
        ):
            raise JobError(
                f"{origin}: {_at(select)}a view reads one source whole, as Lenses writes it: WITH {cte.alias} AS "
                "(SELECT TABLE * FROM <source>) or (SELECT STREAM * FROM <source>); filters go in the query's WHERE"
            )
        views[cte.alias] = (start.this.name, cte.args["selected"], select)
    return views


def _read_through_views(
    sources: dict[str, dict[str, Any]],
    delays: dict[str, timedelta],
    views: dict[str, tuple[str, str, exp.Expr]],
    origin: str,
) -> None:
    """Each view becomes a source of the job under its own name, declared as the source it reads
    (path, key, time) and of the kind it reads it as; a source read through views leaves the job."""
    read = set()
    for view, (source, kind, node) in views.items():
        if source not in sources:
            raise JobError(
                f"{origin}: {_at(node)}view {view} reads {source!r}, which is not declared; declare it first "
                f"with CREATE STREAM {source} WITH (path='...')"
            )
        sources[view] = {**sources[source], "kind": kind}
        if source in delays:
            delays[view] = delays[source]
        read.add(source)
    for source in read:
        sources.pop(source)
        delays.pop(source, None)


def _split_self_joins(
    query: exp.Expr, sources: dict[str, dict[str, Any]], delays: dict[str, timedelta], origin: str
) -> None:
    """A source the query reads more than once (SQLstream's `FROM bids AS b1 JOIN asks ... JOIN
    bids AS b2`) becomes one source per alias, each declared as that source: a self-join."""
    start = query.args.get("from_") if isinstance(query, exp.Select) else None
    items = [start.this] if start is not None else []
    items += [join.this for join in query.args.get("joins") or []]
    tables = [t for t in items if isinstance(t, exp.Table) and t.name in sources]
    repeated = {t.name for t in tables if sum(u.name == t.name for u in tables) > 1}
    for table in (t for t in tables if t.name in repeated):
        alias = table.alias
        if not alias or alias in sources:
            raise JobError(
                f"{origin}: {_at(table)}{table.name} is joined with itself: give each use of it an alias of its "
                f"own, not a declared name (FROM {table.name} AS a ... JOIN {table.name} AS b ...)"
            )
        sources[alias] = dict(sources[table.name])
        if table.name in delays:
            delays[alias] = delays[table.name]
        table.set("this", exp.to_identifier(alias))
    for name in repeated:
        sources.pop(name)
        delays.pop(name, None)


def _compile_query(
    name: str,
    create: exp.Create,
    query: exp.Expr,
    sources: dict[str, dict[str, Any]],
    declared: dict[str, dict[str, dict[str, Any]]],
    origin: str,
) -> dict[str, Any]:
    """The job mapping of the query that writes output `name` (its settings in `create`'s WITH)."""
    where = f"{origin}: {name}"
    output, job = _output_settings(name, create, where)
    if not isinstance(query, exp.Select):
        raise JobError(f"{where}: {_at(query)}the query must be one SELECT, not {statement_head(query)}")
    _refuse_unsupported(query, where)
    start = query.args.get("from_") or query.args.get("from")
    if start is None:
        raise JobError(f"{where}: {_at(query)}the query has no FROM")
    aliases: dict[str, str] = {}
    first = _source_of(start.this, sources, aliases, where)
    joined = query.args.get("joins") or []
    # Every joined source and its alias first: WHERE may name any of them.
    plugins = [family.sql_made(_sql_made(join, declared, aliases, where)) for join in joined]
    for plugin in plugins:
        if plugin is not None:
            aliases[plugin[1]] = plugin[1]  # the rows it makes go by it, in the statement as in the job
    names = [
        None if plugin else _source_of(join.this, sources, aliases, where)
        for join, plugin in zip(joined, plugins, strict=True)
    ]
    overs = _overs([start.this, *(j.this for j in joined)], aliases)
    # Each family's syntax over the whole query, e.g. ROWS frames, which claim the OVER windows.
    claimed = family.sql_query(family.SqlQuery(query, first, overs, len(joined), where, _at, _duration))
    compiling = _Compiling(sources, aliases, {} if claimed else overs, where)
    filters = and_terms(query.args["where"].this) if query.args.get("where") is not None else []
    joins, seen = [], [first]
    for join, source, plugin in zip(joined, names, plugins, strict=True):
        if plugin is not None and plugin[0].sql.made_join is not None:  # rows made for each row
            item = plugin[0].sql.made_join(_sql_made(join, declared, aliases, where))
            joins.append(item)
            seen.append(item["as"])
            continue
        assert source is not None  # no family claimed it: a declared source
        item, filters = _compile_join(join, source, compiling, seen, filters, sole=len(joined) == 1)
        joins.append(item)
        seen.append(item["join"])
    if not joins:
        raise JobError(f"{where}: {_at(query)}the query joins nothing: add JOIN <source> ON ...")
    if claimed:
        joins[0].update(claimed)
    first = _stream_first(first, joins, sources)
    document = {"name": name, "sources": sources, "from": first, "joins": joins, "output": output, **job}
    items = _without_rowtime(query.expressions)
    if items and not any(isinstance(e, exp.Star) for e in items):
        document["select"] = [_sql(e, aliases) for e in items]
    if filters:
        document["where"] = _sql(exp.and_(*filters), aliases)
    return document


def _output_settings(name: str, create: exp.Create, where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The output's settings in the query's WITH (by default, ksqlDB's CREATE STREAM x AS SELECT:
    a folder x), and the job's own among them (description, start_at, schedule_*, quality_*)."""
    output = statement_settings(create, OUTPUT_SETTINGS, f"{where} (its WITH settings)")
    if "path" not in output and "table" not in output:
        output["path"] = name
    job: dict[str, Any] = {key: output.pop(key) for key in ("description", "start_at") if key in output}
    for section in ("schedule", "quality"):
        settings = {
            k.removeprefix(f"{section}_"): output.pop(k) for k in list(output) if k.startswith(f"{section}_")
        }
        if settings:
            job[section] = settings
    return output, job


def _overs(tables: list[exp.Expr], aliases: dict[str, str]) -> dict[str, exp.Expr]:
    """SQLstream's `<source> OVER (...)` windows of the FROM and JOIN items, by source name."""
    return {
        aliases.get(t.alias or t.name, t.name): t.args["over"]
        for t in tables
        if isinstance(t, exp.Table) and t.args.get("over") is not None
    }


def _declared_columns(create: exp.Create, settings: dict[str, Any], where: str) -> timedelta | None:
    """What a source's column list says as Flink and RisingWave declare sources: `PRIMARY KEY (a, b)
    [NOT ENFORCED]` is its `key`, `WATERMARK FOR t AS t - INTERVAL 'n' <unit>` its `time` (t) and
    the delay returned (`_grace_from_watermarks`). Given in WITH (...) too, they must agree."""
    schema = create.this
    if not isinstance(schema, exp.Schema):
        return None
    delay = None
    key = [item.name for item in schema.expressions if _is_key_column(item)]
    for item in schema.expressions:
        if isinstance(item, exp.PrimaryKey):
            key += [column.name for column in item.expressions]
        elif isinstance(item, exp.WatermarkColumnConstraint):
            column = item.this.name
            delay = _watermark_delay(item, column, where)
            _agree(settings, "time", column, item, where)
    if key:
        _agree(settings, "key", key, schema, where)
    return delay


def _declared_kind(create: exp.Create, settings: dict[str, Any], delay: timedelta | None) -> str:
    """`stream` or `table`: CREATE STREAM and RisingWave's CREATE SOURCE declare streams; so does
    Flink's CREATE TABLE with a WATERMARK and no PRIMARY KEY (nor a key, changelog or deleted
    setting), which Flink calls an append-only table (its seed's `orders`). With a PRIMARY KEY and a
    WATERMARK it is Flink's versioned table: a table."""
    if create.args["kind"] in _STREAM_WORDS:
        return "stream"
    keyed = any(setting in settings for setting in ("key", "changelog", "deleted"))
    return "stream" if delay is not None and not keyed else "table"


def _is_key_column(item: exp.Expr) -> bool:
    """`currency STRING PRIMARY KEY`: a column that is the key by itself."""
    constraints = item.args.get("constraints") or [] if isinstance(item, exp.ColumnDef) else []
    return any(isinstance(c.args.get("kind"), exp.PrimaryKeyColumnConstraint) for c in constraints)


def _watermark_delay(watermark: exp.WatermarkColumnConstraint, column: str, where: str) -> timedelta:
    """`t - INTERVAL '15' SECOND` (or `t` alone: no delay) as a duration; anything else refused."""
    delayed = watermark.expression.unnest()
    if isinstance(delayed, exp.Column) and delayed.name == column:
        return timedelta(0)
    if isinstance(delayed, exp.Sub) and isinstance(delayed.this, exp.Column) and delayed.this.name == column:
        micros = interval_micros(delayed.expression)
        if micros is not None and micros >= 0:
            return timedelta(microseconds=micros)
    raise JobError(
        f"{where}: {_at(watermark)}the watermark {delayed.sql()} is not supported: write WATERMARK FOR {column} "
        f"AS {column} - INTERVAL '<n>' <unit> (how late a row may arrive: the grace of the joins it takes part in)"
    )


def _agree(settings: dict[str, Any], key: str, value: Any, node: exp.Expr, where: str) -> None:
    """Set `key` from the column list, or check the WITH (...) setting says the same."""
    given = settings.setdefault(key, value)
    if given != value and [given] != value:
        raise JobError(
            f"{where}: {_at(node)}the column list gives {key} {value!r} and WITH (...) gives {given!r}; give one"
        )


def _grace_from_watermarks(document: dict[str, Any], delays: dict[str, timedelta]) -> None:
    """A join without GRACE PERIOD waits as long as the slowest watermark among its sources (its
    joined source and those before it) allows: Flink's and RisingWave's joins wait for the
    watermarks of their inputs. Without declared watermarks, the YAML default stands."""
    before = [document["from"]]
    for item in document["joins"]:
        before.append(item.get("join") or item["as"])
        declared = [delays[name] for name in before if name in delays]
        if "grace" not in item and declared:
            item["grace"] = format_duration(max(declared))


def _stream_first(first: str, joins: list[dict[str, Any]], sources: dict[str, dict[str, Any]]) -> str:
    """Lenses' `customersTable RIGHT JOIN ordersStream`, the mirror of `ordersStream LEFT JOIN
    customersTable` (the same rows), as that join: only a stream's rows drive a stream-table join.
    Returns the query's first source, swapped into the join when mirrored."""
    if len(joins) != 1 or joins[0].get("type") != "right" or "join" not in joins[0]:
        return first
    join = joins[0]
    if (sources[first]["kind"], sources[join["join"]]["kind"]) != ("table", "stream"):
        return first
    stream = join["join"]
    join["join"], join["type"] = first, "left"
    return stream


def _without_rowtime(items: list[exp.Expr]) -> list[exp.Expr]:
    """SQLstream's `SELECT STREAM rowtime, ...`: ROWTIME is the output event time, which every job
    writes (`output.time`), so it leaves the select list (the parser skips STREAM)."""
    return [
        e for e in items if not (isinstance(e, exp.Column) and not e.table and e.name.upper() == "ROWTIME")
    ]


@dataclass(frozen=True)
class _Compiling:
    """What every JOIN of a query is compiled with: the declared sources' settings, the
    statement's aliases (alias -> source), the OVER windows no family's query hook claimed, and
    `where` (the job and output, for messages)."""

    sources: dict[str, dict[str, Any]]
    aliases: dict[str, str]
    overs: dict[str, exp.Expr]
    where: str


def _compile_join(
    join: exp.Join,
    name: str,
    query: _Compiling,
    seen: list[str],
    filters: list[exp.Expr],
    sole: bool = False,
) -> tuple[dict, list[exp.Expr]]:
    """One JOIN as a job's join entry, and the WHERE terms left once a comma join (`FROM o, s
    WHERE o.id = s.order_id AND ...`, Flink's interval join) has taken those relating it to the
    sources before it; the `sole` join of two sources takes terms of bare columns too (RisingWave's
    `FROM stream, version ... WHERE id1 = id2`: the plan names their sources from the schemas).
    The families' SQL hooks add their syntax (`family.SqlSyntax`: time bounds, windows...) and
    take the condition's terms that are theirs. `name`: the declared source it joins."""
    table, where = join.this, query.where
    item = _join_item(join, name, where)
    compiled = family.SqlJoin(
        join, name, item, query.sources, query.aliases, tuple(seen), query.overs, where, _at, _duration
    )
    family.sql_join(compiled)
    grace = table.args.get("grace")
    if grace is not None:
        item["grace"] = _duration(grace)
    on = join.args.get("on")
    if isinstance(on, exp.Boolean) and on.this is True and not item.get("natural"):  # JOIN without ON
        on = _key_equality(table, seen, name, query.sources, where)
    terms = and_terms(on) if on is not None else []
    using = join.args.get("using")
    if using:
        item["using"] = [identifier.name for identifier in using]
    elif not terms and not item.get("natural") and item.get("type") in (None, "cross"):
        known = {*seen, name}
        named = [(t, _tables(t, query.aliases)) for t in filters]
        mine = [t for t, tables in named if tables <= known and (name in tables or sole and not tables)]
        if mine:  # FROM o, s WHERE o.id = s.order_id ...: an inner join on those terms
            item.pop("type", None)
            terms, filters = mine, [t for t in filters if all(t is not m for m in mine)]
    terms = family.sql_terms(compiled, terms)
    if terms:
        item["on"] = _sql(exp.and_(*terms), query.aliases)
    return item, filters


def _join_item(join: exp.Join, name: str, where: str) -> dict[str, Any]:
    """A JOIN's item with its type and NATURAL read; the families' join hooks read their methods
    (`family.SqlSyntax.methods`: ASOF), any other is refused."""
    side, kind, method = (join.args.get(k) or "" for k in ("side", "kind", "method"))
    item: dict[str, Any] = {"join": name}
    if kind.upper() == "CROSS":
        item["type"] = "cross"
    elif side:
        item["type"] = side.lower()
    elif kind.upper() == "OUTER":  # ksqlDB's and Lenses' OUTER JOIN: FULL OUTER
        item["type"] = "full"
    methods = family.sql_methods()
    if method.upper() == "NATURAL":
        item["natural"] = True
    elif method and method.upper() not in methods:
        raise JobError(
            f"{where}: {_at(join.this)}{method} JOIN is not supported; write JOIN, LEFT JOIN, ..."
            + "".join(f" or {words} JOIN" for words in methods)
        )
    return item


def _key_equality(
    table: exp.Expr, seen: list[str], name: str, sources: dict[str, dict[str, Any]], where: str
) -> exp.Expr:
    """Lenses' JOIN without ON, on the equality of the two sources' keys (its `_key` facet): here
    the keys their declarations give, column by column in the order declared."""

    def key(source: str) -> list[str]:
        declared = sources[source].get("key") or []
        return [declared] if isinstance(declared, str) else list(declared)

    left, right = key(seen[0]), key(name)
    if len(seen) > 1 or not left or len(left) != len(right):
        raise JobError(
            f"{where}: {_at(table)}a JOIN without ON joins two sources on their keys (Lenses' _key): declare key on "
            f"both, with as many columns ({seen[0]}: {', '.join(left) or 'none'}, {name}: {', '.join(right) or 'none'}), "
            "or write ON "
            f"{seen[0]}.<column> = {name}.<column>"
        )
    pairs = zip(left, right, strict=True)
    return exp.and_(*(exp.column(lc, table=seen[0]).eq(exp.column(rc, table=name)) for lc, rc in pairs))


def interval_micros(node: exp.Expr) -> int | None:
    """An INTERVAL's length in microseconds; None for anything else (also for the families' SQL hooks)."""
    node = node.unnest()
    if not isinstance(node, exp.Interval):
        return None
    return to_micros(parse_duration(_duration(node), "interval"))


def and_terms(node: exp.Expr) -> list[exp.Expr]:
    """The top-level AND terms of a parsed condition in order, parentheses around a conjunction
    opened; without recursion, as a chain of a thousand ANDs nests a thousand deep."""
    terms, pending = [], [node]
    while pending:
        term = pending.pop().unnest()
        if isinstance(term, exp.And):
            pending += [term.right, term.left]
        else:
            terms.append(term)
    return terms


def _tables(node: exp.Expr, aliases: dict[str, str]) -> set[str]:
    """The sources a term names (by their declared names)."""
    return {aliases.get(c.table, c.table) for c in node.find_all(exp.Column) if c.table}


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
        raise JobError(
            f"{where}: {_at(table)}FROM and JOIN take declared sources, not {statement_head(table)}"
        )
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


def _declare(
    declared: dict[str, dict[str, dict[str, Any]]], name: str, statement: family.SqlDeclaration
) -> bool:
    """Record what a family makes of a declaration it claims (`declared`: family -> name ->
    settings); False when no family claims it."""
    claimed = family.sql_declaration(statement)
    if claimed is not None:
        declared.setdefault(claimed[0], {})[name] = claimed[1]
    return claimed is not None


def _sql_made(
    join: exp.Join, declared: dict[str, dict[str, dict[str, Any]]], aliases: dict[str, str], where: str
) -> family.SqlMade:
    """A JOIN item as the SQL hooks of the families that make rows see it (`family.SqlMade`)."""
    return family.SqlMade(join, declared, lambda node: _sql(node, aliases), where, _at)


def _source_name(table: exp.Expr) -> str:
    return table.name if isinstance(table, exp.Table) else ""


def _sql(node: exp.Expr, aliases: dict[str, str]) -> str:
    """An expression as Spark SQL over the declared source names (aliases replaced)."""

    def rename(child: exp.Expr) -> exp.Expr:
        if isinstance(child, exp.Column) and child.table in aliases:
            return exp.Column(this=child.this.copy(), table=exp.to_identifier(aliases[child.table]))
        return child

    return node.transform(rename).sql(dialect="spark")


def statement_settings(create: exp.Create, allowed: tuple[str, ...], where: str) -> dict[str, Any]:
    """The statement's WITH (key=value, ...) settings, as YAML values."""
    properties = create.args.get("properties")
    settings: dict[str, Any] = {}
    for prop in properties.expressions if properties else []:
        if isinstance(prop, exp.MaterializedProperty | exp.TemporaryProperty):  # MATERIALIZED VIEW, TEMPORARY
            continue
        key = property_key(prop)
        if key == "connector" and "path" in allowed:
            raise JobError(
                f"{where}: {_at(prop)}a source here is a Delta table: replace the connector and its options with "
                "path='<folder>' (or table='<catalog table>')"
            )
        if key not in allowed:
            raise JobError(f"{where}: {_at(prop)}unknown setting {key!r}; settings are {', '.join(allowed)}")
        settings[key] = setting_value(prop.args.get("value"), f"{where}: {key}")
    return settings


def property_key(prop: exp.Expr) -> str:
    """A WITH setting's name, bare (path=...) or quoted as Flink writes them ('table-name' = ...)."""
    key = prop.name or (prop.this.this if isinstance(prop.this, exp.Literal) else "")
    return str(key).lower()


def setting_value(node: exp.Expr | None, where: str) -> Any:
    if isinstance(node, exp.Boolean):
        return node.this
    if isinstance(node, exp.Literal):
        return node.this if node.is_string else float(node.this) if "." in node.this else int(node.this)
    if isinstance(node, exp.Array | exp.Tuple):
        return [setting_value(e, where) for e in node.expressions]
    if isinstance(node, exp.Interval):
        return _duration(node)
    if isinstance(node, exp.Column | exp.Var | exp.Identifier):  # a bare word: path=orders
        return node.name
    raise JobError(f"{where}: {_at(node)}write a string ('...'), a number, true/false, an INTERVAL or [a, b]")


def _duration(span: exp.Interval) -> str:
    """`INTERVAL '1' HOUR` or `10 SECONDS` as the duration text YAML takes."""
    number, unit = span.this, span.args.get("unit")
    value = number.this if isinstance(number, exp.Literal) else number.sql()
    return f"{value} {unit.name}" if unit is not None else str(value)  # INTERVAL '1 minute'


def created_name(create: exp.Create) -> str:
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


def _where_command_fails(command: exp.Command, text: str) -> str:
    """Where a statement sqlglot kept as raw text (a Command) goes wrong in the job file: the
    token its query (after `CREATE ... AS`) fails to parse at, `line L, column C (near 'x'): `;
    else the line the statement starts on."""
    word, rest = command.args.get("this"), command.args.get("expression")  # both raw text
    offset = text.find(f"{word}{rest}") if isinstance(word, str) and isinstance(rest, str) else -1
    if offset < 0:
        return ""
    statement = f"{word}{rest}"
    tokens, depth, query = StreamSQL().tokenize(statement), 0, None
    for n, token in enumerate(tokens):
        depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(token.token_type, 0)
        if token.token_type == TokenType.ALIAS and depth == 0 and n + 1 < len(tokens):
            query, first = token.end + 1, tokens[n + 1]
            if first.text.upper() not in ("SELECT", "WITH", "("):  # a misspelt SELECT
                return _place(text, offset + first.start, first.text)
            break
    if query is not None:
        try:
            sqlglot.parse(statement[query:], read=StreamSQL)
        except sqlglot.errors.ParseError as exc:
            error = exc.errors[0] if exc.errors else {}
            if error.get("line") and error.get("col"):
                lines = statement[query:].split("\n")
                ends = (
                    offset + query + sum(len(line) + 1 for line in lines[: error["line"] - 1]) + error["col"]
                )
                return _place(text, ends - len(error.get("highlight") or " "), error.get("highlight"))
    return f"line {text.count(chr(10), 0, offset) + 1}: "


def _place(text: str, offset: int, near: str | None) -> str:
    """`line L, column C (near 'x'): ` of the character at `offset` in the job file."""
    column = offset - text.rfind("\n", 0, offset)
    return (
        f"line {text.count(chr(10), 0, offset) + 1}, column {column}"
        + (f" (near {near!r})" if near else "")
        + ": "
    )


def statement_head(node: exp.Expr) -> str:
    """A statement or expression's text, cut to 60 characters, for messages."""
    text = node.sql()
    return text if len(text) <= 60 else text[:57] + "..."


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text
